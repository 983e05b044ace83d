// Package fanout is the daemon: it consumes every partition of one Kafka
// topic and hands each message to one of its TCP clients, keeping offsets in
// ZooKeeper or in Kafka (Options.OffsetStore). cmd/fanout maps command-line
// flags onto Options and calls Run.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// Options configures a daemon. Zero values take the defaults noted.
type Options struct {
	ID    string // service id; daemons with the same ID and Topic form one cluster; required
	Topic string // the Kafka topic to consume; required

	Kafka     []string // bootstrap brokers, host:port
	ZooKeeper []string // ZooKeeper servers, host:port; the last may end in /chroot; only with OffsetStoreZooKeeper

	// OffsetStore is where committed offsets and the leader record are
	// kept: OffsetStoreZooKeeper (the default) or OffsetStoreKafka (the
	// consumer group fanout_<ID> of Kafka's group coordinator; ZooKeeper is
	// then neither needed nor contacted, and ZooKeeper and
	// ZooKeeperSecurity must be unset).
	OffsetStore string

	// KafkaSecurity is the TLS and SASL of every Kafka connection: the
	// source, the election, and the produce and status commands (the
	// --kafka-tls* and --kafka-sasl-* flags). The zero value is plain text.
	KafkaSecurity kafka.Security
	// ZooKeeperSecurity is the digest identity, TLS and znode ACL of the
	// ZooKeeper sessions (--zookeeper-auth, --zookeeper-acl-read,
	// --zookeeper-tls*). The zero value is plain text and znodes anyone
	// may change.
	ZooKeeperSecurity zkstore.Security

	Listen    string // client listener address; default ":4987"
	Advertise string // the address clients are told (redirects); default derived from Listen
	NodeID    string // unique within the cluster; default hostname-<random>

	// MetricsListen is the address of /metrics, /healthz, /readyz and the
	// web console; "" disables them (the command line's default is
	// DefaultMetricsListen).
	MetricsListen string
	// MetricsToken, when set, is the bearer token /metrics and the console's
	// /api/status require; /healthz, /readyz and the console's page stay
	// open. A secret: never logged.
	MetricsToken string

	AckTimeout       time.Duration // redeliver without an ack after this; default 30s
	Heartbeat        time.Duration // ping interval; default 5s
	Liveness         int           // heartbeats of silence before a client is dropped; default 2
	WriteTimeout     time.Duration // a client that has not read a frame this long after it was queued is dropped; default 10s
	MaxOutboxBytes   int           // control frames (Pongs) queued for one client and not read; past it the client is dropped; default 256 KiB
	MaxInFlight      int           // cap on any client's unacked messages; default 1000
	MaxBuffered      int           // messages buffered before fetching pauses; default 10000
	MaxBufferedBytes int           // payload bytes buffered, and fetched bytes held by messages not done, before fetching pauses; default 64 MiB
	MaxOutstanding   int           // offsets held per partition behind an unacked one before fetching it pauses; default 50000
	MaxFrameSize     int           // largest frame accepted from clients; default 4 MiB
	MaxClients       int           // 0 = unlimited
	MaxHandshakes    int           // connections waiting for their Hello; beyond it the oldest is closed; default 1024
	AuthToken        string        // when set, clients must present it in Hello (or a named token)
	// AuthTokensFile names a file of "name:token" lines: a client presenting
	// one of the tokens is let in and named by it in the logs
	// (--auth-tokens-file). Re-read when it changes. With AuthToken, either
	// passes.
	AuthTokensFile string

	// ClientTLS makes the client listener speak TLS (--tls-cert,
	// --tls-key; TLS 1.2 minimum) and, with ClientCA, require client
	// certificates that CA signs (--tls-client-ca: mutual TLS, the
	// certificate's subject names the client in logs). The files are
	// re-read when they change and on Daemon.ReloadTLS (SIGHUP).
	ClientTLS tlsconf.ServerFiles

	// DeliveryLog, when set, names a file the daemon appends its delivery
	// log to (--delivery-log; package deliverylog): a line per delivery
	// attempt, per outcome of one, and per change of what it serves.
	DeliveryLog string

	InitialOffset  string        // "newest" or "oldest": where partitions start in a group that never committed; default newest
	CommitInterval time.Duration // default 1s
	DrainTimeout   time.Duration // shutdown waits this long for outstanding acks; default 10s

	// Isolation is "read_committed" (records of aborted transactions are
	// never delivered, those of open ones once they commit) or
	// "read_uncommitted"; default read_committed.
	Isolation string

	// ZooKeeperSessionTimeout is the ZooKeeper session timeout asked for;
	// default 10s. It also bounds how long a leader's offset commits may
	// keep failing before it steps down (ZooKeeper out of reach for this
	// node alone: its heartbeats still flow, so only it can end its term).
	ZooKeeperSessionTimeout time.Duration
	// KafkaSessionTimeout is the session timeout of the memberships of
	// the group fanout_<ID> (OffsetStoreKafka): the leader's, or in spread
	// mode every member's; default 10s. Like ZooKeeperSessionTimeout it
	// bounds how long offset commits may keep failing before the leader
	// steps down (or a spread member drops its partitions).
	KafkaSessionTimeout time.Duration

	// ClusterHeartbeat is how often this daemon publishes its heartbeat on
	// fanout_<id>_<topic>; default 1s. LeaderTimeout is the silence after
	// which the leader is considered dead; default 3 × ClusterHeartbeat.
	ClusterHeartbeat time.Duration
	LeaderTimeout    time.Duration

	// Assignment is how the members of a cluster share the topic: "leader"
	// (the default: the elected leader consumes and delivers every
	// partition, the others redirect its clients) or "spread" (the leader
	// assigns the partitions to the live members, each serves its own).
	// Every member of a cluster must run the same. Spread needs an offset
	// store that keeps the partitions' owners (ZooKeeper, or Kafka's
	// group; not offsets in memory).
	Assignment string
	// Weight is this member's capacity in spread mode: its share of the
	// partitions is proportional to it; default 1.
	Weight int
	// HandoffTimeout is, in spread mode, how long a partition that moves
	// away from this member (or every partition of a member that stops)
	// waits for its in-flight messages to be acked before it is committed
	// and released; default 10s.
	HandoffTimeout time.Duration

	// ConnectBackoffMax bounds the wait between attempts to reach Kafka,
	// ZooKeeper or a missing topic; default 30s.
	ConnectBackoffMax time.Duration

	// Delivery policies (docs/delivery.md). The zero values
	// change nothing.

	// MaxAttempts is how many failed deliveries (ack timeout, nack, client
	// gone) a message gets before it is produced to DeadLetterTopic instead
	// of being delivered again; 0 = unlimited, the default.
	MaxAttempts int
	// DeadLetterTopic takes the messages that failed MaxAttempts times;
	// required with MaxAttempts, and it must exist (or see
	// CreateDeadLetterTopic).
	DeadLetterTopic string
	// CreateDeadLetterTopic creates DeadLetterTopic at start when it does
	// not exist: with as many partitions as Topic (dead letters spread as
	// the records they come from, and can be worked with the same
	// parallelism) and the cluster's default replication factor and
	// retention (what its operator chose for data topics).
	CreateDeadLetterTopic bool
	// RetryBackoffMin and RetryBackoffMax delay a redelivery after a
	// failure without a delay of its own (an ack timeout, a nack without a
	// delay, a client gone) by Min·2^(failures−1) capped at Max, with
	// jitter (--retry-backoff MIN,MAX). Both zero: the default,
	// DefaultRetryBackoffMin to DefaultRetryBackoffMax. Min negative
	// (RetryBackoffOff): no backoff, a failed delivery goes again at once.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// Ordering is "none" (the default) or "key": a key's messages go out one
	// at a time, in offset order.
	Ordering string
	// DeliveriesPerTurn is how many messages, at most, a client takes in its
	// round-robin turn (up to its credit); default 1. More carries several
	// messages in one frame and one ack when clients outnumber the
	// messages at hand (many fast workers), at the cost of a coarser
	// balance.
	DeliveriesPerTurn int
	// MaxObserverBytes bounds the copies queued for one observer and not yet
	// written; past it the observer is dropped; default 16 MiB.
	MaxObserverBytes int
	// ClusterSecret, when set, authenticates the heartbeat log: every
	// heartbeat carries a MAC made with it, and records without a valid one
	// are ignored and counted. Every member needs the same one; at least 16
	// bytes. A secret: never logged (FANOUT_CLUSTER_SECRET or
	// --cluster-secret-file).
	ClusterSecret string

	// Store, when set, replaces the offset store with an in-memory one
	// (tests). Neither ZooKeeper nor the election is then used, and
	// OffsetStore is ignored: the daemon leads alone, in a term of the
	// store of its own (MemoryStore.NewTerm) that fences earlier ones.
	Store *offsets.MemoryStore

	Logger *logrus.Entry // default: the standard logger
}

