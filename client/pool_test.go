package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// consumeAsync runs c.Consume in the background; the returned channel gets
// its result.
func consumeAsync(ctx context.Context, c *Client, n int, h Handler) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, n, h) }()
	return done
}

// returned waits for Consume's result.
func returned(tb testing.TB, done <-chan error) error {
	tb.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testTimeout):
		tb.Fatal("Consume did not return")
		return nil
	}
}

// The handler's outcome is the ack: nil acks, an error nacks, a panic
// nacks and is logged with its stack; the worker goes on after a panic.
func TestConsumeAcksNacksAndSurvivesPanics(t *testing.T) {
	t.Parallel()
	h := newRecordHandler()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{Logger: slog.New(h)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := consumeAsync(ctx, c, 1, func(_ context.Context, m *Message) error {
		switch string(m.Value) {
		case "fail":
			return errors.New("transient")
		case "panic":
			panic("boom")
		}
		return nil
	})
	fc.deliver(t, 1, "ok")
	fc.deliver(t, 2, "fail")
	fc.deliver(t, 3, "panic")
	fc.deliver(t, 4, "ok")
	var acks, nacks []uint64
	for len(acks)+len(nacks) < 4 {
		f := fc.next(t)
		acks = append(acks, ackIDs(f)...)
		nacks = append(nacks, nackIDs(f)...)
	}
	slices.Sort(acks)
	slices.Sort(nacks)
	if !slices.Equal(acks, []uint64{1, 4}) || !slices.Equal(nacks, []uint64{2, 3}) {
		t.Errorf("acked %v, nacked %v; want [1 4] and [2 3]", acks, nacks)
	}
	rs := h.find("handler panicked: nacking the message")
	if len(rs) != 1 || rs[0].level != slog.LevelError || rs[0].attrs["panic"] != "boom" ||
		!strings.Contains(rs[0].attrs["stack"].(string), "pool_test.go") {
		t.Errorf("panic records = %+v", rs)
	}
	cancel()
	if err := returned(t, done); err != nil {
		t.Errorf("Consume = %v after its ctx ended, want nil", err)
	}
}

// A handler that acks or nacks the message itself is left alone.
func TestConsumeHandlerMayAckItself(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumeAsync(ctx, c, 1, func(_ context.Context, m *Message) error {
		if err := m.Nack(); err != nil {
			return err
		}
		return nil // would ack, but the message is nacked already
	})
	fc.deliver(t, 7, "x")
	if ids, _ := fc.expectIDs(t, 1, nackIDs); ids[0] != 7 {
		t.Fatalf("nacked %v, want [7]", ids)
	}
	fc.deliver(t, 8, "y") // the next frame carries 8's nack: no ack of 7 came between
	f := fc.next(t)
	if !slices.Equal(nackIDs(f), []uint64{8}) {
		t.Fatalf("after the nack of 7, got %v, want the nack of 8", f)
	}
}

// Consume runs at most concurrency handlers at once, and that many when
// there is work for them.
func TestConsumeConcurrency(t *testing.T) {
	t.Parallel()
	const workers = 4
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{MaxInFlight: 16})
	var running, peak atomic.Int32
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := consumeAsync(ctx, c, workers, func(context.Context, *Message) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		return nil
	})
	for i := uint64(1); i <= 10; i++ {
		fc.deliver(t, i, "x")
	}
	waitFor(t, testTimeout, "every worker to run a handler", func() bool { return running.Load() == workers })
	close(release)
	fc.expectIDs(t, 10, ackIDs)
	if p := peak.Load(); p != workers {
		t.Errorf("at most %d handlers ran at once, want %d", p, workers)
	}
	cancel()
	returned(t, done)
}

func TestConsumeRefusesBadArguments(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, _, _ := connectTo(t, d, Config{})
	if err := c.Consume(context.Background(), 0, func(context.Context, *Message) error { return nil }); err == nil {
		t.Error("Consume with concurrency 0 did not fail")
	}
	if err := c.Consume(context.Background(), 1, nil); err == nil {
		t.Error("Consume with a nil handler did not fail")
	}
}

// Consume returns when the client is closed, and the handlers' context
// ends with it.
func TestConsumeEndsWithClose(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	started := make(chan struct{})
	done := consumeAsync(context.Background(), c, 2, func(ctx context.Context, _ *Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	fc.deliver(t, 1, "x")
	<-started
	go func() { _ = c.Close() }()
	if err := returned(t, done); err != nil {
		t.Errorf("Consume = %v after Close, want nil", err)
	}
}

// A handler's error is the nack's reason; RetryAfter's delay is the nack's.
func TestConsumeNackDelayAndReason(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumeAsync(ctx, c, 1, func(_ context.Context, m *Message) error {
		if string(m.Value) == "transient" {
			return RetryAfter(3*time.Second, errors.New("downstream: 503"))
		}
		return errors.New("cannot parse")
	})
	fc.deliver(t, 1, "transient")
	fc.deliver(t, 2, "poison")
	got := map[uint64]string{}
	for len(got) < 2 {
		if n := fc.next(t).GetNack(); n != nil {
			for _, id := range n.GetDeliveryIds() {
				got[id] = fmt.Sprintf("%d ms %q", n.GetDelayMs(), n.GetReason())
			}
		}
	}
	if got[1] != `3000 ms "downstream: 503"` || got[2] != `0 ms "cannot parse"` {
		t.Errorf("nacks = %v", got)
	}
	if err := RetryAfter(time.Second, io.EOF); !errors.Is(err, io.EOF) || err.Error() != io.EOF.Error() {
		t.Errorf("RetryAfter(1s, EOF) = %v: want it to wrap EOF and read as it", err)
	}
}
