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
// Consume runs a handler on the messages in a fixed pool of workers: the
// handler's nil acks, its error nacks (with a delay for RetryAfter's), its
// panic nacks and is logged.
// Shutdown stops gracefully: no new messages, the running handlers finish
// and their acks are sent, then goodbye; Close stops at once, and acks not
// yet sent then return ErrClosed.
//
//	go func() {
//		<-ctx.Done() // SIGTERM, say
//		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//		defer cancel()
//		c.Shutdown(sctx) // finish the work in hand within 10 s
//	}()
//	return c.Consume(context.Background(), 8, func(ctx context.Context, m *client.Message) error {
//		return process(ctx, m.Value) // an error: the message comes again
//	})
//
// Config.Logger is a *slog.Logger: the client logs connection events
// through the application's own handler, or nowhere.
//
// Delivery is at least once. A message that is not acked within the daemon's
// ack timeout, or whose connection breaks before its ack is sent, is
// delivered again, possibly to another client; process messages
// idempotently.
//
// Config.TLS makes every connection TLS (daemons with --tls-cert), with a
// client certificate for mutual TLS (--tls-client-ca). The server name is
// the host of each address connected to, a redirect's or a member's
// included, unless the configuration names one. A refused certificate, an
// untrusted daemon or one that answers in plain text stops the client with
// an error wrapping ErrTLS.
//
// Acks, nacks and touches are batched on the wire without a timer: each call
// queues its delivery id and wakes the connection's writer, which sends every
// id queued by then in one frame. An idle client sends an ack at once; a busy
// one sends many in one frame and one system call.
//
// The client announces CAPABILITY_BATCH: a daemon that takes it up sends
// deliveries many to a frame (DeliverBatch, what is ready at that moment),
// and reads ids named by ranges, which the client sends for runs of
// consecutive ids. The client reads the connection in chunks of up to 1 MiB,
// as much as has arrived with each system call, and decodes the frames where
// they lie, without an allocation per message: Key, Value and header values
// are slices of that memory, which is never written again while anything
// references it (the client reuses it once the garbage collector finds it
// unreferenced). With Config.Batches the messages of the frames read
// together arrive as one Batch on Batches, and Batch.Ack (or Nack, NackWith,
// or Touch) settles the whole batch in one call, one frame on the wire:
//
//	c, err := client.Dial(ctx, client.Config{Addrs: addrs, MaxInFlight: 1000, Batches: true})
//	...
//	for b := range c.Batches() {
//		for _, m := range b.Messages {
//			process(m.Value)
//		}
//		if err := b.Ack(); err != nil {
//			log.Print(err)
//		}
//	}
//
// Delivery policies (docs/delivery.md in the daemon's repository): a
// worker that should retry later gives the message back with a delay, and
// may say why (the reason reaches the daemon's log and, once the message
// has failed the daemon's --max-attempts, its dead-letter record):
//
//	if err := process(m.Value); err != nil {
//		m.NackWith(30*time.Second, err.Error()) // or m.NackWithDelay(30 * time.Second)
//		continue
//	}
//	m.Ack()
//
// Config.Weight makes a client a canary (weight 5 gets 5 messages for every
// 100 a client of the default weight gets), and
// Config.Observe an observer that receives a copy of every delivery
// (Message.Observed; Ack, Nack and Touch do nothing on a copy).
//
// In spread mode the members of the cluster share the topic's partitions
// and each delivers only its own, so the client keeps one session per
// member, merged into Messages. It needs one address to start from: the
// daemon's Welcome lists the members (protocol capability
// CAPABILITY_MEMBERS), and a Members frame lists them again when they
// change. The client then
//
//   - opens a session with each member listed, at the address listed, and
//     reconnects to each on its own, with backoff;
//   - splits MaxInFlight: each session asks for MaxInFlight / members,
//     rounded down, at least 1, and a session whose share changes with the
//     membership is opened again with the new share;
//   - closes the sessions of members no longer listed (they own no
//     partitions);
//   - with no members listed (leader mode), keeps one session, to the
//     leader, with all of MaxInFlight: exactly what it does without
//     spread mode.
//
// A session is closed, or opened again, without losing work and without
// duplicates: it passes no more deliveries on (the daemon delivers them
// again once it has gone), waits for the messages it passed on to be acked
// or nacked (at most the daemon's ack timeout), sends those acks, then says
// goodbye. A message's Ack, Nack and Touch go to the session it came by
// (Message.Member names its daemon); on a session that has ended they
// return ErrStale, and the daemon delivers the message again. Members lists
// the members followed: the latest list received, from whichever member.
// Members that have not yet seen a change may briefly send an older list;
// the client converges as each sends the new one.
//
// # Go version
//
// The client is a Go module of its own, github.com/nanoservice/core-fanout/client,
// with the protocol package inside, and needs Go 1.23 or newer: the oldest
// Go that google.golang.org/protobuf supports. It stays there so that an
// application on Go 1.23 can import it, because a module's go directive is
// a minimum for every module built from it (go mod tidy raises an
// application's go line to the highest one it builds from). Hence the rules
// for changing this module, its tests included: nothing newer than Go 1.23
// (no testing/synctest, T.Context or B.Loop; the compiler refuses a newer
// language feature, go vet's stdversion check a newer API of the standard
// library), no go directive above 1.23, and no import of the daemon's
// module (its tests keep their own small helpers). TestImportableFromOlderGo
// checks the API and builds an application on Go 1.23 against the module.
package client