// Offset stores, the values of Options.OffsetStore (--offset-store): the
// names of authority's kinds.
const (
	OffsetStoreZooKeeper = authority.ZooKeeper
	OffsetStoreKafka     = authority.Kafka
)

// Defaults of Options: the one table of the daemon's defaults. Those of a
// package's Config are that package's, named here: the package applies the
// same to a zero field.
const (
	DefaultListen           = ":4987"
	DefaultMetricsListen    = ":9100" // the --metrics-listen flag's default
	DefaultAckTimeout       = dispatch.DefaultAckTimeout
	DefaultHeartbeat        = server.DefaultHeartbeat
	DefaultLiveness         = server.DefaultLiveness
	DefaultWriteTimeout     = server.DefaultWriteTimeout
	DefaultMaxInFlight      = 1000
	DefaultMaxBuffered      = dispatch.DefaultMaxBuffered
	DefaultMaxBufferedBytes = dispatch.DefaultMaxBufferedBytes
	DefaultMaxHandshakes    = server.DefaultMaxHandshakes
	DefaultMaxOutboxBytes   = server.DefaultMaxOutboxBytes
	DefaultInitialOffset    = "newest"
	DefaultIsolation        = "read_committed"
	DefaultMaxOutstanding   = dispatch.DefaultMaxOutstanding
	DefaultCommitInterval   = dispatch.DefaultCommitInterval
	DefaultDrainTimeout     = dispatch.DefaultDrainTimeout
	DefaultConnectBackoff   = 30 * time.Second
	DefaultClusterHeartbeat = cluster.DefaultHeartbeat
	DefaultZKSessionTimeout = 10 * time.Second
	DefaultOrdering         = OrderingNone
	// DefaultDeliveriesPerTurn: one message per client in turn.
	DefaultDeliveriesPerTurn = 1
	// MaxDeliveriesPerTurn bounds --deliveries-per-turn (a client's credit
	// bounds it too).
	MaxDeliveriesPerTurn    = 1000
	DefaultMaxObserverBytes = server.DefaultMaxObserverBytes
	DefaultKafkaSession     = 10 * time.Second // the default of KafkaSessionTimeout
	DefaultAssignment       = AssignmentLeader
	DefaultHandoffTimeout   = 10 * time.Second
	// DefaultRetryBackoffMin and DefaultRetryBackoffMax are the default
	// --retry-backoff: a record that keeps failing is delivered again
	// after about 1s, 2s, 4s, ... then once a minute, never in a loop as
	// fast as clients can nack. See ParseRetryBackoff for why these.
	DefaultRetryBackoffMin = time.Second
	DefaultRetryBackoffMax = time.Minute
)

