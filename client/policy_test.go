package client

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// Weight and Observe go in the Hello; a client that sets neither sends the
// Hello it always sent (TestHelloFields).
func TestHelloPolicyFields(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	_, _, h := connectTo(t, d, Config{Weight: 5})
	if h.GetWeight() != 5 || h.GetObserver() {
		t.Fatalf("hello = %v, want weight 5, not an observer", h)
	}
	if _, err := (Config{Addrs: []string{"x:1"}, Weight: -1}).withDefaults(); err == nil {
		t.Fatal("a negative Weight was accepted")
	}
}

// NackWithDelay and NackWith send the delay and the reason; nacks of the
// same pair share a frame, plain nacks keep theirs.
func TestNackWithDelayAndReason(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	c, fc, _ := connectTo(t, d, Config{})
	for id := uint64(1); id <= 4; id++ {
		fc.deliver(t, id, "x")
	}
	msgs := []*Message{receive(t, c), receive(t, c), receive(t, c), receive(t, c)}
	for i, call := range []func(*Message) error{
		func(m *Message) error { return m.NackWithDelay(1500 * time.Millisecond) },
		func(m *Message) error { return m.NackWithDelay(1500 * time.Millisecond) },
		func(m *Message) error { return m.NackWith(0, "db down") },
		(*Message).Nack,
	} {
		if err := call(msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	type nack struct {
		ids    []uint64
		delay  uint32
		reason string
	}
	var got []nack
	for n := 0; n < 4; {
		f := fc.next(t).GetNack()
		if f == nil {
			continue
		}
		got = append(got, nack{f.GetDeliveryIds(), f.GetDelayMs(), f.GetReason()})
		n += len(f.GetDeliveryIds())
	}
	var delayed, reasoned, plain []uint64
	for _, n := range got {
		switch {
		case n.delay == 1500 && n.reason == "":
			delayed = append(delayed, n.ids...)
		case n.delay == 0 && n.reason == "db down":
			reasoned = append(reasoned, n.ids...)
		case n.delay == 0 && n.reason == "":
			plain = append(plain, n.ids...)
		default:
			t.Fatalf("unexpected nack %+v", n)
		}
	}
	slices.Sort(delayed)
	if !slices.Equal(delayed, []uint64{1, 2}) || !slices.Equal(reasoned, []uint64{3}) || !slices.Equal(plain, []uint64{4}) {
		t.Fatalf("nacks %+v: want 1 and 2 delayed 1500ms, 3 with its reason, 4 plain", got)
	}
	if err := msgs[0].NackWithDelay(time.Second); !errors.Is(err, ErrAlreadyAcked) {
		t.Fatalf("second nack: %v, want ErrAlreadyAcked", err)
	}
}

// An observer announces itself, accepts only a daemon that confirms it,
// and acks nothing: Ack, Nack and Touch of its copies send nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}, Observe: true})
	fc := d.accept(t)
	if h := fc.expectHello(t); !h.GetObserver() {
		t.Fatalf("hello %v: want observer", h)
	}
	w := testWelcome()
	w.Observer = true
	fc.send(t, protocol.WelcomeFrame(w))
	c := connected(t, ch)
	fc.send(t, protocol.DeliverFrame(&protocol.Deliver{Partition: 1, Offset: 9, Value: []byte("v"), Attempt: 2}))
	m := receive(t, c)
	if !m.Observed || m.Offset != 9 || m.Attempt != 2 {
		t.Fatalf("message %+v: want an observed copy of 1/9, attempt 2", m)
	}
	for _, call := range []func() error{m.Ack, m.Nack, m.Touch, func() error { return m.NackWithDelay(time.Second) }} {
		if err := call(); err != nil {
			t.Fatalf("on an observed copy: %v, want nil", err)
		}
	}
	fc.send(t, protocol.PingFrame(5)) // the next frame the client sends is the Pong: nothing before it
	if f := fc.next(t); f.GetPong() == nil {
		t.Fatalf("the client sent %v for an observed copy", f)
	}
}

// A daemon that does not confirm observers (an older one) stops the client
// An observer's batches are copies too: Ack, Nack and Touch of a Batch
// send nothing.
func TestObserverBatches(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	ch := dialAsync(t, Config{Addrs: []string{d.addr()}, Observe: true, Batches: true})
	fc := d.accept(t)
	fc.expectHello(t)
	w := testWelcome()
	w.Observer = true
	w.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	fc.send(t, protocol.WelcomeFrame(w))
	c := connected(t, ch)
	fc.send(t, protocol.DeliverBatchFrame([]*protocol.Deliver{
		{Partition: 1, Offset: 9, Value: []byte("v"), Attempt: 1},
		{Partition: 1, Offset: 10, Value: []byte("w"), Attempt: 1},
	}))
	var b *Batch
	select {
	case b = <-c.Batches():
	case <-time.After(testTimeout):
		t.Fatal("no batch")
	}
	for _, m := range b.Messages {
		if !m.Observed {
			t.Fatalf("message %+v of an observer's batch: want an observed copy", m)
		}
	}
	for _, call := range []func() error{b.Ack, b.Nack, b.Touch} {
		if err := call(); err != nil {
			t.Fatalf("on an observed batch: %v, want nil", err)
		}
	}
	fc.send(t, protocol.PingFrame(5)) // the next frame the client sends is the Pong: nothing before it
	if f := fc.next(t); f.GetPong() == nil {
		t.Fatalf("the client sent %v for an observed batch", f)
	}
}

// at once: it would hand the observer work to ack.
func TestObserverRefusesADaemonWithout(t *testing.T) {
	t.Parallel()
	d := startFake(t)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		c, err := Dial(ctx, testConfig(Config{Addrs: []string{d.addr()}, Observe: true}))
		if err == nil {
			_ = c.Close()
		}
		errc <- err
	}()
	fc := d.accept(t)
	fc.handshake(t)
	if err := <-errc; !errors.Is(err, ErrNoObservers) {
		t.Fatalf("Dial = %v, want ErrNoObservers", err)
	}
}
