//go:build integration

package integration

// Nack delays that survive a failover, against the real Kafka and
// ZooKeeper: messages nacked with a 20 s delay, then a kill -9 of the
// daemon that holds them (the leader, or in spread mode their partition's
// owner) while they wait; the next one delivers none before its time,
// measured from the nack's wall-clock time (a lower bound only: how much
// later they come is the machine's business), and all of them eventually.
// Helpers here are prefixed dly.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

const (
	dlyDelay      = 20 * time.Second // what the client's nacks ask for
	dlyPartitions = 4
	dlyMessages   = 24
)

// dlyProduce produces dlyMessages records, "d-<i>", round-robin over the
// topic's partitions.
func dlyProduce(t *testing.T, topic string) {
	t.Helper()
	producer := manualProducer(t)
	defer producer.Close()
	var msgs []*sarama.ProducerMessage
	for i := range dlyMessages {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(i % dlyPartitions), Value: sarama.StringEncoder(fmt.Sprintf("d-%d", i))})
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

// dlyNackAll receives every record once and nacks it with dlyDelay,
// returning when each was nacked (read before the nack is sent) and where
// it is. A record delivered twice meanwhile fails the test.
func dlyNackAll(t *testing.T, c *client.Client) (map[string]time.Time, map[string]int32) {
	t.Helper()
	nacked, parts := map[string]time.Time{}, map[string]int32{}
	for len(nacked) < dlyMessages {
		m := recv(t, c, 60*time.Second)
		v := string(m.Value)
		if at, ok := nacked[v]; ok {
			t.Fatalf("%s delivered again %v after its nack with a %v delay, before any failover", v, time.Since(at), dlyDelay)
		}
		nacked[v], parts[v] = time.Now(), m.Partition
		if err := m.NackWithDelay(dlyDelay); err != nil {
			t.Fatal(err)
		}
	}
	return nacked, parts
}

// dlyWaitStored waits until the store holds a delay for every record.
func dlyWaitStored(t *testing.T, kafkaStore bool, id, topic string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "a delay stored for every record", func() bool {
		n := 0
		for _, pr := range polProgress(t, kafkaStore, id, topic) {
			n += len(pr.Delayed)
		}
		return n == dlyMessages
	})
}

// dlyReceiveAll receives every record again, acking it, and fails the test
// for each that came before its nack's time plus dlyDelay. It returns the
// smallest margin seen (how long after its time the earliest came), for the
// log, and who delivered the records of which partitions.
func dlyReceiveAll(t *testing.T, c *client.Client, nacked map[string]time.Time) (time.Duration, map[int32]string) {
	t.Helper()
	margin := time.Duration(1 << 62)
	from := map[int32]string{}
	got := map[string]bool{}
	// A wait for the event, never a bound it must beat: the delay, a
	// failover and a loaded machine's slack.
	deadline := time.Now().Add(dlyDelay + clFailoverBound + 2*time.Minute)
	for len(got) < dlyMessages {
		m := recv(t, c, time.Until(deadline))
		now, v := time.Now(), string(m.Value)
		due, ok := nacked[v]
		if !ok {
			t.Fatalf("received %q, not one of the records", v)
		}
		due = due.Add(dlyDelay)
		if now.Before(due) {
			t.Errorf("%s (partition %d, attempt %d, from %s) came back %v before its time: %v after its nack with a %v delay",
				v, m.Partition, m.Attempt, m.Member(), due.Sub(now), now.Sub(nacked[v]), dlyDelay)
		}
		if m.Attempt != 2 {
			t.Errorf("%s came back with attempt %d, want 2 (the nack counted, stored with its delay)", v, m.Attempt)
		}
		margin = min(margin, now.Sub(due))
		from[m.Partition] = m.Member()
		got[v] = true
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	return margin, from
}

// Leader mode: three daemons; every record nacked with a 20 s delay and
// the delays stored; kill -9 of the leader; the new leader delivers each
// record no sooner than 20 s after its nack, and every record.
func TestDelayedNacksSurviveLeaderKill(t *testing.T) { testDelayedNacksSurviveLeaderKill(t, false) }

// The same with the Kafka offset store: the delays travel in the commit
// metadata.
func TestDelayedNacksSurviveLeaderKillKafkaStore(t *testing.T) {
	t.Parallel()
	testDelayedNacksSurviveLeaderKill(t, true)
}

func testDelayedNacksSurviveLeaderKill(t *testing.T, kafkaStore bool) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, dlyPartitions)
	dlyProduce(t, topic)
	var c *clCluster
	if kafkaStore {
		c = clNewKafkaCluster(t, topic, 3)
	} else {
		c = clNewCluster(t, topic, 3)
	}
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	c1 := procDial(t, client.Config{MaxInFlight: dlyMessages}, leader.addr)
	nacked, _ := dlyNackAll(t, c1)
	dlyWaitStored(t, kafkaStore, c.id, topic)

	leader.kill()
	killed := time.Now()
	_ = c1.Close()
	next := clWaitLeader(t, c.others(leader), clFailoverBound)
	t.Logf("%s killed %v after the first nack; %s leads %v after the kill", leader.id, killed.Sub(dlyFirst(nacked)), next.id, time.Since(killed))
	c2 := procDial(t, client.Config{MaxInFlight: dlyMessages}, next.addr)
	margin, _ := dlyReceiveAll(t, c2, nacked)
	t.Logf("every record came again; the earliest %v after its time", margin)
}