// DefaultRetryBackoff is the --retry-backoff flag's default, the text of
// DefaultRetryBackoffMin and DefaultRetryBackoffMax.
const DefaultRetryBackoff = "1s,1m"

// RetryBackoffOff as Options.RetryBackoffMin turns the retry backoff off
// (--retry-backoff off): a failed delivery goes again at once.
const RetryBackoffOff time.Duration = -1

// The values of Options.Assignment (--assignment).
const (
	AssignmentLeader = "leader"
	AssignmentSpread = "spread"
)

// minClusterSecret is the shortest --cluster-secret accepted, in bytes.
const minClusterSecret = 16

// Orderings (Options.Ordering).
const (
	OrderingNone = "none" // messages go out in parallel, in any order
	OrderingKey  = "key"  // a key's messages go out one at a time, in offset order
)

// MaxMaxAttempts bounds --max-attempts.
const MaxMaxAttempts = 10000

// ParseRetryBackoff parses --retry-backoff: "MIN,MAX" as Go durations (e.g.
// "1s,5m"), "MIN" alone (MAX = MIN), "off" (RetryBackoffOff: no backoff),
// or "" (zero: the default).
//
// Why the default starts at 1s and stops at 1m: without a backoff a record
// that every client nacks at once (a poison record, a handler that fails
// on a dependency that is down) went round as fast as the clients could
// take it, tens of thousands of deliveries a second. NSQ's Go client
// requeues a failed message after 90s × its attempts, at most 15m, and
// backs the whole consumer off up to 2m; Kafka's share groups redeliver at
// once and give up after 5 deliveries. Starting at 1s keeps a transient
// failure (a restart, a lock) about as quick to retry as before; doubling
// makes a record that keeps failing cost a handful of deliveries a minute
// at first and one a minute after 7 failures; stopping at 1m rather than
// NSQ's 15m means a record comes back within a minute of its cause being
// fixed, since without --max-attempts it is never given up.
func ParseRetryBackoff(s string) (lo, hi time.Duration, err error) {
	s = strings.TrimSpace(s)
	switch s {
	case "":
		return 0, 0, nil
	case "off":
		return RetryBackoffOff, 0, nil
	}
	a, b, pair := strings.Cut(s, ",")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, fmt.Errorf("--retry-backoff %q: MIN: %w", s, err)
	}
	hi = lo
	if pair {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil {
			return 0, 0, fmt.Errorf("--retry-backoff %q: MAX: %w", s, err)
		}
	}
	return lo, hi, nil
}

