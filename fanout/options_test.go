package fanout

import (
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := Options{ID: "service_x", Topic: "user_need"}
	tests := []struct {
		name   string
		modify func(*Options)
		want   string // substring of the error; "" for valid
	}{
		{"defaults are valid", func(*Options) {}, ""},
		{"missing id", func(o *Options) { o.ID = "" }, "--id"},
		{"id with a slash", func(o *Options) { o.ID = "a/b" }, "--id"},
		{"missing topic", func(o *Options) { o.Topic = "" }, "--topic"},
		{"topic dot", func(o *Options) { o.Topic = "." }, "--topic"},
		{"kafka without port", func(o *Options) { o.Kafka = []string{"kafka"} }, "--kafka"},
		{"zookeeper chroot on the last server", func(o *Options) { o.ZooKeeper = []string{"zk1:2181", "zk2:2181/fanout"} }, ""},
		{"zookeeper chroot elsewhere", func(o *Options) { o.ZooKeeper = []string{"zk1:2181/x", "zk2:2181"} }, "--zookeeper"},
		{"the offsets tool's node id", func(o *Options) { o.NodeID = "fanout-offsets-tool" }, "--node-id"},
		{"node id not UTF-8", func(o *Options) { o.NodeID = "node-\xff" }, "--node-id"},
		{"advertise not UTF-8", func(o *Options) { o.Advertise = "h\xff:4987" }, "--advertise"},
		{"bad listen", func(o *Options) { o.Listen = "4987" }, "--listen"},
		{"bad advertise", func(o *Options) { o.Advertise = ":4987" }, "--advertise"},
		{"negative ack timeout", func(o *Options) { o.AckTimeout = -time.Second }, "--ack-timeout"},
		{"tiny ack timeout", func(o *Options) { o.AckTimeout = time.Millisecond }, "--ack-timeout"},
		{"leader timeout below two heartbeats", func(o *Options) {
			o.ClusterHeartbeat, o.LeaderTimeout = time.Second, 1500*time.Millisecond
		}, "--leader-timeout"},
		{"zookeeper session timeout below a second", func(o *Options) { o.ZooKeeperSessionTimeout = 500 * time.Millisecond }, "--zookeeper-session-timeout"},
		{"zookeeper session timeout below two commit intervals", func(o *Options) {
			o.ZooKeeperSessionTimeout, o.CommitInterval = 3*time.Second, 2*time.Second
		}, "--zookeeper-session-timeout"},
		{"zero liveness means default", func(o *Options) { o.Liveness = 0 }, ""},
		{"negative liveness", func(o *Options) { o.Liveness = -1 }, "--liveness"},
		{"negative in-flight", func(o *Options) { o.MaxInFlight = -5 }, "--max-in-flight"},
		{"tiny frame size", func(o *Options) { o.MaxFrameSize = 10 }, "--max-frame-size"},
		{"negative max clients", func(o *Options) { o.MaxClients = -1 }, "--max-clients"},
		{"negative max handshakes", func(o *Options) { o.MaxHandshakes = -1 }, "--max-handshakes"},
		{"tiny outbox", func(o *Options) { o.MaxOutboxBytes = 1000 }, "--max-outbox-bytes"},
		{"bad initial offset", func(o *Options) { o.InitialOffset = "latest" }, "--initial-offset"},
		{"oldest is fine", func(o *Options) { o.InitialOffset = "OLDEST" }, ""},
		{"zero max outstanding means default", func(o *Options) { o.MaxOutstanding = 0 }, ""},
		{"negative max outstanding", func(o *Options) { o.MaxOutstanding = -1 }, "--max-outstanding"},
		{"zero deliveries per turn means default", func(o *Options) { o.DeliveriesPerTurn = 0 }, ""},
		{"negative deliveries per turn", func(o *Options) { o.DeliveriesPerTurn = -2 }, "--deliveries-per-turn"},
		{"too many deliveries per turn", func(o *Options) { o.DeliveriesPerTurn = MaxDeliveriesPerTurn + 1 }, "--deliveries-per-turn"},
		{"bad isolation", func(o *Options) { o.Isolation = "serializable" }, "--isolation"},
		{"read_uncommitted is fine", func(o *Options) { o.Isolation = "READ_UNCOMMITTED" }, ""},
		{"kafka security is validated", func(o *Options) { o.KafkaSecurity.SASLMechanism = "NTLM" }, "--kafka-sasl-mechanism"},
		{"zookeeper security is validated", func(o *Options) { o.ZooKeeperSecurity.ReadACL = "auth" }, "--zookeeper-acl-read"},
		{"metrics token with a line break", func(o *Options) { o.MetricsToken = "tok\n" }, "white space"},
		{"max attempts with a dead-letter topic", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = 3, "dlq" }, ""},
		{"max attempts without a dead-letter topic", func(o *Options) { o.MaxAttempts = 3 }, "--dead-letter-topic"},
		{"dead-letter topic without max attempts", func(o *Options) { o.DeadLetterTopic = "dlq" }, "--max-attempts"},
		{"negative max attempts", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = -1, "dlq" }, "--max-attempts"},
		{"huge max attempts", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = MaxMaxAttempts+1, "dlq" }, "--max-attempts"},
		{"dead letters into the topic consumed", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = 3, o.Topic }, "would come back"},
		{"bad dead-letter topic name", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic = 3, "a/b" }, "--dead-letter-topic"},
		{"retry backoff", func(o *Options) { o.RetryBackoffMin, o.RetryBackoffMax = time.Second, time.Minute }, ""},
		{"retry backoff max below min", func(o *Options) { o.RetryBackoffMin, o.RetryBackoffMax = time.Minute, time.Second }, "MAX below MIN"},
		{"retry backoff max too long", func(o *Options) { o.RetryBackoffMin, o.RetryBackoffMax = time.Second, time.Hour }, "--retry-backoff"},
		{"retry backoff without min", func(o *Options) { o.RetryBackoffMax = time.Second }, "MIN"},
		{"retry backoff off", func(o *Options) { o.RetryBackoffMin = RetryBackoffOff }, ""},
		{"retry backoff off with a max", func(o *Options) { o.RetryBackoffMin, o.RetryBackoffMax = RetryBackoffOff, time.Second }, "--retry-backoff off"},
		{"create a dead-letter topic", func(o *Options) { o.MaxAttempts, o.DeadLetterTopic, o.CreateDeadLetterTopic = 3, "dlq", true }, ""},
		{"create no dead-letter topic", func(o *Options) { o.CreateDeadLetterTopic = true }, "--create-dead-letter-topic without --dead-letter-topic"},
		{"key ordering", func(o *Options) { o.Ordering = OrderingKey }, ""},
		{"bad ordering", func(o *Options) { o.Ordering = "fifo" }, "--ordering"},
		{"tiny observer bound", func(o *Options) { o.MaxObserverBytes = 100 }, "--max-observer-bytes"},
		{"short cluster secret", func(o *Options) { o.ClusterSecret = "short" }, "shorter than 16 bytes"},
		{"cluster secret", func(o *Options) { o.ClusterSecret = "0123456789abcdef" }, ""},
		{"TLS key without certificate", func(o *Options) { o.ClientTLS.Key = "key.pem" }, "--tls-cert, --tls-key"},
		{"client CA without certificate", func(o *Options) { o.ClientTLS.ClientCA = "ca.pem" }, "--tls-cert, --tls-key"},
		{"spread", func(o *Options) { o.Assignment = AssignmentSpread; o.Weight = 3 }, ""},
		{"unknown assignment", func(o *Options) { o.Assignment = "round-robin" }, "--assignment"},
		{"spread without zookeeper", func(o *Options) { o.Assignment, o.Store = AssignmentSpread, offsets.NewMemoryStore() }, "--assignment spread"},
		{"weight zero means default", func(o *Options) { o.Weight = 0 }, ""},
		{"negative weight", func(o *Options) { o.Weight = -1 }, "--weight"},
		{"huge weight", func(o *Options) { o.Weight = 5000 }, "--weight"},
		{"negative handoff timeout", func(o *Options) { o.HandoffTimeout = -time.Second }, "--handoff-timeout"},
		{"kafka offset store", func(o *Options) { o.OffsetStore = OffsetStoreKafka }, ""},
		{"spread with the kafka offset store", func(o *Options) { o.Assignment, o.OffsetStore = AssignmentSpread, OffsetStoreKafka }, ""},
		{"kafka offset store with the default read acl", func(o *Options) { o.OffsetStore, o.ZooKeeperSecurity.ReadACL = OffsetStoreKafka, "world" }, ""},
		{"kafka offset store with a zookeeper identity", func(o *Options) { o.OffsetStore, o.ZooKeeperSecurity.Auth = OffsetStoreKafka, "u:p" }, "not used with --offset-store kafka"},
		{"unknown offset store", func(o *Options) { o.OffsetStore = "etcd" }, "--offset-store"},
		{"kafka offset store with zookeeper servers", func(o *Options) {
			o.OffsetStore, o.ZooKeeper = OffsetStoreKafka, []string{"zk:2181"}
		}, "--zookeeper zk:2181: not used with --offset-store kafka"},
		{"kafka offset store with zookeeper security", func(o *Options) {
			o.OffsetStore, o.ZooKeeperSecurity.TLS = OffsetStoreKafka, true
		}, "not used with --offset-store kafka"},
		{"kafka session timeout below a second", func(o *Options) {
			o.OffsetStore, o.KafkaSessionTimeout = OffsetStoreKafka, 500*time.Millisecond
		}, "--kafka-session-timeout"},
		{"kafka session timeout below two commit intervals", func(o *Options) {
			o.OffsetStore, o.KafkaSessionTimeout, o.CommitInterval = OffsetStoreKafka, 3*time.Second, 2*time.Second
		}, "--kafka-session-timeout"},
		{"a long commit interval needs only the zookeeper session to be longer", func(o *Options) {
			o.CommitInterval, o.ZooKeeperSessionTimeout = time.Hour, 2*time.Hour
		}, ""},
		{"a long commit interval needs only the kafka session to be longer", func(o *Options) {
			o.OffsetStore, o.CommitInterval, o.KafkaSessionTimeout = OffsetStoreKafka, time.Hour, 2*time.Hour
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.modify(&o)
			err := o.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want an error about %s", err, tt.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	err := Options{}.Validate()
	if err == nil || !strings.Contains(err.Error(), "--id") || !strings.Contains(err.Error(), "--topic") {
		t.Fatalf("Validate() = %v, want both --id and --topic named", err)
	}
}

// The ZooKeeper default (localhost:2181) applies only to the ZooKeeper
// offset store: with Kafka's, no ZooKeeper is contacted.
func TestZooKeeperDefaultOnlyForItsStore(t *testing.T) {
	t.Parallel()
	if zk := (Options{}).withDefaults().ZooKeeper; len(zk) != 1 || zk[0] != "localhost:2181" {
		t.Errorf("default ZooKeeper %v, want localhost:2181", zk)
	}
	o := Options{OffsetStore: OffsetStoreKafka}.withDefaults()
	if len(o.ZooKeeper) != 0 || o.usesZooKeeper() {
		t.Errorf("with the Kafka offset store: ZooKeeper %v, uses it %v; want none", o.ZooKeeper, o.usesZooKeeper())
	}
	if o.storeSessionTimeout() != DefaultKafkaSession {
		t.Errorf("store session timeout %v, want the Kafka one (%v)", o.storeSessionTimeout(), DefaultKafkaSession)
	}
}

func TestNodeIDsDiffer(t *testing.T) {
	t.Parallel()
	a, b := Options{}.withDefaults(), Options{}.withDefaults()
	if a.NodeID == b.NodeID {
		t.Fatalf("two daemons got the same default node id %q", a.NodeID)
	}
}

// TestRetryBackoffDefault: options that leave the retry backoff unset get
// the default one (a redelivery after a failure waits), and the dispatcher
// is configured with it; RetryBackoffOff gives none.
func TestRetryBackoffDefault(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	if o.RetryBackoffMin != DefaultRetryBackoffMin || o.RetryBackoffMax != DefaultRetryBackoffMax {
		t.Errorf("default retry backoff %v,%v; want %v,%v", o.RetryBackoffMin, o.RetryBackoffMax, DefaultRetryBackoffMin, DefaultRetryBackoffMax)
	}
	if cfg := o.dispatchConfig(nil, nil, nil, nil); cfg.RetryBackoffMin != time.Second || cfg.RetryBackoffMax != time.Minute {
		t.Errorf("dispatcher's retry backoff %v,%v; want 1s,1m", cfg.RetryBackoffMin, cfg.RetryBackoffMax)
	}
	off := Options{RetryBackoffMin: RetryBackoffOff}.withDefaults()
	if cfg := off.dispatchConfig(nil, nil, nil, nil); cfg.RetryBackoffMin != 0 || cfg.RetryBackoffMax != 0 {
		t.Errorf("--retry-backoff off: dispatcher's retry backoff %v,%v; want none", cfg.RetryBackoffMin, cfg.RetryBackoffMax)
	}
}

func TestParseRetryBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		lo, hi time.Duration
		bad    bool
	}{
		{"", 0, 0, false}, {"off", RetryBackoffOff, 0, false}, {"1s,5m", time.Second, 5 * time.Minute, false},
		{DefaultRetryBackoff, DefaultRetryBackoffMin, DefaultRetryBackoffMax, false},
		{" 100ms , 2s ", 100 * time.Millisecond, 2 * time.Second, false}, {"1s", time.Second, time.Second, false},
		{"1s,", 0, 0, true}, {"x,1s", 0, 0, true}, {"1s,y", 0, 0, true},
	} {
		lo, hi, err := ParseRetryBackoff(tc.in)
		if (err != nil) != tc.bad || lo != tc.lo || hi != tc.hi {
			t.Errorf("ParseRetryBackoff(%q) = %v, %v, %v; want %v, %v, error %v", tc.in, lo, hi, err, tc.lo, tc.hi, tc.bad)
		}
	}
}
