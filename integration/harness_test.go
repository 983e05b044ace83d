//go:build integration

package integration

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// TestHarnessKafka proves the Kafka of bin/services works with sarama and
// kafka.NewConfig: a 4-partition topic, 100 keyed messages spread over the
// partitions, every one read back from the oldest offset of each partition.
func TestHarnessKafka(t *testing.T) {
	t.Parallel()
	const partitions, count = 4, 100
	topic := uniqueName(t, "harness")
	createTopic(t, topic, partitions)

	msgs := make([]*sarama.ProducerMessage, count)
	want := make(map[string]string, count)
	for i := range msgs {
		key, value := fmt.Sprintf("key-%03d", i), fmt.Sprintf("value-%03d-%s", i, topic)
		msgs[i] = &sarama.ProducerMessage{Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(value)}
		want[key] = value
	}
	produce(t, topic, msgs...)
	perPartition := make(map[int32]int, partitions)
	for _, m := range msgs {
		perPartition[m.Partition]++
	}
	if len(perPartition) < 2 {
		t.Errorf("100 keys landed on partitions %v: the hash partitioner should spread them", perPartition)
	}

	consumer, err := sarama.NewConsumer(kafkaAddrs(t), kafka.NewConfig("fanout-integration-consumer"))
	if err != nil {
		t.Fatalf("sarama.NewConsumer: %v", err)
	}
	defer consumer.Close()
	ids, err := consumer.Partitions(topic)
	if err != nil || len(ids) != partitions {
		t.Fatalf("Partitions(%q) = %v, %v; want %d partitions", topic, ids, err, partitions)
	}

	got := make(map[string]string, count)
	for _, p := range ids {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("ConsumePartition(%q, %d): %v", topic, p, err)
		}
		timeout := time.After(30 * time.Second)
		for n := 0; n < perPartition[p]; n++ {
			select {
			case m := <-pc.Messages():
				if m.Partition != p {
					t.Errorf("message from partition %d on the consumer of partition %d", m.Partition, p)
				}
				if prev, dup := got[string(m.Key)]; dup {
					t.Errorf("key %s read twice (%q, %q)", m.Key, prev, m.Value)
				}
				got[string(m.Key)] = string(m.Value)
			case err := <-pc.Errors():
				t.Fatalf("partition %d: %v", p, err)
			case <-timeout:
				t.Fatalf("partition %d: read %d of %d messages in 30 s", p, n, perPartition[p])
			}
		}
		if err := pc.Close(); err != nil {
			t.Errorf("close partition consumer %d: %v", p, err)
		}
	}
	if len(got) != count {
		t.Fatalf("read %d distinct keys, want %d", len(got), count)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("key %s: got %q, want %q", k, got[k], v)
		}
	}
	t.Logf("topic %s: %d messages over partitions %v", topic, count, perPartition)
}

// TestHarnessZooKeeper proves the ZooKeeper of bin/services works with
// go-zookeeper: create, read, versioned (conditional) updates and a multi
// whose version check fails atomically.
func TestHarnessZooKeeper(t *testing.T) {
	t.Parallel()
	conn, events, err := zk.Connect(zkAddrs(t), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatalf("zk.Connect(%v): %v", zkAddrs(t), err)
	}
	t.Cleanup(conn.Close) // registered first, so it runs after the znode cleanup below
	waitForSession(t, events)

	root := "/" + uniqueName(t, "harness")
	if _, err := conn.Create(root, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("Create(%s): %v", root, err)
	}
	t.Cleanup(func() { deleteTree(t, conn, root) })

	node := root + "/offset"
	if _, err := conn.Create(node, []byte("v1"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("Create(%s): %v", node, err)
	}
	data, stat, err := conn.Get(node)
	if err != nil || string(data) != "v1" || stat.Version != 0 {
		t.Fatalf("Get(%s) = %q, version %v, %v; want \"v1\", version 0", node, data, versionOf(stat), err)
	}

	// Conditional update: the right version wins, a stale one is refused.
	stat, err = conn.Set(node, []byte("v2"), stat.Version)
	if err != nil || stat.Version != 1 {
		t.Fatalf("Set with the current version: version %v, %v; want version 1", versionOf(stat), err)
	}
	if _, err := conn.Set(node, []byte("stale"), 0); !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("Set with a stale version: %v, want zk.ErrBadVersion", err)
	}

	// Fencing: a write made conditional on another znode's version.
	fence := root + "/owner"
	if _, err := conn.Create(fence, []byte("owner-a"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("Create(%s): %v", fence, err)
	}
	if _, err := conn.Set(fence, []byte("owner-b"), 0); err != nil { // fence now at version 1
		t.Fatalf("Set(%s): %v", fence, err)
	}
	_, err = conn.Multi(
		&zk.CheckVersionRequest{Path: fence, Version: 0}, // stale: must fail the whole multi
		&zk.SetDataRequest{Path: node, Data: []byte("fenced-out"), Version: 1},
	)
	if !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("Multi with a failing CheckVersionRequest: %v, want zk.ErrBadVersion", err)
	}
	data, stat, err = conn.Get(node)
	if err != nil || string(data) != "v2" || stat.Version != 1 {
		t.Fatalf("after the failed multi: %q, version %v, %v; want \"v2\", version 1 (unchanged)",
			data, versionOf(stat), err)
	}
	// And with the right fence version the same multi applies.
	if _, err := conn.Multi(
		&zk.CheckVersionRequest{Path: fence, Version: 1},
		&zk.SetDataRequest{Path: node, Data: []byte("v3"), Version: 1},
	); err != nil {
		t.Fatalf("Multi with a passing CheckVersionRequest: %v", err)
	}
	if data, _, err := conn.Get(node); err != nil || string(data) != "v3" {
		t.Fatalf("after the multi: %q, %v; want \"v3\"", data, err)
	}
}

func versionOf(s *zk.Stat) any {
	if s == nil {
		return nil
	}
	return s.Version
}

// waitForSession waits until the ZooKeeper session is established.
func waitForSession(t testing.TB, events <-chan zk.Event) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return
			}
		case <-timeout:
			t.Fatalf("no ZooKeeper session within 15 s (servers %v)", zkAddrs(t))
		}
	}
}

// deleteTree removes path and everything under it.
func deleteTree(t testing.TB, conn *zk.Conn, path string) {
	children, _, err := conn.Children(path)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Logf("cleanup: Children(%s): %v", path, err)
		return
	}
	for _, c := range children {
		deleteTree(t, conn, strings.TrimSuffix(path, "/")+"/"+c)
	}
	if err := conn.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Logf("cleanup: Delete(%s): %v", path, err)
	}
}