// topicName is what Kafka accepts as a topic name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// idName is what fanout accepts as a service id: it becomes part of a topic
// name and of znode paths.
var idName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,100}$`)

// withDefaults returns o with every zero value replaced by its default.
func (o Options) withDefaults() Options {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	seti := func(i *int, v int) {
		if *i == 0 {
			*i = v
		}
	}
	if len(o.Kafka) == 0 {
		o.Kafka = []string{"localhost:9092"}
	}
	if o.OffsetStore == "" {
		o.OffsetStore = o.storeKind().Name
	}
	if len(o.ZooKeeper) == 0 && o.usesZooKeeper() {
		o.ZooKeeper = []string{"localhost:2181"}
	}
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.NodeID == "" {
		host, _ := os.Hostname()
		o.NodeID = fmt.Sprintf("%s-%08x", host, rand.Uint32())
	}
	set(&o.AckTimeout, DefaultAckTimeout)
	set(&o.Heartbeat, DefaultHeartbeat)
	seti(&o.Liveness, DefaultLiveness)
	set(&o.WriteTimeout, DefaultWriteTimeout)
	seti(&o.MaxInFlight, DefaultMaxInFlight)
	seti(&o.MaxBuffered, DefaultMaxBuffered)
	seti(&o.MaxBufferedBytes, DefaultMaxBufferedBytes)
	seti(&o.MaxOutstanding, DefaultMaxOutstanding)
	seti(&o.MaxFrameSize, protocol.DefaultMaxFrameSize)
	seti(&o.MaxHandshakes, DefaultMaxHandshakes)
	seti(&o.MaxOutboxBytes, DefaultMaxOutboxBytes)
	seti(&o.MaxObserverBytes, DefaultMaxObserverBytes)
	seti(&o.DeliveriesPerTurn, DefaultDeliveriesPerTurn)
	if o.RetryBackoffMin == 0 && o.RetryBackoffMax == 0 {
		o.RetryBackoffMin, o.RetryBackoffMax = DefaultRetryBackoffMin, DefaultRetryBackoffMax
	}
	if o.Ordering == "" {
		o.Ordering = DefaultOrdering
	}
	if o.InitialOffset == "" {
		o.InitialOffset = DefaultInitialOffset
	}
	if o.Isolation == "" {
		o.Isolation = DefaultIsolation
	}
	set(&o.CommitInterval, DefaultCommitInterval)
	set(&o.DrainTimeout, DefaultDrainTimeout)
	set(&o.ZooKeeperSessionTimeout, DefaultZKSessionTimeout)
	set(&o.KafkaSessionTimeout, DefaultKafkaSession)
	set(&o.ConnectBackoffMax, DefaultConnectBackoff)
	set(&o.ClusterHeartbeat, DefaultClusterHeartbeat)
	set(&o.LeaderTimeout, 3*o.ClusterHeartbeat)
	if o.Assignment == "" {
		o.Assignment = DefaultAssignment
	}
	seti(&o.Weight, 1)
	set(&o.HandoffTimeout, DefaultHandoffTimeout)
	if o.Logger == nil {
		o.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return o
}

// Validate reports every problem with o (after defaults) in one error.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case o.ID == "":
		bad("--id is required: the service id that daemons of one cluster share")
	case !idName.MatchString(o.ID):
		bad("--id %q: use 1-100 of a-z, A-Z, 0-9, '.', '_' and '-' (it becomes part of topic and znode names)", o.ID)
	}
	switch {
	case o.Topic == "":
		bad("--topic is required: the Kafka topic to consume")
	case !topicName.MatchString(o.Topic) || o.Topic == "." || o.Topic == "..":
		bad("--topic %q: not a Kafka topic name (1-249 of a-z, A-Z, 0-9, '.', '_' and '-'; not . or ..)", o.Topic)
	}
	for _, a := range o.Kafka {
		if err := checkHostPort(a); err != nil {
			bad("--kafka %q: %v", a, err)
		}
	}
	for i, a := range o.ZooKeeper {
		if i == len(o.ZooKeeper)-1 {
			if j := strings.IndexByte(a, '/'); j >= 0 {
				a = a[:j]
			}
		}
		if err := checkHostPort(a); err != nil {
			bad("--zookeeper %q: %v", a, err)
		}
	}
	if o.NodeID == cluster.ToolNode {
		bad("--node-id %q is reserved: fanout offsets reset records it in the leader record it takes", o.NodeID)
	}
	// Both go into JSON (the Kafka group's member metadata and plans, the
	// status), which would turn invalid bytes into others: a member would
	// not find itself in its own group's plan, a client would get an
	// address that is none.
	if !utf8.ValidString(o.NodeID) {
		bad("--node-id %q is not valid UTF-8", o.NodeID)
	}
	if !utf8.ValidString(o.Advertise) {
		bad("--advertise %q is not valid UTF-8", o.Advertise)
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		bad("--listen %q: %v", o.Listen, err)
	}
	if o.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(o.MetricsListen); err != nil {
			bad("--metrics-listen %q: %v", o.MetricsListen, err)
		}
	}
	if o.Advertise != "" {
		if err := checkHostPort(o.Advertise); err != nil {
			bad("--advertise %q: %v", o.Advertise, err)
		}
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{
		{"--ack-timeout", o.AckTimeout}, {"--heartbeat", o.Heartbeat}, {"--write-timeout", o.WriteTimeout},
		{"--commit-interval", o.CommitInterval}, {"--drain-timeout", o.DrainTimeout},
		{"--cluster-heartbeat", o.ClusterHeartbeat}, {"--leader-timeout", o.LeaderTimeout},
		{"--zookeeper-session-timeout", o.ZooKeeperSessionTimeout}, {"--kafka-session-timeout", o.KafkaSessionTimeout},
		{"--handoff-timeout", o.HandoffTimeout},
	} {
		if d.value < 0 {
			bad("%s %s: must be positive", d.flag, d.value)
		}
	}
	if o.AckTimeout > 0 && o.AckTimeout < 10*time.Millisecond {
		bad("--ack-timeout %s: at least 10ms", o.AckTimeout)
	}
	if o.ClusterHeartbeat > 0 && o.LeaderTimeout < 2*o.ClusterHeartbeat {
		bad("--leader-timeout %s: at least twice --cluster-heartbeat (%s)", o.LeaderTimeout, o.ClusterHeartbeat)
	}
	// The session timeout of the store in use bounds failing commits
	// (storeSessionTimeout): it alone is checked against the commit interval.
	if flag, timeout := o.storeSession(); timeout > 0 && (timeout < time.Second || timeout < 2*o.CommitInterval) {
		bad("%s %s: at least 1s and twice --commit-interval (%s), so that a leader gets two commit attempts before it steps down",
			flag, timeout, o.CommitInterval)
	}
	store, err := authority.Lookup(o.OffsetStore)
	if err != nil {
		errs = append(errs, err)
	} else if !store.ZooKeeper {
		if len(o.ZooKeeper) > 0 {
			bad("--zookeeper %s: not used with --offset-store %s (offsets and the leader record are kept in %s): remove it",
				strings.Join(o.ZooKeeper, ","), store.Name, store.Where)
		}
		if zs := o.ZooKeeperSecurity; zs.Auth != "" || zs.TLSEnabled() || (zs.ReadACL != "" && zs.ReadACL != zkstore.ReadWorld) {
			bad("--zookeeper-auth, --zookeeper-acl-read and --zookeeper-tls*: not used with --offset-store %s: remove them", store.Name)
		}
	}
	if a, err := assignmentOf(o.Assignment); err != nil {
		errs = append(errs, err)
	} else if a.owners {
		owners := authority.Names(func(k authority.Kind) bool { return k.Owners }, " or ")
		switch {
		case o.Store != nil:
			bad("--assignment %s: needs --offset-store %s (the ownership of each partition is recorded there), not offsets in memory",
				a.name, owners)
		case store.Name != "" && !store.Owners:
			bad("--assignment %s: needs --offset-store %s: %s keeps no record of each partition's owner, "+
				"so it cannot fence each partition on its own", a.name, owners, store.Where)
		}
	}
	if o.Weight < 1 || o.Weight > 1000 {
		bad("--weight %d: between 1 and 1000", o.Weight)
	}
	if o.Liveness < 1 {
		bad("--liveness %d: at least 1", o.Liveness)
	}
	if o.MaxInFlight < 1 {
		bad("--max-in-flight %d: at least 1", o.MaxInFlight)
	}
	if o.MaxBuffered < 1 {
		bad("--max-buffered %d: at least 1", o.MaxBuffered)
	}
	if o.MaxBufferedBytes < 1 {
		bad("--max-buffered-bytes %d: at least 1", o.MaxBufferedBytes)
	}
	if o.MaxOutstanding < 1 {
		bad("--max-outstanding %d: at least 1", o.MaxOutstanding)
	}
	if o.DeliveriesPerTurn < 1 || o.DeliveriesPerTurn > MaxDeliveriesPerTurn {
		bad("--deliveries-per-turn %d: between 1 and %d", o.DeliveriesPerTurn, MaxDeliveriesPerTurn)
	}
	if o.MaxFrameSize < 1024 || o.MaxFrameSize > 1<<30 {
		bad("--max-frame-size %d: between 1 KiB and 1 GiB", o.MaxFrameSize)
	}
	if o.MaxClients < 0 {
		bad("--max-clients %d: must not be negative", o.MaxClients)
	}
	if o.MaxOutboxBytes < 16<<10 {
		bad("--max-outbox-bytes %d: at least 16 KiB", o.MaxOutboxBytes)
	}
	if o.MaxHandshakes < 1 {
		bad("--max-handshakes %d: at least 1", o.MaxHandshakes)
	}
	if s := strings.ToLower(o.InitialOffset); s != "newest" && s != "oldest" {
		bad("--initial-offset %q: want newest or oldest", o.InitialOffset)
	}
	if _, err := kafka.ParseIsolation(o.Isolation); err != nil {
		bad("--isolation: %v", err)
	}
	switch {
	case o.MaxAttempts < 0 || o.MaxAttempts > MaxMaxAttempts:
		bad("--max-attempts %d: between 0 (unlimited) and %d", o.MaxAttempts, MaxMaxAttempts)
	case o.MaxAttempts > 0 && o.DeadLetterTopic == "":
		bad("--max-attempts %d needs --dead-letter-topic: the topic that takes the messages that failed that often", o.MaxAttempts)
	case o.MaxAttempts == 0 && o.DeadLetterTopic != "":
		bad("--dead-letter-topic %q without --max-attempts: no message would ever go there", o.DeadLetterTopic)
	case o.CreateDeadLetterTopic && o.DeadLetterTopic == "":
		bad("--create-dead-letter-topic without --dead-letter-topic: name the topic to create")
	}
	if o.DeadLetterTopic != "" {
		switch {
		case !topicName.MatchString(o.DeadLetterTopic) || o.DeadLetterTopic == "." || o.DeadLetterTopic == "..":
			bad("--dead-letter-topic %q: not a Kafka topic name", o.DeadLetterTopic)
		case o.DeadLetterTopic == o.Topic:
			bad("--dead-letter-topic %q is the topic consumed: its dead letters would come back", o.DeadLetterTopic)
		}
	}
	switch {
	case o.RetryBackoffMin < 0 && o.RetryBackoffMax != 0:
		bad("--retry-backoff off: no MAX without a MIN")
	case o.RetryBackoffMax < 0:
		bad("--retry-backoff %v,%v: must not be negative", o.RetryBackoffMin, o.RetryBackoffMax)
	case o.RetryBackoffMin > 0 && o.RetryBackoffMax < o.RetryBackoffMin:
		bad("--retry-backoff %v,%v: MAX below MIN", o.RetryBackoffMin, o.RetryBackoffMax)
	case o.RetryBackoffMin == 0 && o.RetryBackoffMax > 0:
		bad("--retry-backoff 0,%v: MIN must be above 0", o.RetryBackoffMax)
	case o.RetryBackoffMax > protocol.MaxNackDelay:
		bad("--retry-backoff %v,%v: MAX at most %v", o.RetryBackoffMin, o.RetryBackoffMax, protocol.MaxNackDelay)
	}
	if o.Ordering != OrderingNone && o.Ordering != OrderingKey {
		bad("--ordering %q: want %s or %s", o.Ordering, OrderingNone, OrderingKey)
	}
	if o.MaxObserverBytes < 16<<10 {
		bad("--max-observer-bytes %d: at least 16 KiB", o.MaxObserverBytes)
	}
	if err := o.KafkaSecurity.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.ZooKeeperSecurity.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.ClusterSecret != "" && len(o.ClusterSecret) < minClusterSecret {
		bad("the cluster secret (FANOUT_CLUSTER_SECRET or --cluster-secret-file) is shorter than %d bytes: use a random one (openssl rand -hex 32)", minClusterSecret)
	}
	if err := o.ClientTLS.Validate(); err != nil {
		bad("--tls-cert, --tls-key, --tls-client-ca: %v", err)
	}
	if o.MetricsToken != "" && strings.TrimSpace(o.MetricsToken) != o.MetricsToken {
		bad("the metrics token (FANOUT_METRICS_TOKEN or --metrics-token-file) starts or ends with white space")
	}
	return errors.Join(errs...)
}

// securityWarnings lists what is legal but unsafe in o, logged once at
// start.
func (o Options) securityWarnings() []string {
	w := o.KafkaSecurity.Warnings()
	if o.usesZooKeeper() {
		w = append(w, o.ZooKeeperSecurity.Warnings()...)
	}
	return w
}

// storeKind is the offset store OffsetStore names; the default when the
// name is unknown (Validate refuses it).
func (o Options) storeKind() authority.Kind {
	k, err := authority.Lookup(o.OffsetStore)
	if err != nil {
		k, _ = authority.Lookup("")
	}
	return k
}

// usesZooKeeper reports whether the daemon keeps its offsets in ZooKeeper.
func (o Options) usesZooKeeper() bool { return o.Store == nil && o.storeKind().ZooKeeper }

// storeSession is the flag and the value of the session timeout of the
// offset store in use.
func (o Options) storeSession() (flag string, timeout time.Duration) {
	if o.storeKind().ZooKeeper {
		return "--zookeeper-session-timeout", o.ZooKeeperSessionTimeout
	}
	return "--kafka-session-timeout", o.KafkaSessionTimeout
}

// storeSessionTimeout is the session timeout of the offset store in use: a
// leader whose commits have failed this long steps down.
func (o Options) storeSessionTimeout() time.Duration {
	_, timeout := o.storeSession()
	return timeout
}

// connectsTo names the services the daemon connects to, for its first log
// line.
func (o Options) connectsTo() string {
	switch {
	case o.Store != nil:
		return "Kafka (offsets in memory, no ZooKeeper)"
	case !o.usesZooKeeper():
		return "Kafka (offsets in Kafka, no ZooKeeper)"
	}
	return "Kafka and ZooKeeper"
}

// dispatchConfig is the dispatcher's configuration derived from the
// options, for a dispatcher of scope committing to store, logging to log.
func (o Options) dispatchConfig(scope dispatch.Scope, store offsets.Store, log *logrus.Entry,
	onCommit func(time.Duration, error)) dispatch.Config {
	return dispatch.Config{
		AckTimeout:       o.AckTimeout,
		MaxBuffered:      o.MaxBuffered,
		MaxBufferedBytes: o.MaxBufferedBytes,
		MaxOutstanding:   o.MaxOutstanding,
		CommitInterval:   o.CommitInterval,
		DrainTimeout:     o.DrainTimeout,
		MaxCommitFailure: o.storeSessionTimeout(),
		Scope:            scope,
		Store:            store,
		Logger:           log,
		OnCommit:         onCommit,
		FrameSize:        server.DeliverFrameSize,
		MaxAttempts:      o.MaxAttempts,
		RetryBackoffMin:  max(0, o.RetryBackoffMin), // RetryBackoffOff: 0, none
		RetryBackoffMax:  max(0, o.RetryBackoffMax),
		DisconnectWindow: time.Duration(o.Liveness) * o.Heartbeat,
		KeyOrdering:      o.Ordering == OrderingKey,
		Turn:             o.DeliveriesPerTurn,
	}
}

// maxFetchBytes bounds a fetch response of the source: a quarter of
// --max-buffered-bytes, so that the responses the messages held alias,
// which count against it, come in several parts of it.
func (o Options) maxFetchBytes() int32 {
	return int32(min(o.MaxBufferedBytes/4, math.MaxInt32))
}

// authorityConfig is the configuration of the offset store derived from
// the options, with client as the Kafka client; the ZooKeeper session is
// opened once, quietly (a tool's: the daemon retries with its own).
func (o Options) authorityConfig(client sarama.Client) authority.Config {
	return authority.Config{
		ID: o.ID, Topic: o.Topic, Client: client, KafkaSessionTimeout: o.KafkaSessionTimeout,
		ZooKeeper: o.ZooKeeper, ZooKeeperSecurity: o.ZooKeeperSecurity,
		ConnectZooKeeper: func(ctx context.Context, servers []string) (*zk.Conn, error) {
			quiet := logrus.New()
			quiet.SetOutput(io.Discard)
			return o.ZooKeeperSecurity.Connect(ctx, servers, toolZooKeeperSession, logrus.NewEntry(quiet))
		},
	}
}

// toolZooKeeperSession is the session timeout of a tool's ZooKeeper
// session.
const toolZooKeeperSession = 10 * time.Second

// OpenAuthority opens the offset store of the cluster opts names, as the
// tools (status, offsets) read and write it: client is their Kafka client,
// the ZooKeeper session is opened once, quietly. Close it when done.
func OpenAuthority(ctx context.Context, opts Options, client sarama.Client) (authority.Authority, error) {
	return authority.Open(ctx, opts.storeKind(), opts.authorityConfig(client))
}

// advertised returns the address clients are told to connect to.
func (o Options) advertised(listen net.Addr) string {
	if o.Advertise != "" {
		return o.Advertise
	}
	host, port, err := net.SplitHostPort(listen.String())
	if err != nil {
		return listen.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("missing host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}
