package cluster

import (
	"crypto/hmac"
	"crypto/sha256"

	"github.com/IBM/sarama"
)

// macHeader is the Kafka record header that carries a heartbeat's MAC.
const macHeader = "fanout-mac"

// heartbeatMAC is the MAC of a heartbeat record: HMAC-SHA256 with the
// cluster secret over the heartbeat topic's name and the record's value,
// the encoded Heartbeat as it travels (so that no re-encoding is needed to
// check it). The topic's name binds the record to its cluster: a record
// copied from another cluster's log, with the same secret, does not pass.
func heartbeatMAC(secret []byte, topic string, value []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write(value)
	return h.Sum(nil)
}

// authentic reports whether m carries the valid MAC of its value. Without
// a secret every record is taken, as before the MAC existed.
func authentic(secret []byte, topic string, m *sarama.ConsumerMessage) bool {
	if len(secret) == 0 {
		return true
	}
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == macHeader {
			return hmac.Equal(h.Value, heartbeatMAC(secret, topic, m.Value))
		}
	}
	return false
}
