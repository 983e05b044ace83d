package client

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// shutdownAsync runs c.Shutdown in the background with a timeout; the
// returned channel gets its result.
func shutdownAsync(c *Client, timeout time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- c.Shutdown(ctx)
	}()
	return done
}

// Shutdown takes no new message, nacks those nobody received, lets the
// running handler finish and ack, and only then says goodbye.
func TestShutdownLetsHandlersFinish(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	started, release := make(chan uint64, 10), make(chan struct{})
	var handled []uint64
	consumed := consumeAsync(context.Background(), c, 1, func(ctx context.Context, m *Message) error {
		handled = append(handled, m.DeliveryID)
		started <- m.DeliveryID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	for i := uint64(1); i <= 3; i++ {
		fc.deliver(t, i, "x")
	}
	if id := <-started; id != 1 {
		t.Fatalf("first handled %d, want 1", id)
	}
	fc.sync(t) // 2 and 3 wait in Messages
	shut := shutdownAsync(c, testTimeout)
	// The waiting messages are nacked, flagged unprocessed (nobody received
	// them: not a failed attempt); the running one is not.
	unprocessed := true
	ids, _ := fc.expectIDs(t, 2, func(f *protocol.Frame) []uint64 {
		if n := f.GetNack(); n != nil {
			unprocessed = unprocessed && n.GetUnprocessed()
			return n.GetDeliveryIds()
		}
		return nil
	})
	if !slices.Equal(ids, []uint64{2, 3}) || !unprocessed {
		t.Fatalf("nacked %v (unprocessed %v), want [2 3] unprocessed", ids, unprocessed)
	}
	fc.deliver(t, 4, "late") // dropped: the daemon delivers it again after the Goodbye
	fc.sync(t)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v while a handler runs", err)
	default:
	}
	close(release)
	if acked := fc.expectGoodbye(t); !slices.Equal(acked, []uint64{1}) {
		t.Errorf("acked %v before the Goodbye, want [1]", acked)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown = %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Shutdown did not return")
	}
	if err := returned(t, consumed); err != nil {
		t.Errorf("Consume = %v after Shutdown", err)
	}
	if !slices.Equal(handled, []uint64{1}) {
		t.Errorf("handled %v, want [1]", handled)
	}
	if _, ok := <-c.Messages(); ok {
		t.Error("Messages is open after Shutdown")
	}
}

// At its deadline Shutdown closes at once: the handler's context ends and
// its ack is not sent; the daemon delivers the message again.
func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	started, ackErr := make(chan struct{}), make(chan error, 1)
	consumed := consumeAsync(context.Background(), c, 1, func(ctx context.Context, m *Message) error {
		close(started)
		<-ctx.Done() // a handler that finishes only when told to
		ackErr <- m.Ack()
		return nil
	})
	fc.deliver(t, 1, "x")
	<-started
	err := <-shutdownAsync(c, 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want it to wrap DeadlineExceeded", err)
	}
	// The handler's ack races the Goodbye: sent before it when queued
	// first, else refused, never lost silently.
	acked := fc.expectGoodbye(t)
	switch err := <-ackErr; {
	case err == nil && !slices.Equal(acked, []uint64{1}):
		t.Errorf("Ack returned nil, but the daemon got acks %v before the Goodbye", acked)
	case err != nil && (len(acked) != 0 || !errors.Is(err, ErrClosed) && !errors.Is(err, ErrStale)):
		t.Errorf("Ack after the deadline = %v, acks %v before the Goodbye; want ErrClosed or ErrStale and none", err, acked)
	}
	returned(t, consumed)
}

// In spread mode every member's session finishes its work and says goodbye,
// and no session is opened again.
func TestShutdownSpread(t *testing.T) {
	t.Parallel()
	a, b := startFake(t), startFake(t)
	c, conns := spread(t, 8, a, b)
	fa, fb := conns[a.addr()], conns[b.addr()]
	fb.deliver(t, 1, "from b")
	m := receive(t, c)
	shut := shutdownAsync(c, testTimeout)
	if acked := fa.expectGoodbye(t); len(acked) != 0 {
		t.Errorf("a: acked %v", acked)
	}
	fb.sync(t)
	if err := m.Ack(); err != nil {
		t.Fatalf("Ack during Shutdown = %v", err)
	}
	if acked := fb.expectGoodbye(t); !slices.Equal(acked, []uint64{1}) {
		t.Errorf("b: acked %v before the Goodbye, want [1]", acked)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	for _, d := range []*fakeDaemon{a, b} {
		select {
		case fc := <-d.conns:
			t.Errorf("%s: the client connected again after Shutdown: %v", d.addr(), fc.nc.RemoteAddr())
		default:
		}
	}
}

// A message nacked with a delay or a reason is done: Shutdown does not wait
// for it until the daemon's ack timeout.
func TestShutdownAfterNackWith(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	fc.deliver(t, 1, "x")
	if err := receive(t, c).NackWith(time.Minute, "later"); err != nil {
		t.Fatal(err)
	}
	shut := shutdownAsync(c, testTimeout)
	fc.expectGoodbye(t)
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
}