// Spread mode: three members share four partitions; every record nacked
// with a 20 s delay and the delays stored; kill -9 of a member that owns
// some of the partitions (not the leader, whose death moves none by
// itself); the members that take its partitions deliver their records no
// sooner than 20 s after their nacks, and every record comes.
func TestDelayedNacksSurviveOwnerKillSpread(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, dlyPartitions)
	dlyProduce(t, topic)
	conn := spZK(t)
	c := spNewCluster(t, topic, 3)
	c.startAll()
	owners := spWaitOwned(t, conn, c, c.nodes, dlyPartitions, 60*time.Second)
	record, _, err := conn.Get(clFencePath(t, c))
	if err != nil {
		t.Fatal(err)
	}
	var victim *clNode
	for _, nd := range c.nodes {
		if !strings.Contains(string(record), `"`+nd.id+`"`) && len(owners[nd.id]) > 0 {
			victim = nd
			break
		}
	}
	if victim == nil {
		t.Fatalf("no member but the leader (%s) owns a partition: %v", record, owners)
	}
	var addrs []string
	for _, nd := range c.nodes {
		addrs = append(addrs, nd.addr)
	}
	c1 := dial(t, client.Config{MaxInFlight: dlyMessages, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}, addrs...)
	nacked, parts := dlyNackAll(t, c1)
	dlyWaitStored(t, false, c.id, topic)

	victim.kill()
	killed := time.Now()
	t.Logf("%s (partitions %v) killed %v after the first nack", victim.id, owners[victim.id], killed.Sub(dlyFirst(nacked)))
	margin, from := dlyReceiveAll(t, c1, nacked)
	t.Logf("every record came again; the earliest %v after its time", margin)
	moved := 0
	for v, p := range parts {
		if slices.Contains(owners[victim.id], p) {
			moved++
			if from[p] == victim.addr {
				t.Errorf("%s of partition %d came again from the killed member", v, p)
			}
		}
	}
	if moved == 0 {
		t.Fatalf("no record of the killed member's partitions %v", owners[victim.id])
	}
	t.Logf("%d records of the killed member's partitions came again from %v", moved, from)
}

// dlyFirst returns the earliest of the times.
func dlyFirst(ts map[string]time.Time) time.Time {
	var first time.Time
	for _, at := range ts {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}
