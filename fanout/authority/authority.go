// Package authority is where a fanout cluster keeps its committed offsets
// and the record of who leads it (--offset-store): ZooKeeper, or the
// consumer group fanout_<id> of Kafka's group coordinator. Each store is a
// Kind, looked up by its name in one place (Lookup), and opened in one
// place (Open) into an Authority: what the daemon and the tools (status,
// offsets) need of it, whichever it is. Where a store has something the
// other lacks (the partitions' ownership records of spread mode), the
// Authority says so (Owners) rather than its callers asking which store it
// is.
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
	// Owners is whether the store keeps a record of each partition's owner
	// (Authority.Owners), which spread mode needs.
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
	{Name: Kafka, Title: "Kafka", Where: "Kafka (the group fanout_<id>)", open: openKafka,
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
	// Owners returns the partitions' ownership records of spread mode, or
	// false when the store keeps none.
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

// Owners is where a store keeps the partitions' ownership records of
// spread mode: which member owns each partition, reserved and released by
// compare-and-set, the record's version fencing the partition's commits.
type Owners interface {
	// Member returns the records as member node (advertised at addr)
	// reserves, releases and watches them.
	Member(node, addr string) *zkstore.Owners
	// PartitionOffsets reads one partition's committed offset and the
	// progress stored above it.
	PartitionOffsets() PartitionOffsets
	// Read returns every partition's ownership record.
	Read(ctx context.Context) (map[int32]zkstore.OwnerState, error)
}

// PartitionOffsets reads one partition's committed offset and the progress
// stored above it.
type PartitionOffsets interface {
	LoadPartition(ctx context.Context, p int32) (int64, bool, error)
	LoadPartitionProgress(ctx context.Context, p int32) (offsets.Progress, error)
}
