// Package authority is where a fanout cluster keeps its committed offsets
// and the record of who leads it (--offset-store): ZooKeeper, or the
// consumer group fanout_<id> of Kafka's group coordinator. Each store is a
// Kind, looked up by its name in one place (Lookup), and opened in one
// place (Open) into an Authority: what the daemon and the tools (status,
// offsets) need of it, whichever it is. Where a store has something the
// other lacks, the Authority says so (Owners) rather than its callers asking which store it
// is; spread mode's partitions are kept by both, as ownership records in
// ZooKeeper and as the group's assignment in Kafka (Owners).
package authority

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// The names of the stores, the values of --offset-store.
const (
	ZooKeeper = "zookeeper"
	Kafka     = "kafka"
)

// Kind is one offset store: what it needs and has, known before anything
// is opened.
type Kind struct {
	Name  string // as --offset-store names it
	Title string // for messages: "ZooKeeper", "Kafka"
	// Where names the store for messages: "ZooKeeper", "Kafka (the group
	// fanout_<id>)".
	Where string
	// ZooKeeper is whether the store keeps its records in ZooKeeper: the
	// --zookeeper servers and their security apply to it alone.
	ZooKeeper bool
	// Owners is whether the store keeps who owns each partition
	// (Authority.Owners), which spread mode needs: ownership records in
	// ZooKeeper, the group's assignment in Kafka.
	Owners bool

	open  func(ctx context.Context, kind Kind, cfg Config) (Authority, error)
	label func(id string) string
}

// Label names the store of fanout instance id for a status line:
// "zookeeper", "kafka (group fanout_<id>)".
func (k Kind) Label(id string) string {
	if k.label == nil {
		return k.Name
	}
	return k.label(id)
}

// kinds are the stores, the default first.
var kinds = []Kind{
	{Name: ZooKeeper, Title: "ZooKeeper", Where: "ZooKeeper", ZooKeeper: true, Owners: true, open: openZooKeeper},
	{Name: Kafka, Title: "Kafka", Where: "Kafka (the group fanout_<id>)", Owners: true, open: openKafka,
		label: func(id string) string { return Kafka + " (group " + kafkastore.GroupName(id) + ")" }},
}

// Kinds lists the stores, the default first.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// Lookup returns the store named name ("" is the default, ZooKeeper). It
// is the one place a store is told by its name.
func Lookup(name string) (Kind, error) {
	if name == "" {
		return kinds[0], nil
	}
	for _, k := range kinds {
		if k.Name == name {
			return k, nil
		}
	}
	return Kind{}, fmt.Errorf("--offset-store %q: want %s", name, Names(func(Kind) bool { return true }, " or "))
}

// Names lists the names of the stores that keep, joined by sep.
func Names(keep func(Kind) bool, sep string) string {
	var names []string
	for _, k := range kinds {
		if keep(k) {
			names = append(names, k.Name)
		}
	}
	return strings.Join(names, sep)
}

// Config is what opening a store needs.
type Config struct {
	ID    string // the fanout instance (--id)
	Topic string // the topic consumed (--topic)

	// Client is a Kafka client, which the Kafka store's group uses; the
	// caller owns it.
	Client sarama.Client
	// KafkaSessionTimeout is the session timeout of the leader's membership
	// of the Kafka store's group; 0 is the coordinator's minimum.
	KafkaSessionTimeout time.Duration

	// ZooKeeper lists the ZooKeeper servers (host:port, the last may end in
	// /chroot) of the ZooKeeper store, and ZooKeeperSecurity its identity,
	// TLS and znode ACL.
	ZooKeeper         []string
	ZooKeeperSecurity zkstore.Security
	// ConnectZooKeeper opens the ZooKeeper store's session with servers
	// (the chroot cut off); the Authority closes it. Required by the
	// ZooKeeper store.
	ConnectZooKeeper func(ctx context.Context, servers []string) (*zk.Conn, error)
	// Logger, when set, is told at opening of the znodes someone other
	// than this identity may change (the daemon's); nil: nothing is
	// checked.
	Logger *logrus.Entry
}

// Open opens the store of kind with cfg. Close the Authority when done.
func Open(ctx context.Context, kind Kind, cfg Config) (Authority, error) {
	if kind.open == nil {
		return nil, errors.New("authority: the zero Kind: use Lookup")
	}
	return kind.open(ctx, kind, cfg)
}

// Authority is an opened offset store: the committed offsets and the
// record of who leads, as the daemon and the tools use them.
type Authority interface {
	// Kind is the store this is.
	Kind() Kind
	// Location is where in the store the offsets are: the offsets znode,
	// or the group.
	Location() string
	// Where names the store and the location for messages: "zookeeper
	// <znode>", "kafka group fanout_<id>".
	Where() string
	// Offsets is the store of the committed offsets (an
	// offsets.ProgressStore too: the progress above them).
	Offsets() offsets.Store
	// Fencer is the authority the election records the leader with, and
	// whose records fence a leader's commits.
	Fencer(log *logrus.Entry) cluster.Fencer
	// Leader reads the leader record as the tools show it; nil when nobody
	// leads (none recorded, or a record never won).
	Leader(ctx context.Context) (*status.Leader, error)
	// Owners returns where the store keeps spread mode's partitions, or
	// false when it keeps none.
	Owners() (Owners, bool)
	// Take takes the leader record over for an operator tool, as a winning
	// claim would, at the epoch after seen (the epoch the tool read, 0 for
	// none): its error wraps cluster.ErrRecordChanged when the record no
	// longer holds seen. Commit offsets under the Taken, then Release it.
	Take(ctx context.Context, seen uint64) (Taken, error)
	// IdleFence returns the fence of a commit made while no daemon runs
	// (fanout offsets copy), refused once a leader began; note says who
	// commits.
	IdleFence(ctx context.Context, note string) (offsets.Fence, error)
	// Close releases what Open opened.
	Close()
}

