package fanout

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// readyz returns the status and body of a daemon's /readyz.
func readyz(t *testing.T, d *Daemon) (int, string) {
	t.Helper()
	code, body, _ := testutil.HTTPGet(t, "http://"+d.MetricsAddr().String()+"/readyz", "")
	return code, strings.TrimSpace(body)
}

// kafkaTopics lists the topics of c.
func kafkaTopics(t *testing.T, c *kfake.Cluster) []string {
	t.Helper()
	kc, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("health-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	topics, err := kc.Topics()
	if err != nil {
		t.Fatal(err)
	}
	return topics
}

// A cluster member started on a topic that does not exist is not ready and
// says why, takes no part in the election (no heartbeat topic is created
// for it), and becomes ready by itself once the topic is created.
func TestDaemonNotReadyWhileTopicMissing(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	log := logrus.New()
	log.SetOutput(discard{})
	hook := &lineHook{}
	log.AddHook(hook)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", hook.all())
		}
	})
	d, _ := runDaemon(t, Options{
		ID: "svc", Topic: "jobs", Kafka: c.ListenAddrs(), OffsetStore: OffsetStoreKafka, NodeID: "n1",
		Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", InitialOffset: "oldest",
		ClusterHeartbeat: 100 * time.Millisecond, LeaderTimeout: 600 * time.Millisecond,
		ConnectBackoffMax: 200 * time.Millisecond, Logger: logrus.NewEntry(log),
	})
	<-d.Listening()

	var code int
	var body string
	testutil.WaitFor(t, 30*time.Second, "/readyz naming the missing topic", func() bool {
		code, body = readyz(t, d)
		return strings.Contains(body, "topic jobs not found")
	})
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d %q, want 503", code, body)
	}
	// Ten leader timeouts later: still not ready, never elected.
	time.Sleep(10 * 600 * time.Millisecond)
	if code, body = readyz(t, d); code != http.StatusServiceUnavailable || !strings.Contains(body, "topic jobs not found") {
		t.Fatalf("/readyz = %d %q, want 503 naming the missing topic", code, body)
	}
	if st := d.Status(context.Background()); st.Node.Ready || !strings.Contains(st.Node.Reason, "topic jobs not found") {
		t.Errorf("status document: ready %v, reason %q", st.Node.Ready, st.Node.Reason)
	}
	heartbeats := cluster.TopicName("svc", "jobs")
	if slices.Contains(kafkaTopics(t, c), heartbeats) {
		t.Fatalf("heartbeat topic %s created for a topic that does not exist", heartbeats)
	}

	admin, err := sarama.NewClusterAdmin(c.ListenAddrs(), kafka.NewConfig("health-test-admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic("jobs", &sarama.TopicDetail{NumPartitions: 2, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "/readyz 200 once the topic exists", func() bool {
		code, body = readyz(t, d)
		return code == http.StatusOK
	})
	if body != "leader: serving" {
		t.Errorf("/readyz = %q, want leader: serving", body)
	}
	if !slices.Contains(kafkaTopics(t, c), heartbeats) {
		t.Errorf("heartbeat topic %s not created once the topic exists", heartbeats)
	}
}

// A leader none of whose partitions can be consumed (every partition's
// offsets lookup fails, as with their leaders unavailable) is not ready and
// says so; it becomes ready once they can be.
func TestDaemonNotReadyWhileNoPartitionConsumed(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	var failing atomic.Bool
	failing.Store(true)
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lr := req.(*kmsg.ListOffsetsRequest)
		if !failing.Load() {
			return nil, nil, false
		}
		resp := lr.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = lr.Version
		for _, rt := range lr.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.LeaderNotAvailable.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	d, _, _ := soloDaemonOn(t, c, offsets.NewMemoryStore(), func(o *Options) { o.MetricsListen = "127.0.0.1:0" })

	var code int
	var body string
	testutil.WaitFor(t, 30*time.Second, "/readyz saying no partition is consumed", func() bool {
		code, body = readyz(t, d)
		return strings.Contains(body, "no partition")
	})
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "leader: ") {
		t.Fatalf("/readyz = %d %q, want 503 from the leader", code, body)
	}
	// Still so a while later: the source keeps retrying, nothing is consumed.
	time.Sleep(2 * time.Second)
	if code, body = readyz(t, d); code != http.StatusServiceUnavailable || !strings.Contains(body, "no partition") {
		t.Fatalf("/readyz = %d %q, want 503: no partition consumed", code, body)
	}
	failing.Store(false)
	testutil.WaitFor(t, 60*time.Second, "/readyz 200 once the partitions can be consumed", func() bool {
		code, body = readyz(t, d)
		return code == http.StatusOK
	})
	if body != "leader: serving" {
		t.Errorf("/readyz = %q, want leader: serving", body)
	}
}

