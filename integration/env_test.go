//go:build integration

// Package integration holds the tests that need a real Apache Kafka and
// ZooKeeper. Run them with bin/integration, which starts both (bin/services)
// and sets FANOUT_TEST_KAFKA and FANOUT_TEST_ZOOKEEPER.
package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// addrsFromEnv splits the comma-separated host:port list in the environment
// variable name, failing the test (never skipping it) when it is unset.
func addrsFromEnv(t testing.TB, name, service string) []string {
	t.Helper()
	var addrs []string
	for _, a := range strings.Split(os.Getenv(name), ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		t.Fatalf("%s is not set: integration tests need a real %s; run them with bin/integration "+
			"(it starts the services), or `bin/services start` and export %s=127.0.0.1:PORT", name, service, name)
	}
	return addrs
}

// kafkaAddrs returns the Kafka bootstrap brokers from FANOUT_TEST_KAFKA.
func kafkaAddrs(t testing.TB) []string {
	t.Helper()
	return addrsFromEnv(t, "FANOUT_TEST_KAFKA", "Apache Kafka")
}

// zkAddrs returns the ZooKeeper servers from FANOUT_TEST_ZOOKEEPER.
func zkAddrs(t testing.TB) []string {
	t.Helper()
	return addrsFromEnv(t, "FANOUT_TEST_ZOOKEEPER", "Apache ZooKeeper")
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// uniqueName returns prefix-<test name>-<random hex>, safe as a Kafka topic,
// consumer group or znode name, so that tests never share state.
func uniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("uniqueName: %v", err)
	}
	name := unsafeName.ReplaceAllString(t.Name(), "_")
	if len(name) > 120 {
		name = name[:120]
	}
	return prefix + "-" + name + "-" + hex.EncodeToString(b[:])
}

// newClient returns a sarama client of the test cluster (closed at cleanup).
func newClient(t testing.TB) sarama.Client {
	t.Helper()
	client, err := sarama.NewClient(kafkaAddrs(t), kafka.NewConfig("fanout-integration"))
	if err != nil {
		t.Fatalf("sarama.NewClient(%v): %v", kafkaAddrs(t), err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// createTopic creates topic name with the given partition count
// (replication factor 1) and waits until the metadata shows every partition
// with a leader. The topic is deleted at cleanup.
func createTopic(t testing.TB, name string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatalf("sarama.NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	err = admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
	if err != nil {
		t.Fatalf("CreateTopic(%q, %d partitions): %v", name, partitions, err)
	}
	t.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
		if err != nil {
			t.Logf("cleanup: NewClusterAdmin: %v", err)
			return
		}
		defer admin.Close()
		if err := admin.DeleteTopic(name); err != nil {
			t.Logf("cleanup: DeleteTopic(%q): %v", name, err)
		}
	})

	client := newClient(t)
	testutil.WaitFor(t, 30*time.Second, "topic "+name+" to have a leader for each partition", func() bool {
		if err := client.RefreshMetadata(name); err != nil {
			return false
		}
		ids, err := client.Partitions(name)
		if err != nil || int32(len(ids)) != partitions {
			return false
		}
		for _, p := range ids {
			if leader, err := client.Leader(name, p); err != nil || leader == nil {
				return false
			}
		}
		return true
	})
}

// addPartitions grows topic to partitions and waits until the metadata
// shows every partition with a leader.
func addPartitions(t testing.TB, topic string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatalf("sarama.NewClusterAdmin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreatePartitions(topic, partitions, nil, false); err != nil {
		t.Fatalf("CreatePartitions(%q, %d): %v", topic, partitions, err)
	}
	client := newClient(t)
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("the %d partitions of %s to have leaders", partitions, topic), func() bool {
		if client.RefreshMetadata(topic) != nil {
			return false
		}
		for p := range partitions {
			if l, err := client.Leader(topic, p); err != nil || l == nil {
				return false
			}
		}
		return true
	})
}

// producerConfig is the tests' producer: idempotent, so a send retried on a
// loaded machine (a request timed out, yet written) is not written twice,
// and a test sees in Kafka exactly what it produced.
func producerConfig() *sarama.Config {
	cfg := kafka.NewConfig("fanout-integration-producer")
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	return cfg
}

// manualProducer returns a synchronous producer (acks=all) that sends each
// message to the partition it names. The caller closes it.
func manualProducer(t testing.TB) sarama.SyncProducer {
	t.Helper()
	cfg := producerConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	producer, err := sarama.NewSyncProducer(kafkaAddrs(t), cfg)
	if err != nil {
		t.Fatalf("sarama.NewSyncProducer: %v", err)
	}
	return producer
}

// produce sends msgs to topic with a synchronous producer (acks=all) and
// fails the test on any error. A message's Topic is set to topic.
func produce(t testing.TB, topic string, msgs ...*sarama.ProducerMessage) {
	t.Helper()
	producer, err := sarama.NewSyncProducer(kafkaAddrs(t), producerConfig())
	if err != nil {
		t.Fatalf("sarama.NewSyncProducer: %v", err)
	}
	defer producer.Close()
	for _, m := range msgs {
		m.Topic = topic
	}
	if err := producer.SendMessages(msgs); err != nil {
		t.Fatalf("produce %d messages to %q: %v", len(msgs), topic, err)
	}
}