// Taken is the leader record taken by an operator tool (Authority.Take).
type Taken interface {
	// Epoch is the epoch the tool recorded.
	Epoch() uint64
	// Commit writes offs under the taken record in one atomic write; its
	// error wraps offsets.ErrFenced when a daemon took the record since.
	Commit(ctx context.Context, offs map[int32]int64) error
	// Release gives up what the take holds at the store, if anything, so
	// that the members elect the next leader at once.
	Release()
}

// Owners is where a store keeps spread mode's partitions: who holds each,
// how a member takes one and gives it back, and the condition that fences
// the partition's commits while it holds it. The ZooKeeper store keeps
// ownership records (a compare-and-set of a partition's record, whose
// version is the condition), following the assignment the elected leader
// publishes in its heartbeats. The Kafka store assigns the partitions
// itself: the members are the group fanout_<id>'s, its leader plans each
// generation (cluster.PlanGroup), its coordinator hands every member its
// partitions and fences its commits by generation (a kafkastore.Claim is
// the condition); no leader is elected.
type Owners interface {
	// Assigns reports whether the store assigns the partitions itself
	// (the Kafka group): then spread members elect no leader, and their
	// heartbeats only say who is alive.
	Assigns() bool
	// Member returns the claims of member m. elected is where its
	// assignment comes from when the store does not assign (the election:
	// the elected leader's heartbeats).
	Member(m Member, elected Assignments) Claims
	// Read returns who holds each partition and, when the store assigns,
	// its assignment.
	Read(ctx context.Context) (Holdings, error)
}

// Member is one spread member, as its claims need it.
type Member struct {
	Node   string // its node id
	Addr   string // its advertised client address
	Weight int    // its share (--weight)
	// Client is the member's own Kafka connection, for a store whose
	// membership requests wait on the whole group (the Kafka group's
	// JoinGroup); the caller owns it. Unused by ZooKeeper.
	Client sarama.Client
	// Heartbeat is how often the membership heartbeats (the Kafka group;
	// ZooKeeper's session keeps itself).
	Heartbeat time.Duration
	// Committed reports whether the group ever committed offsets, as far
	// as this member knows: a store that assigns decides with it where a
	// new line of assignments starts the partitions without an offset.
	Committed func() bool
	Logger    *logrus.Entry
}

// Holdings is what a store says of spread mode's partitions, for status:
// who holds each (status.Holder), and the store's assignment when it
// assigns (nil: the elected leader's, from its heartbeats).
type Holdings struct {
	Holders    map[int32]status.Holder
	Assignment *cluster.Assignment
}

// Assignments is where a spread member learns its partitions: the
// assignment in force (nil when none), and a signal when it may have
// changed (*cluster.Elector: the leader's heartbeats; the Kafka group: each
// generation's plan).
type Assignments interface {
	Assignment() *cluster.Assignment
	AssignmentChanged() <-chan struct{}
}

// Claims are one spread member's hold on its partitions: where its
// assignment comes from, how it joins the members, reserves a partition
// (once its previous owner released it), gives it back and learns that it
// lost it, the committed offset and progress of a partition it takes, and
// how it leaves. A reserve returns the condition that fences the
// partition's commits (an offsets.Condition of the store's kind).
type Claims interface {
	Assignments
	// Session identifies the member's current membership; 0 when it has
	// none. Every partition may be taken over once it changes.
	Session() int64
	// Join makes this member a member in the current session and returns
	// the session; waiting is told of another session holding this node's
	// membership, which Join waits for.
	Join(ctx context.Context, waiting func(session int64)) (int64, error)
	// Reserve makes this member the owner of partition p under assignment
	// generation gen once it is free (waiting is told of its holder), and
	// returns the condition of its commits.
	Reserve(ctx context.Context, p int32, gen uint64, waiting func(Holder)) (offsets.Condition, error)
	// Release gives partition p back, if cond still holds (else an error
	// wrapping ErrNotOwner).
	Release(p int32, cond offsets.Condition, gen uint64) error
	// Watch returns nil once cond no longer holds, or ctx's error.
	Watch(ctx context.Context, cond offsets.Condition) error
	// LoadPartition reads partition p's committed offset (false: none).
	LoadPartition(ctx context.Context, p int32) (int64, bool, error)
	// LoadPartitionProgress reads the progress stored above it.
	LoadPartitionProgress(ctx context.Context, p int32) (offsets.Progress, error)
	// Leave ends the membership after the member's last commits and
	// releases, so that the others take over at once: the Kafka group's
	// member leaves it; ZooKeeper's member znode goes with the session.
	Leave(ctx context.Context) error
}

// Holder is who holds a partition a member waits for.
type Holder struct {
	Node    string
	Session string
}

// ErrNotOwner is wrapped by Claims.Release when the partition is no
// longer the member's: another member took it over.
var ErrNotOwner = errors.New("authority: the partition is no longer this member's")
