//go:build integration

package integration

// Delivery policies against the real Kafka and ZooKeeper: a
// poison message dead-lettered after --max-attempts with its attempts
// counted across a leader's kill -9, a dead-letter topic the broker refuses
// holding the offset until it takes the record, and the acked ranges that
// spare most duplicates after a kill -9. Helpers here are prefixed pol.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// polProgress reads the progress stored with the offsets of service id and
// topic, from ZooKeeper or (kafkaStore) from the group's commit metadata.
func polProgress(t testing.TB, kafkaStore bool, id, topic string) map[int32]offsets.Progress {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var store offsets.ProgressStore
	if kafkaStore {
		store = ksStore(t, id, topic)
	} else {
		conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
		if err != nil {
			t.Fatalf("zookeeper: %v", err)
		}
		defer conn.Close()
		store = zkstore.New(conn, "", id, topic)
	}
	pr, err := store.LoadProgress(ctx)
	if err != nil {
		t.Fatalf("load progress of %s/%s: %v", id, topic, err)
	}
	return pr
}

// polReadTopic reads n records of partition 0 of topic from the oldest,
// failing the test after 30 s.
func polReadTopic(t testing.TB, topic string, n int) []*sarama.ConsumerMessage {
	t.Helper()
	consumer, err := sarama.NewConsumer(kafkaAddrs(t), kafka.NewConfig("fanout-integration-consumer"))
	if err != nil {
		t.Fatalf("sarama.NewConsumer: %v", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatalf("ConsumePartition(%q, 0): %v", topic, err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	timeout := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			t.Fatalf("read %s: %v", topic, err)
		case <-timeout:
			t.Fatalf("read %d of %d records of %s in 30 s", len(out), n, topic)
		}
	}
	return out
}

// polHeaders returns a record's headers as a map.
func polHeaders(m *sarama.ConsumerMessage) map[string]string {
	out := map[string]string{}
	for _, h := range m.Headers {
		out[string(h.Key)] = string(h.Value)
	}
	return out
}

// polPoison produces to partition 0 of topic the poison record (key
// "poison-key", a header trace=t1, value poison) and then ok-1 .. ok-<n>.
func polPoison(t testing.TB, topic, poison string, n int) {
	t.Helper()
	msgs := []*sarama.ProducerMessage{{Key: sarama.StringEncoder("poison-key"), Value: sarama.StringEncoder(poison),
		Headers: []sarama.RecordHeader{{Key: []byte("trace"), Value: []byte("t1")}}}}
	for i := 1; i <= n; i++ {
		msgs = append(msgs, &sarama.ProducerMessage{Value: sarama.StringEncoder(fmt.Sprintf("ok-%d", i))})
	}
	produce(t, topic, msgs...)
}

// A poison message with --max-attempts 3 lands in the dead-letter topic
// with its key, value, headers and the fanout.dlq.* headers; the offset moves
// past it, the other messages flow; and with a kill -9 of the leader between
// attempts (a failover), its attempts total 3: the survivor resumes at the
// second, after the first nack's delay, and does not deliver again what was
// acked above it.
func TestPoisonDeadLetteredAcrossFailover(t *testing.T) {
	t.Parallel()
	testPoisonDeadLetteredAcrossFailover(t, false)
}

// The same with the Kafka offset store: the attempts travel in the commit
// metadata.
func TestPoisonDeadLetteredAcrossFailoverKafkaStore(t *testing.T) {
	t.Parallel()
	testPoisonDeadLetteredAcrossFailover(t, true)
}

func testPoisonDeadLetteredAcrossFailover(t *testing.T, kafkaStore bool) {
	const n = 9
	topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
	createTopic(t, topic, 1)
	createTopic(t, dlq, 1)
	polPoison(t, topic, "poison", n)
	var c *clCluster
	if kafkaStore {
		c = clNewKafkaCluster(t, topic, 2)
	} else {
		c = clNewCluster(t, topic, 2)
	}
	for _, nd := range c.nodes {
		nd.args = []string{"--max-attempts", "3", "--dead-letter-topic", dlq}
	}
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	c1 := procDial(t, client.Config{MaxInFlight: 20}, leader.addr)

	// First attempt: nacked with a delay longer than the failover, so that
	// it waits; the rest is acked.
	const delay = 20 * time.Second
	var nacked time.Time
	for acked := 0; acked < n; {
		m := recv(t, c1, 30*time.Second)
		if string(m.Value) == "poison" {
			if m.Attempt != 1 {
				t.Fatalf("poison delivered with attempt %d first", m.Attempt)
			}
			nacked = time.Now()
			if err := m.NackWith(delay, "cannot parse"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	testutil.WaitFor(t, 15*time.Second, "the failure and the acked range stored with offset 0", func() bool {
		pr := polProgress(t, kafkaStore, c.id, topic)[0]
		return pr.Base == 0 && pr.FailuresAt(0) == 1 && pr.AckedAt(1) && pr.AckedAt(n)
	})
	if offs := c.offsets(); offs[0] != 0 {
		t.Fatalf("committed offset %d while the poison message is not done", offs[0])
	}

	leader.kill()
	_ = c1.Close()
	survivor := c.others(leader)[0]
	clWaitLeader(t, []*clNode{survivor}, clFailoverBound+30*time.Second)
	c2 := procDial(t, client.Config{MaxInFlight: 20}, survivor.addr)
	for want := 2; want <= 3; want++ {
		m := recv(t, c2, delay+30*time.Second)
		if string(m.Value) != "poison" || m.Attempt != want {
			t.Fatalf("after the failover: %q attempt %d, want the poison message's attempt %d (acked messages are not delivered again)",
				m.Value, m.Attempt, want)
		}
		if want == 2 && time.Since(nacked) < delay {
			t.Fatalf("attempt 2 came %v after the nack with a %v delay", time.Since(nacked), delay)
		}
		if err := m.NackWith(0, fmt.Sprintf("cannot parse, attempt %d", want)); err != nil {
			t.Fatal(err)
		}
	}

	recs := polReadTopic(t, dlq, 1)
	r := recs[0]
	h := polHeaders(r)
	want := map[string]string{
		"trace":                           "t1",
		kafka.HeaderDeadLetterTopic:       topic,
		kafka.HeaderDeadLetterPartition:   "0",
		kafka.HeaderDeadLetterOffset:      "0",
		kafka.HeaderDeadLetterAttempts:    "3",
		kafka.HeaderDeadLetterLastFailure: "nack",
		kafka.HeaderDeadLetterNackReason:  "cannot parse, attempt 3",
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("dead letter header %s = %q, want %q (headers %v)", k, h[k], v, h)
		}
	}
	if string(r.Key) != "poison-key" || string(r.Value) != "poison" {
		t.Errorf("dead letter key %q value %q", r.Key, r.Value)
	}
	testutil.WaitFor(t, 15*time.Second, "the offset committed past the poison message", func() bool {
		return c.offsets()[0] == n+1
	})
	// Done: no fourth attempt, nothing else again.
	noMessage(t, c2, 2*time.Second)
	t.Logf("dead letter %s/%d@%d headers %v", dlq, r.Partition, r.Offset, h)
}

// A poison record larger than the dead-letter topic takes (its
// max.message.bytes below the record) is dead-lettered without its value:
// the letter names the record's topic, partition and offset, carries its
// key, headers and failures, and says what was left out and why; the
// partition's committed offset moves on. Whether the topic's limit is known
// at start (the producer leaves the value out before sending) or lowered
// afterwards (the broker refuses the record as too large).
func TestDeadLetterTooLargeForTheTopicGoesWithoutValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		lowered bool // the limit is lowered after the daemon's start
	}{{"limit at start", false}, {"limit lowered after start", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 5
			topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
			createTopic(t, topic, 1)
			createTopic(t, dlq, 1)
			admin := polAdmin(t)
			setMax := func(v string) {
				t.Helper()
				if err := admin.AlterConfig(sarama.TopicResource, dlq, map[string]*string{"max.message.bytes": &v}, false); err != nil {
					t.Fatalf("alter %s max.message.bytes=%s: %v", dlq, v, err)
				}
				// The broker applies a topic's new config from its metadata
				// log, a moment after the controller took it: wait until the
				// broker describes it, or a dead letter may still fit.
				testutil.WaitFor(t, 30*time.Second, dlq+" max.message.bytes="+v+" on the broker", func() bool {
					entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: dlq,
						ConfigNames: []string{"max.message.bytes"}})
					return err == nil && len(entries) == 1 && entries[0].Value == v
				})
			}
			if !tc.lowered {
				setMax("2048")
			}
			poison := strings.Repeat("p", 8000)
			polPoison(t, topic, poison, n)
			id := uniqueName(t, "svc")
			addr := procFreeAddr(t)
			p := procStart(t, procDaemonArgs(t, id, topic, addr, "--max-attempts", "1", "--dead-letter-topic", dlq)...)
			c := procDial(t, client.Config{MaxInFlight: 20}, addr)
			if tc.lowered {
				setMax("2048")
			}
			for acked := 0; acked < n; {
				m := recv(t, c, 30*time.Second)
				if string(m.Value) == poison {
					if err := m.NackWith(0, "too big to handle"); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
				acked++
			}
			r := polReadTopic(t, dlq, 1)[0]
			h := polHeaders(r)
			want := map[string]string{"trace": "t1", kafka.HeaderDeadLetterTopic: topic, kafka.HeaderDeadLetterPartition: "0",
				kafka.HeaderDeadLetterOffset: "0", kafka.HeaderDeadLetterAttempts: "1", kafka.HeaderDeadLetterLastFailure: "nack",
				kafka.HeaderDeadLetterNackReason: "too big to handle"}
			for k, v := range want {
				if h[k] != v {
					t.Errorf("dead letter header %s = %q, want %q (headers %v)", k, h[k], v, h)
				}
			}
			if r.Value != nil || string(r.Key) != "poison-key" {
				t.Errorf("dead letter key %q, value of %d bytes; want the key and no value", r.Key, len(r.Value))
			}
			if why := h[kafka.HeaderDeadLetterOmitted]; !strings.HasPrefix(why, "value: ") || !strings.Contains(why, "too large") {
				t.Errorf("header %s = %q, want what was left out and why", kafka.HeaderDeadLetterOmitted, why)
			}
			testutil.WaitFor(t, 30*time.Second, "the offset committed past the dead letter", func() bool {
				return zkOffsets(t, id, topic)[0] == n+1
			})
			if line := p.logLine("dead letter too large for the dead-letter topic", "without the message's value"); line == "" {
				t.Error("no log line says the dead letter went without its value")
			}
			noMessage(t, c, time.Second)
		})
	}
}

