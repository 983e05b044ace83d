// Package client is the Go client of a fanout daemon: it receives messages
// from a Kafka topic, one client at a time, and acknowledges them.
//
// A Client keeps one TCP connection to the leader of a fanout cluster. It
// follows redirects, answers the daemon's pings, detects a silent daemon and
// reconnects with backoff by itself; the user only reads Messages and calls
// Ack (or Nack, or Touch) on each.
//
//	c, err := client.Dial(ctx, client.Config{Addrs: []string{"localhost:4987"}})
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	for m := range c.Messages() {
//		process(m.Value)
//		if err := m.Ack(); err != nil {
//			log.Print(err) // ErrStale: the daemon will deliver it again
//		}
//	}
//	return c.Err() // nil after Close; the reason when the client gave up
//
// Delivery is at least once. A message that is not acked within the daemon's
// ack timeout, or whose connection breaks before its ack is sent, is
// delivered again, possibly to another client; process messages
// idempotently.
//
// Acks, nacks and touches are batched on the wire without a timer: each call
// queues its delivery id and wakes the connection's writer, which sends every
// id queued by then in one frame. An idle client sends an ack at once; a busy
// one sends many in one frame and one system call.
package client
