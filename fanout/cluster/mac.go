package cluster

import (
	"crypto/hmac"
	"crypto/sha256"

	"github.com/IBM/sarama"
)

// MACHeader is the Kafka record header that carries a heartbeat's MAC.
const MACHeader = "fanout-mac"

// HeartbeatMAC is the MAC of a heartbeat record of topic: HMAC-SHA256 with the
// cluster secret over the heartbeat topic's name and the record's value,
// the encoded Heartbeat as it travels (so that no re-encoding is needed to
// check it). The topic's name binds the record to its cluster: a record
// copied from another cluster's log, with the same secret, does not pass.
// The value holds what binds the record to its sender and dates it
// (instance, seq, seen): a copy written again later carries them unchanged,
// and the members ignore it (see vote).
func HeartbeatMAC(secret []byte, topic string, value []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write(value)
	return h.Sum(nil)
}

// Authentic reports whether m, a record of the heartbeat topic, carries
// the valid MAC of its value with secret. Without a secret every record is
// taken, as before the MAC existed.
func Authentic(secret []byte, topic string, m *sarama.ConsumerMessage) bool {
	if len(secret) == 0 {
		return true
	}
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == MACHeader {
			return hmac.Equal(h.Value, HeartbeatMAC(secret, topic, m.Value))
		}
	}
	return false
}