// polAdmin returns a cluster admin of the test's Kafka, closed at cleanup.
func polAdmin(t *testing.T) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	return admin
}

// A compacted dead-letter topic refuses a record without a key, and no
// retry can change that: the daemon keeps the record (the partition's
// committed offset stays below it while the records behind it are acked),
// raises the alert (fanout_dead_letter_refused, /readyz 503 naming it, one
// error line a minute rather than one per retry), and drops nothing; once
// an operator makes the topic take it, the letter is stored, the offset
// moves on and the daemon is ready again.
func TestDeadLetterRefusedByACompactedTopicAlertsAndHolds(t *testing.T) {
	t.Parallel()
	const n = 5
	topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
	createTopic(t, topic, 1)
	createTopic(t, dlq, 1)
	admin := polAdmin(t)
	setPolicy := func(v string) {
		t.Helper()
		if err := admin.AlterConfig(sarama.TopicResource, dlq, map[string]*string{"cleanup.policy": &v}, false); err != nil {
			t.Fatalf("alter %s cleanup.policy=%s: %v", dlq, v, err)
		}
	}
	setPolicy("compact")
	const poison = "poison without a key"
	msgs := []*sarama.ProducerMessage{{Value: sarama.StringEncoder(poison)}}
	for i := 1; i <= n; i++ {
		msgs = append(msgs, &sarama.ProducerMessage{Key: sarama.StringEncoder(fmt.Sprintf("k-%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("ok-%d", i))})
	}
	produce(t, topic, msgs...)

	id, addr, metricsAddr := uniqueName(t, "svc"), procFreeAddr(t), procFreeAddr(t)
	p := procStart(t, procDaemonArgs(t, id, topic, addr, "--max-attempts", "1", "--dead-letter-topic", dlq,
		"--metrics-listen", metricsAddr)...)
	c := procDial(t, client.Config{MaxInFlight: 20}, addr)
	for acked := 0; acked < n; {
		m := recv(t, c, 30*time.Second)
		if string(m.Value) == poison {
			if err := m.NackWith(0, "cannot parse"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	testutil.WaitFor(t, 30*time.Second, "/readyz to report the refused dead letter", func() bool {
		code, body, _ := testutil.HTTPGet(t, "http://"+metricsAddr+"/readyz", "")
		return code == 503 && strings.Contains(body, "dead letters failing") && strings.Contains(body, dlq)
	})
	if _, body, _ := testutil.HTTPGet(t, "http://"+metricsAddr+"/metrics", ""); !strings.Contains(body, "fanout_dead_letter_refused 1\n") {
		t.Errorf("/metrics does not count the refused dead letter:\n%s", polMetricLines(body, "fanout_dead_letter"))
	}
	testutil.WaitFor(t, 15*time.Second, "the acks above the held message stored", func() bool {
		return polProgress(t, false, id, topic)[0].AckedAt(n)
	})
	// Retried every few seconds at most (--connect-backoff-max), logged once a minute.
	time.Sleep(3 * time.Second) // an absence: retries that would log
	if lines := strings.Count(p.output(), "dead-letter topic refuses records"); lines != 1 {
		t.Errorf("%d log lines about the refusal, want 1 (once a minute):\n%s", lines, p.output())
	}
	if line := p.logLine("dead-letter topic refuses records"); !strings.Contains(line, dlq) || !strings.Contains(line, "level=error") {
		t.Errorf("the refusal's line does not name the topic at level error: %s", line)
	}
	if o := zkOffsets(t, id, topic)[0]; o != 0 {
		t.Fatalf("committed offset %d while the dead letter is refused", o)
	}

	setPolicy("delete")
	r := polReadTopic(t, dlq, 1)[0]
	if h := polHeaders(r); string(r.Value) != poison || r.Key != nil || h[kafka.HeaderDeadLetterOffset] != "0" ||
		h[kafka.HeaderDeadLetterNackReason] != "cannot parse" || h[kafka.HeaderDeadLetterOmitted] != "" {
		t.Fatalf("dead letter key %q value %q headers %v", r.Key, r.Value, h)
	}
	testutil.WaitFor(t, 30*time.Second, "the offset committed past the dead letter", func() bool {
		return zkOffsets(t, id, topic)[0] == n+1
	})
	testutil.WaitFor(t, 15*time.Second, "/readyz ready again", func() bool {
		code, _, _ := testutil.HTTPGet(t, "http://"+metricsAddr+"/readyz", "")
		return code == 200
	})
	noMessage(t, c, time.Second)
}

// polMetricLines returns the lines of a /metrics body that start with prefix.
func polMetricLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The same with the dead-letter topic deleted after the daemon's start
// check (the daemon's clients never create topics), then created again.
func TestDeadLetterTopicDeletedHoldsTheOffset(t *testing.T) {
	t.Parallel()
	testDeadLetterTopicOutOfReach(t,
		func(t *testing.T, admin sarama.ClusterAdmin, dlq string) {
			if err := admin.DeleteTopic(dlq); err != nil {
				t.Fatalf("delete %s: %v", dlq, err)
			}
		},
		func(t *testing.T, admin sarama.ClusterAdmin, dlq string) {
			// Kafka refuses the name while the deletion is under way.
			testutil.WaitFor(t, 60*time.Second, "topic "+dlq+" created again", func() bool {
				return admin.CreateTopic(dlq, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false) == nil
			})
		})
}

// A daemon whose --dead-letter-topic does not exist exits at start with an
// error that names the topic and says how to fix it.
func TestDeadLetterTopicMissingAtStart(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	dlq := uniqueName(t, "dlq")
	p := procStart(t, procDaemonArgs(t, uniqueName(t, "svc"), topic, procFreeAddr(t), "--max-attempts", "2", "--dead-letter-topic", dlq)...)
	if code := p.wait(t, 60*time.Second); code == 0 {
		t.Fatalf("exit code 0 with a missing dead-letter topic")
	}
	if line := p.logLine(dlq, "does not exist", "create it"); line == "" {
		t.Fatalf("no line names the missing topic and the fix:\n%s", p.output())
	}
}

// testDeadLetterTopicOutOfReach: a poison message with --max-attempts 1
// while breakIt has made the dead-letter topic unusable for a while (a
// failure retrying fixes once the topic is back) is held (the
// messages behind it acked and stored as progress, the committed offset
// below it, the failures logged) until fix makes the topic usable again;
// then the dead letter is stored with its headers and the offset moves on.
func testDeadLetterTopicOutOfReach(t *testing.T, breakIt, fix func(*testing.T, sarama.ClusterAdmin, string)) {
	const n = 5
	topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
	createTopic(t, topic, 1)
	createTopic(t, dlq, 1)
	admin := polAdmin(t)
	poison := strings.Repeat("p", 8000)
	polPoison(t, topic, poison, n)

	id := uniqueName(t, "svc")
	addr := procFreeAddr(t)
	p := procStart(t, procDaemonArgs(t, id, topic, addr, "--max-attempts", "1", "--dead-letter-topic", dlq)...)
	c := procDial(t, client.Config{MaxInFlight: 20}, addr) // serving: the start check passed
	breakIt(t, admin, dlq)
	for acked := 0; acked < n; {
		m := recv(t, c, 30*time.Second)
		if string(m.Value) == poison {
			if err := m.NackWith(0, "too big to handle"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	testutil.WaitFor(t, 30*time.Second, "two failed attempts to produce the dead letter, logged", func() bool {
		return strings.Count(p.output(), "dead-letter topic: producing failed") >= 2
	})
	if line := p.logLine("dead-letter topic: producing failed"); !strings.Contains(line, dlq) {
		t.Errorf("the failure's log line does not name the topic: %s", line)
	}
	// The acks above it are stored as progress; the offset stays.
	testutil.WaitFor(t, 15*time.Second, "the acks above the held message stored", func() bool {
		return polProgress(t, false, id, topic)[0].AckedAt(n)
	})
	if o := zkOffsets(t, id, topic)[0]; o != 0 {
		t.Fatalf("committed offset %d while the dead letter is not stored", o)
	}
	fix(t, admin, dlq)
	recs := polReadTopic(t, dlq, 1)
	if h := polHeaders(recs[0]); string(recs[0].Value) != poison || h[kafka.HeaderDeadLetterNackReason] != "too big to handle" ||
		h[kafka.HeaderDeadLetterAttempts] != "1" {
		t.Fatalf("dead letter of %d bytes, headers %v", len(recs[0].Value), h)
	}
	testutil.WaitFor(t, 30*time.Second, "the offset committed past the dead letter", func() bool {
		return zkOffsets(t, id, topic)[0] == n+1
	})
	if p.logLine("dead-letter topic: producing works again") == "" {
		t.Error("no log line says producing works again")
	}
	noMessage(t, c, time.Second)
}

// After a kill -9 at a steady rate, with one message of a partition held
// unacked (so that the contiguous acked prefix, the committed offset, stays
// behind it), the duplicates are at most the messages in flight at the
// crash plus one commit interval of acks (and a margin for the commit's
// own write): the acked ranges above the committed offset are not delivered
// again. The figure without ranges (every acked message above the
// committed offset) is logged beside it.
func TestAckedRangesSpareDuplicatesAfterKillNine(t *testing.T) {
	t.Parallel()
	const (
		partitions = 2
		n          = 4000
		credit     = 50                     // the client's MaxInFlight: at most this many in flight at the crash
		commit     = 200 * time.Millisecond // procDaemonArgs' --commit-interval
		margin     = time.Second            // the commit's own write, on a loaded machine
	)
	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addr := procFreeAddr(t)
	p1 := procStart(t, procDaemonArgs(t, id, topic, addr, "--ack-timeout", "60s")...)
	c1 := procDial(t, client.Config{MaxInFlight: credit}, addr)
	// 500 messages a second: 25 every 50 ms.
	produced := procProducePaced(t, topic, n, partitions, 25, 50*time.Millisecond)

	ackedAt := map[procPO]time.Time{}
	var held *client.Message // partition 0's first message: never acked by c1
	for len(ackedAt) < n/2 {
		m := recv(t, c1, 30*time.Second)
		po := procPO{m.Partition, m.Offset}
		if held == nil && m.Partition == 0 {
			held = m
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		ackedAt[po] = time.Now()
	}
	p1.signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	p1.wait(t, 10*time.Second)
	_ = c1.Close()
	committed := zkOffsets(t, id, topic)
	lastWindow, without := 0, 0
	for po, at := range ackedAt {
		if killedAt.Sub(at) <= commit+margin {
			lastWindow++
		}
		if po.O >= committed[po.P] {
			without++ // a daemon without ranges delivers it again
		}
	}

	procStart(t, procDaemonArgs(t, id, topic, addr, "--ack-timeout", "60s")...)
	c2 := procDial(t, client.Config{MaxInFlight: credit}, addr)
	duplicates := 0
	done := map[procPO]bool{}
	for po := range ackedAt {
		done[po] = true
	}
	for len(done) < n {
		m := recv(t, c2, 30*time.Second)
		po := procPO{m.Partition, m.Offset}
		if _, ok := ackedAt[po]; ok {
			duplicates++
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		done[po] = true
	}
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}
	t.Logf("kill -9 after %d acks at 500 msg/s, committed %v: %d duplicates with acked ranges; %d without them (every acked message above the committed offset); bound %d (%d in flight + %d acks in the last %v)",
		len(ackedAt), committed, duplicates, without, credit+lastWindow, credit, lastWindow, commit+margin)
	if duplicates > credit+lastWindow {
		t.Fatalf("%d duplicates after the kill -9, above the bound of %d in flight + %d acks of the last %v",
			duplicates, credit, lastWindow, commit+margin)
	}
	// The crash is one where ranges matter: partition 0's committed offset
	// stayed at the held message, with many acked messages above it.
	if without < n/8 {
		t.Fatalf("only %d acked messages above the committed offsets at the kill: the held message did not hold", without)
	}
	testutil.WaitFor(t, 15*time.Second, "every partition committed to its end", func() bool {
		offs := zkOffsets(t, id, topic)
		return offs[0] == n/partitions && offs[1] == n/partitions
	})
}

// Spread mode: a partition's stored progress moves with it at a handoff.
// One member serves both partitions; each partition's poison message fails
// once (nacked with a 20 s delay) and the rest is acked. A second member
// joins and takes one partition over (release-before-reserve, the old
// owner's final commit carrying the progress): it does not deliver the acked
// messages again and resumes the poison message at its second attempt, no
// sooner than its delay, so that --max-attempts 3 dead-letters it after
// three attempts in all.
func TestSpreadProgressMovesWithThePartition(t *testing.T) {
	t.Parallel()
	testSpreadProgressMovesWithThePartition(t, spNewCluster)
}

// The same on the Kafka store: the progress rides in the metadata of the
// handing-over member's final commit.
func TestSpreadKafkaProgressMovesWithThePartition(t *testing.T) {
	t.Parallel()
	testSpreadProgressMovesWithThePartition(t, skNewCluster)
}

func testSpreadProgressMovesWithThePartition(t *testing.T, newCluster func(*testing.T, string, int) *clCluster) {
	const partitions, n = 2, 5
	topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
	createTopic(t, topic, partitions)
	createTopic(t, dlq, 1)
	producer := manualProducer(t)
	for p := range int32(partitions) {
		msgs := []*sarama.ProducerMessage{{Topic: topic, Partition: p, Value: sarama.StringEncoder(fmt.Sprintf("poison-%d", p))}}
		for i := 1; i <= n; i++ {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: p, Value: sarama.StringEncoder(fmt.Sprintf("ok-%d-%d", p, i))})
		}
		if err := producer.SendMessages(msgs); err != nil {
			t.Fatal(err)
		}
	}
	_ = producer.Close()

	c := newCluster(t, topic, 1)
	conn := spConn(t, c)
	policy := []string{"--max-attempts", "3", "--dead-letter-topic", dlq}
	c.nodes[0].args = append(c.nodes[0].args, policy...)
	c.startAll()
	spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	cl := procDial(t, client.Config{MaxInFlight: 20}, c.nodes[0].addr)
	const delay = 20 * time.Second // longer than the handoff
	nacked := map[string]time.Time{}
	for acked := 0; acked < partitions*n; {
		m := recv(t, cl, 30*time.Second)
		if strings.HasPrefix(string(m.Value), "poison") {
			if m.Attempt != 1 {
				t.Fatalf("%s: attempt %d first", m.Value, m.Attempt)
			}
			nacked[string(m.Value)] = time.Now()
			if err := m.NackWith(delay, "first"); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	testutil.WaitFor(t, 15*time.Second, "each partition's failure and acked range stored", func() bool {
		pr := polProgress(t, c.kafkaStore, c.id, topic)
		for p := range int32(partitions) {
			if pr[p].FailuresAt(0) != 1 || !pr[p].AckedAt(n) {
				return false
			}
		}
		return true
	})

	joiner := spAdd(t, c)
	joiner.args = append(joiner.args, policy...)
	c.start(joiner)
	after := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)
	moved := after[joiner.id][0]
	t.Logf("partition %d moved to %s", moved, joiner.id)
	for want := 2; want <= 3; want++ {
		m := recv(t, cl, delay+60*time.Second)
		if m.Partition != moved && string(m.Value) == fmt.Sprintf("poison-%d", m.Partition) && m.Attempt == 2 {
			// The other partition's poison, after its delay: it stays.
			if err := m.NackWith(10*time.Minute, "later"); err != nil {
				t.Fatal(err)
			}
			want--
			continue
		}
		if string(m.Value) != fmt.Sprintf("poison-%d", moved) || m.Attempt != want || m.Member() != joiner.addr {
			t.Fatalf("after the handoff: %q attempt %d from %s, want poison-%d attempt %d from %s (acked messages are not delivered again)",
				m.Value, m.Attempt, m.Member(), moved, want, joiner.addr)
		}
		if waited := time.Since(nacked[string(m.Value)]); want == 2 && waited < delay {
			t.Fatalf("after the handoff: attempt 2 came %v after the nack with a %v delay (the delay moves with the partition)", waited, delay)
		}
		if err := m.NackWith(0, "still bad"); err != nil {
			t.Fatal(err)
		}
	}
	r := polReadTopic(t, dlq, 1)[0]
	h := polHeaders(r)
	if h[kafka.HeaderDeadLetterAttempts] != "3" || h[kafka.HeaderDeadLetterPartition] != strconv.Itoa(int(moved)) ||
		h[kafka.HeaderDeadLetterOffset] != "0" || string(r.Value) != fmt.Sprintf("poison-%d", moved) {
		t.Fatalf("dead letter %q headers %v", r.Value, h)
	}
	testutil.WaitFor(t, 15*time.Second, "the moved partition committed past its poison message", func() bool {
		return c.offsets()[moved] == n+1
	})
	noMessage(t, cl, 2*time.Second)
}
