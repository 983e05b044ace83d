package server

import (
	"runtime"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A Hello's weight reaches the dispatcher through the sink (WeightedSink);
// without one the sink has the default weight.
func TestHelloWeight(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	w := c.hello(&protocol.Hello{ClientId: "canary", ProtocolVersion: protocol.Version, Weight: 5})
	if w.GetObserver() {
		t.Fatal("a worker was welcomed as an observer")
	}
	if ws, ok := s.b.sink(t, w.GetSessionId()).(dispatch.WeightedSink); !ok || ws.Weight() != 5 {
		t.Fatalf("sink %T: want a WeightedSink of weight 5", s.b.sink(t, w.GetSessionId()))
	}
	_, id := connect(t, s)
	if ws := s.b.sink(t, id).(dispatch.WeightedSink); ws.Weight() != protocol.DefaultWeight {
		t.Fatalf("weight %d without one in the Hello, want %d", ws.Weight(), protocol.DefaultWeight)
	}
}

// A Nack's delay, reason and unprocessed flag reach the dispatcher; a delay
// above the longest is cut to it.
func TestNackDelayAndReasonPassedOn(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c, id := connect(t, s)
	c.send(protocol.NackWithFrame([]uint64{7}, 1500*time.Millisecond, "db down"))
	got := s.b.waitCall(t, "nack", id)
	if got.nack.Delay != 1500*time.Millisecond || got.nack.Reason != "db down" {
		t.Fatalf("nack %+v, want 1.5s and the reason", got.nack)
	}
	c.send(protocol.NackWithFrame([]uint64{8}, 0, ""))
	c.send(&protocol.Frame{Body: &protocol.Frame_Nack{Nack: &protocol.Nack{DeliveryIds: []uint64{9}, DelayMs: 1 << 31}}})
	c.send(&protocol.Frame{Body: &protocol.Frame_Nack{Nack: &protocol.Nack{DeliveryIds: []uint64{10}, Unprocessed: true}}})
	testutil.WaitFor(t, testTimeout, "four nacks", func() bool { return len(s.b.find("nack", id)) == 4 })
	nacks := s.b.find("nack", id)
	if nacks[1].nack != (dispatch.NackInfo{}) || nacks[2].nack.Delay != protocol.MaxNackDelay ||
		nacks[3].nack != (dispatch.NackInfo{Unprocessed: true}) {
		t.Fatalf("nacks %+v: want a plain one, one cut to %v, one unprocessed", nacks[1:], protocol.MaxNackDelay)
	}
}

// An observer is welcomed as one and joins the dispatcher by Observe; its
// copies arrive as Deliver frames with delivery id 0.
func TestObserverWelcomed(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	w := c.hello(&protocol.Hello{ClientId: "watch", ProtocolVersion: protocol.Version, Observer: true})
	if !w.GetObserver() {
		t.Fatal("Welcome.observer not set for an observer")
	}
	s.b.waitCall(t, "observe", w.GetSessionId())
	if joins := s.b.find("join", w.GetSessionId()); len(joins) != 0 {
		t.Fatal("an observer joined as a worker")
	}
	sink := s.b.observerSink(t, w.GetSessionId())
	m := testMessage(0, 5, 10)
	sink.Send([]dispatch.Delivery{{Attempt: 2, Msg: m}})
	c.expectDeliver(dispatch.Delivery{Attempt: 2, Msg: m})
}

// An observer that does not read is dropped once its queued copies pass
// MaxObserverBytes, without the sender ever blocking; counted and logged.
func TestObserverBehindDropped(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaxObserverBytes = 64 << 10; c.WriteTimeout = time.Minute })
	c := dial(t, s)
	w := c.hello(&protocol.Hello{ClientId: "slow", ProtocolVersion: protocol.Version, Observer: true})
	sink := s.b.observerSink(t, w.GetSessionId())
	// The client reads nothing: copies pile up in its socket, then in the
	// outbox. Each Send returns at once (the dispatcher's goroutine).
	// Send never waits for the client: with a client that never reads, a
	// Send that blocked would never return.
	m := testMessage(0, 1, 16<<10)
	deadline := time.Now().Add(testTimeout)
	for i := 0; s.b.find("leave", w.GetSessionId()) == nil; i++ {
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			sink.Send([]dispatch.Delivery{{Attempt: 1, Msg: m}})
		}()
		select {
		case <-sent:
		case <-time.After(testTimeout):
			t.Fatalf("Send of copy %d has not returned after %v: it blocks on the client", i, testTimeout)
		}
		if time.Now().After(deadline) {
			t.Fatalf("observer not dropped after %d copies of 16 KiB", i)
		}
		runtime.Gosched()
	}
	leave := s.b.waitCall(t, "leave", w.GetSessionId())
	if leave.reason != dispatch.LeaveSlow {
		t.Fatalf("leave reason %v, want slow", leave.reason)
	}
	if n := s.Stats().Closed[closeObserverBehind]; n != 1 {
		t.Fatalf("closed as observer behind: %d, want 1", n)
	}
	logs := s.closeLogs(w.GetSessionId())
	if len(logs) != 1 || logs[0].Data["reason"] != "observer behind" {
		t.Fatalf("close logs %v", logs)
	}
}

// A client the dispatcher drains reads the Goodbye and the deliveries
// queued before the Disconnect, then the connection closes; the backend is
// told it left as if the daemon closed it (its deliveries unprocessed).
func TestDisconnectAfterGoodbye(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := dial(t, s)
	w := c.hello(nil)
	sink := s.b.sink(t, w.GetSessionId())
	ds, ok := sink.(dispatch.DisconnectSink)
	if !ok {
		t.Fatal("the server's sink is not a dispatch.DisconnectSink")
	}
	sink.Send([]dispatch.Delivery{{ID: 7, Attempt: 1, Msg: testMessage(0, 1, 8)}})
	sink.Goodbye("drained by ops")
	ds.Disconnect("drained")
	if f := c.expect(); f.GetDeliver().GetDeliveryId() != 7 {
		t.Fatalf("got %v, want delivery 7", f)
	}
	if f := c.expect(); f.GetGoodbye().GetReason() != "drained by ops" {
		t.Fatalf("got %v, want the Goodbye", f)
	}
	c.expectClosed()
	if leave := s.b.waitCall(t, "leave", w.GetSessionId()); leave.reason != dispatch.LeaveShutdown {
		t.Fatalf("leave reason %v, want shutdown (the daemon closed it)", leave.reason)
	}
	if n := s.Stats().Closed[closeDrained]; n != 1 {
		t.Fatalf("closed as drained: %d, want 1", n)
	}
	if logs := s.closeLogs(w.GetSessionId()); len(logs) != 1 || logs[0].Data["reason"] != "drained" {
		t.Fatalf("close logs %v", logs)
	}
}
