package chaos

import (
	"strings"
	"testing"
	"time"
)

// A record nacked with a delay comes again no sooner than the delay after
// the nack, failovers and handoffs included: the daemons store the delay
// with the offsets. Only a fault that could lose it excuses an early
// redelivery: one of the daemon that held the nack, around the nack (until
// its next commit could store the delay), a server restart then, or a fault
// of the nacking client itself (its nack may never have been sent).
func TestCheckDelayedNacks(t *testing.T) {
	const delay = 10 * time.Second
	// nackedThenAgain is record 0/0 delivered by daemon d0 (member "m") to
	// the nacker at 0, nacked at 200 ms, delivered again to c0 at againMS.
	nackedThenAgain := func(againMS int, faults ...Fault) Input {
		return Input{Records: records(0, 1), AckTimeout: 5 * time.Second, Faults: faults,
			Members: map[string]string{"m": "d0"}, NackDelays: map[string]time.Duration{"nacker": delay},
			Events: []Event{
				ev(0, EventDeliver, "nacker.1", 1, 0, 0), ev(200, EventNack, "nacker.1", 1, 0, 0),
				withAttempt(ev(againMS, EventDeliver, "c0.1", 1, 0, 0), 2), ev(againMS+10, EventAck, "c0.1", 1, 0, 0),
			}}
	}
	fault := func(kind, target string, startMS, endMS int) Fault {
		return Fault{Kind: kind, Target: target, Start: at(startMS), End: at(endMS)}
	}
	for _, tc := range []struct {
		name  string
		in    Input
		early int
	}{
		{"after its delay", nackedThenAgain(10_300), 0},
		{"before its delay, no fault", nackedThenAgain(5000), 1},
		{"its daemon killed before the delay could be stored", nackedThenAgain(5000, fault(FaultDaemonKill, "d0", 900, 2000)), 0},
		{"its daemon cut from ZooKeeper since before the nack", nackedThenAgain(5000, fault(FaultCutZooKeeper, "d0", -3000, 1000)), 0},
		{"its daemon killed once the delay was stored", nackedThenAgain(8000, fault(FaultDaemonKill, "d0", 6000, 7000)), 1},
		{"another daemon killed", nackedThenAgain(5000, fault(FaultDaemonKill, "d1", 300, 1000)), 1},
		{"ZooKeeper restarted", nackedThenAgain(5000, fault(FaultZKRestart, "zookeeper", 1000, 3000)), 0},
		{"the nacking client killed: its nack may not have gone", nackedThenAgain(5000, fault(FaultClientKill, "nacker", 250, 500)), 0},
		{"another client killed", nackedThenAgain(5000, fault(FaultClientKill, "c1", 250, 500)), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Verify(tc.in, true)
			if res.EarlyNackRedeliveries != tc.early || len(res.EarlyNackRedeliveriesAt) != tc.early {
				t.Fatalf("early redeliveries %d %q, want %d", res.EarlyNackRedeliveries, res.EarlyNackRedeliveriesAt, tc.early)
			}
			if tc.early > 0 && (res.Passed() || !strings.HasPrefix(res.EarlyNackRedeliveriesAt[0], "0/0: ")) {
				t.Fatalf("passed %v with %q", res.Passed(), res.EarlyNackRedeliveriesAt)
			}
		})
	}
	// Not judged: a nack logged after the daemon could have timed the
	// delivery out (it redelivers without the nack's delay), a delivery
	// logged before the nack, one of an attempt that is not later (a
	// stopped client that logs late what it was sent before the nack), a
	// client whose nacks ask for no delay.
	in := nackedThenAgain(5000)
	in.Events[1].At = at(4600)
	if res := Verify(in, true); res.EarlyNackRedeliveries != 0 {
		t.Errorf("a nack after 90%% of the ack timeout: %d early", res.EarlyNackRedeliveries)
	}
	in = nackedThenAgain(150)
	if res := Verify(in, true); res.EarlyNackRedeliveries != 0 {
		t.Errorf("a delivery logged before the nack: %d early", res.EarlyNackRedeliveries)
	}
	in = nackedThenAgain(5000)
	in.Events[2].Attempt = 1
	if res := Verify(in, true); res.EarlyNackRedeliveries != 0 {
		t.Errorf("a delivery of the same attempt logged after the nack: %d early", res.EarlyNackRedeliveries)
	}
	in = nackedThenAgain(5000)
	in.NackDelays = nil
	if res := Verify(in, true); res.EarlyNackRedeliveries != 0 {
		t.Errorf("no delay asked: %d early", res.EarlyNackRedeliveries)
	}
}

// withAttempt returns e with attempt a.
func withAttempt(e Event, a int) Event {
	e.Attempt = a
	return e
}
