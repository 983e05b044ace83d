package kafka

import (
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// KafkaVersion is the protocol version ceiling every sarama client of fanout
// uses. sarama (>= 1.46) negotiates API versions with the broker, so this is
// an upper bound, not a pin: Kafka 4.x removed protocol versions older than
// 2.1, and 4.0 is the oldest broker fanout supports. Checked against Apache
// Kafka 4.4.0 by the integration harness (bin/integration).
var KafkaVersion = sarama.V4_0_0_0

// NewConfig returns the sarama configuration that every fanout Kafka client
// (producer, consumer, cluster admin) starts from, identified to the brokers
// by clientID, without TLS or SASL. Callers may adjust it further (for
// example consumer offsets or channel buffer sizes) before use. It is the one
// place that builds a sarama.Config: do not call sarama.NewConfig elsewhere.
// The daemon, fanout produce and fanout status take it through
// Security.Config, which adds the connection's TLS and SASL; tests and the
// benchmark, on plain-text listeners, use it directly.
func NewConfig(clientID string) *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.ClientID = clientID
	cfg.Version = KafkaVersion

	// Errors and successes are delivered on channels, so that nothing is
	// dropped silently (SyncProducer requires both).
	cfg.Consumer.Return.Errors = true
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll

	// Metadata: a broker restart or a freshly created topic needs a few
	// retries before partitions have leaders. Keep them short (about 1.5 s in
	// all): whoever calls retries again with its own, logged backoff, so an
	// operator hears about a missing topic or an unreachable broker at once.
	cfg.Metadata.Retry.Max = 4
	cfg.Metadata.Retry.Backoff = 0
	cfg.Metadata.Retry.BackoffFunc = metadataBackoff
	// Asking for a topic's metadata must not create it: a missing topic is
	// reported (and retried by the daemon), not silently made empty.
	cfg.Metadata.AllowAutoTopicCreation = false

	return cfg
}

// Isolation levels of the source's fetches (--isolation).
const (
	ReadCommitted   = "read_committed"
	ReadUncommitted = "read_uncommitted"
)

// ParseIsolation turns "read_committed" or "read_uncommitted" (any case)
// into the sarama isolation level.
func ParseIsolation(s string) (sarama.IsolationLevel, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case ReadCommitted:
		return sarama.ReadCommitted, nil
	case ReadUncommitted:
		return sarama.ReadUncommitted, nil
	}
	return 0, fmt.Errorf("isolation %q: want %s or %s", s, ReadCommitted, ReadUncommitted)
}

// metadataBackoff doubles from 100 ms up to 2 s between metadata retries.
func metadataBackoff(retries, _ int) time.Duration {
	d := 100 * time.Millisecond
	for i := 0; i < retries && d < 2*time.Second; i++ {
		d *= 2
	}
	return min(d, 2*time.Second)
}