// The topic watch, on a fake clock: a missing topic is reported at once and
// logged once a minute while it lasts, found closes Found; Kafka silent for
// up to KafkaGrace leaves the daemon ready, longer does not, and an answer
// makes it ready again.
func TestKafkaHealthWatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		log := logrus.New()
		log.SetOutput(discard{})
		hook := &lineHook{}
		log.AddHook(hook)
		var mu sync.Mutex
		next := fmt.Errorf("%w: %q", kafka.ErrTopicNotFound, "jobs")
		set := func(err error) {
			mu.Lock()
			defer mu.Unlock()
			next = err
		}
		h := newKafkaHealth()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go h.watch(ctx, logrus.NewEntry(log), 5*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			return next
		})
		ready := func() (bool, string) {
			s := metrics.Snapshot{Topic: "jobs", Serving: true, Clustered: true, Leader: true, LeaderKnown: true,
				HighWaterMarks: map[int32]int64{0: 1}, Partitions: 1}
			h.fill(&s)
			return metrics.Ready(s, time.Now(), 10*time.Second)
		}
		warnings := func() int { return strings.Count(hook.all(), "topic not found in Kafka") }

		synctest.Wait()
		if ok, why := ready(); ok || why != "leader: topic jobs not found in Kafka" {
			t.Fatalf("topic missing: Ready = %v %q", ok, why)
		}
		time.Sleep(2*time.Minute + time.Second) // 25 checks more
		synctest.Wait()
		if n := warnings(); n != 3 {
			t.Errorf("missing for 2 minutes, checked every 5 s: %d warnings, want 3 (at once, then once a minute):\n%s", n, hook.all())
		}
		select {
		case <-h.Found():
			t.Fatal("Found closed while the topic is missing")
		default:
		}

		set(nil)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-h.Found():
		default:
			t.Fatal("Found not closed once the topic exists")
		}
		if ok, why := ready(); !ok {
			t.Fatalf("topic found: Ready = %v %q", ok, why)
		}
		if !strings.Contains(hook.all(), "topic found") || strings.Contains(hook.all(), "Kafka answers again") {
			t.Errorf("the topic found is not logged:\n%s", hook.all())
		}

		// The last answer was just now; Kafka goes silent.
		set(errors.New("kafka: client has run out of available brokers to talk to"))
		var s metrics.Snapshot
		h.fill(&s)
		silent := s.KafkaAnswered // the last answer
		time.Sleep(time.Until(silent.Add(metrics.KafkaGrace)))
		synctest.Wait()
		if ok, why := ready(); !ok {
			t.Fatalf("Kafka silent for %v (the grace): Ready = %v %q", time.Since(silent), ok, why)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		ok, why := ready()
		if want := "leader: Kafka not answering for 35s (kafka: client has run out of available brokers to talk to)"; ok || why != want {
			t.Fatalf("Kafka silent for %v: Ready = %v %q, want false %q", time.Since(silent), ok, why, want)
		}
		if n := strings.Count(hook.all(), "no answer from Kafka"); n != 1 {
			t.Errorf("%d warnings of Kafka not answering in 35 s, want 1:\n%s", n, hook.all())
		}

		set(nil)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if ok, why := ready(); !ok || why != "leader: serving" {
			t.Fatalf("Kafka answers again: Ready = %v %q", ok, why)
		}
		if !strings.Contains(hook.all(), "Kafka answers again") {
			t.Errorf("Kafka answering again is not logged:\n%s", hook.all())
		}
		cancel()
	})
}
