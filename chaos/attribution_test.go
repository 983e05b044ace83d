package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// dlog is a daemon's delivery log under construction.
type dlog []deliverylog.Event

func (l *dlog) add(ms int, kind deliverylog.Kind, p int32, o int64, id uint64, attempt uint32, session uint64, detail, client string) {
	*l = append(*l, deliverylog.Event{At: at(ms), Kind: kind, Partition: p, Offset: o, ID: id, Attempt: attempt,
		Session: session, Detail: detail, Client: client})
}

// deliver logs a delivery of 0/0 and returns the client's log line of it.
func (l *dlog) deliver(ms int, id uint64, attempt uint32, session uint64, client string, member string) Event {
	l.add(ms, deliverylog.Deliver, 0, 0, id, attempt, session, "", client)
	e := ev(ms+1, EventDeliver, client, id, 0, 0)
	e.Attempt, e.DeliveryID, e.Member = int(attempt), id, member
	return e
}

// outcome logs the outcome of delivery id of 0/0.
func (l *dlog) outcome(ms int, kind deliverylog.Kind, id uint64, attempt uint32, session uint64, detail, client string) {
	l.add(ms, kind, 0, 0, id, attempt, session, detail, client)
}

func (l *dlog) partition(ms int, kind deliverylog.Kind, detail string) {
	l.add(ms, kind, -1, -1, 0, 0, 0, detail, "")
}

// healthy is one record, not poison, of a run with MaxAttempts 5 whose
// leader is d2 (member "m2").
func healthy() Input {
	recs := records(0, 1)
	recs[0].Value = "1"
	return Input{Records: recs, AckTimeout: 5 * time.Second, Liveness: 2 * time.Second, Topic: "t", MaxAttempts: 5,
		Members: map[string]string{"m0": "d0", "m1": "d1", "m2": "d2"}}
}

// The seed-262474 defect as the leader's delivery log shows it: attempt 1
// held by the silent client while the leader was stopped, then four
// deliveries in milliseconds to connections its clients had closed
// meanwhile, each counted. The stop hit the holder of attempt 1 while it
// held it; it excuses that failure only.
func TestVerifyFailsAHealthyRecordBouncedWhileTheLeaderWasStoppedAsItsLogShows(t *testing.T) {
	in := healthy()
	in.Faults = []Fault{{Kind: FaultDaemonStop, Target: "d2", Leader: true, Start: at(2000), End: at(4450)}}
	var l dlog
	l.partition(0, deliverylog.Start, "all-partitions")
	in.Events = append(in.Events, l.deliver(1000, 100, 1, 1, "silent.1", "m2"))
	l.outcome(4460, deliverylog.Gone, 100, 1, 1, deliverylog.Counted, "silent.1")
	for i, c := range []string{"c0.1", "c1.1", "c2.1", "nacker.1"} {
		id, a, sess := uint64(101+i), uint32(2+i), uint64(2+i)
		l.add(4461+i, deliverylog.Deliver, 0, 0, id, a, sess, "", c)
		l.outcome(4461+i, deliverylog.Gone, id, a, sess, deliverylog.Counted, c)
	}
	l.add(4470, deliverylog.DeadLetter, 0, 0, 0, 5, 0, "", "")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	in.DeadLetters = []DeadLetter{{At: at(4500), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}
	res := Verify(in, true)
	if res.Passed() || res.DeadLetterWrong != 1 || !strings.Contains(res.DeadLetterWrongAt[0], "attempt 2 by d2 to c0.1") {
		t.Fatalf("passed %v, wrong dead letters %v", res.Passed(), res.DeadLetterWrongAt)
	}
	if res.Failures[faultCause(FaultDaemonStop)] != 1 || res.Failures[causeUnexplained] != 4 {
		t.Fatalf("failures %v, want attempt 1's excused by the stop and the four others unexplained", res.Failures)
	}

	// The daemon as it is now: the bounces do not count (within the
	// liveness window of the last counted disconnect), and a live client
	// acks the record.
	l = l[:3]
	for i, c := range []string{"c0.1", "c1.1"} {
		id, sess := uint64(101+i), uint64(2+i)
		l.add(4461+i, deliverylog.Deliver, 0, 0, id, 2, sess, "", c)
		l.outcome(4461+i, deliverylog.Gone, id, 2, sess, deliverylog.UncountedWindow, c)
	}
	in.Events = append(in.Events, l.deliver(5000, 103, 2, 9, "c2.2", "m2"), ev(5010, EventAck, "c2.2", 103, 0, 0))
	l.outcome(5011, deliverylog.Ack, 103, 2, 9, "", "c2.2")
	in.Deliveries, in.DeadLetters = map[string][]deliverylog.Event{"d2": l}, nil
	res = Verify(in, true)
	if !res.Passed() || res.Failures[faultCause(FaultDaemonStop)] != 1 || res.NotCounted[deliverylog.UncountedWindow] != 2 ||
		res.Duplicates[faultCause(FaultDaemonStop)] != 1 {
		t.Fatalf("passed %v, failures %v, not counted %v, duplicates %v: want the stop's one failure and duplicate, two not counted; unexplained %v",
			res.Passed(), res.Failures, res.NotCounted, res.Duplicates, res.UnexplainedFailures)
	}
}

// One logged nack, then four failures of connections to clients that no
// fault hit: the kill of another client excuses none of them. Each of the
// same five attempts failing for a cause of its own passes.
func TestVerifyExcusesEachFailureOfADeadLetteredRecordByItsOwnHolder(t *testing.T) {
	in := healthy()
	var l dlog
	l.partition(0, deliverylog.Start, "all-partitions")
	in.Events = append(in.Events, l.deliver(1000, 100, 1, 1, "nacker.1", "m2"), ev(1050, EventNack, "nacker.1", 100, 0, 0))
	l.outcome(1051, deliverylog.Nack, 100, 1, 1, deliverylog.Counted, "nacker.1")
	for i := range 4 {
		id, a := uint64(101+i), uint32(2+i)
		in.Events = append(in.Events, l.deliver(1100+100*i, id, a, 2, "c0.1", "m2"))
		l.outcome(1150+100*i, deliverylog.Gone, id, a, 2, deliverylog.Counted, "c0.1")
	}
	l.add(1500, deliverylog.DeadLetter, 0, 0, 0, 5, 0, "", "")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	in.DeadLetters = []DeadLetter{{At: at(1600), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}
	in.Faults = []Fault{{Kind: FaultClientKill, Target: "c1", Start: at(1100), End: at(1600)}}
	res := Verify(in, true)
	if res.Passed() || res.DeadLetterWrong != 1 || !strings.Contains(res.DeadLetterWrongAt[0], "attempt 2 by d2 to c0.1") ||
		res.Failures[causeNack] != 1 || res.Failures[causeUnexplained] != 4 {
		t.Fatalf("passed %v, wrong %v, failures %v", res.Passed(), res.DeadLetterWrongAt, res.Failures)
	}

	// Attempt 2: its client killed; 3: nacked; 4: held by the silent client
	// past the ack timeout; 5: its daemon cut from its clients.
	l = l[:3]
	in.Events = in.Events[:2]
	in.Events = append(in.Events, l.deliver(1100, 101, 2, 2, "c0.1", "m2"))
	l.outcome(1150, deliverylog.Gone, 101, 2, 2, deliverylog.Counted, "c0.1")
	in.Events = append(in.Events, l.deliver(1200, 102, 3, 3, "nacker.1", "m2"), ev(1250, EventNack, "nacker.1", 102, 0, 0))
	l.outcome(1251, deliverylog.Nack, 102, 3, 3, deliverylog.Counted, "nacker.1")
	in.Events = append(in.Events, l.deliver(1300, 103, 4, 4, "silent.1", "m2"))
	l.outcome(6300, deliverylog.Timeout, 103, 4, 4, deliverylog.Counted, "silent.1")
	in.Events = append(in.Events, l.deliver(6400, 104, 5, 5, "c1.2", "m2"))
	l.outcome(6500, deliverylog.Gone, 104, 5, 5, deliverylog.Counted, "c1.2")
	l.add(6510, deliverylog.DeadLetter, 0, 0, 0, 5, 0, "", "")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	in.DeadLetters = []DeadLetter{{At: at(6600), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}
	in.Faults = []Fault{{Kind: FaultClientKill, Target: "c0", Start: at(1140), End: at(2000)},
		{Kind: FaultCutClients, Target: "d2", Start: at(6450), End: at(7000)}}
	res = Verify(in, true)
	want := map[string]int{causeNack: 2, causeTimeout: 1, faultCause(FaultClientKill): 1, faultCause(FaultCutClients): 1, causeUnexplained: 0}
	for c, n := range want {
		if res.Failures[c] != n {
			t.Errorf("failures %s: %d, want %d (all %v)", c, res.Failures[c], n, res.Failures)
		}
	}
	if !res.Passed() || res.DeadLetteredHealthy != 1 {
		t.Fatalf("passed %v, wrong %v, healthy dead-lettered %d", res.Passed(), res.DeadLetterWrongAt, res.DeadLetteredHealthy)
	}
}

// A fault excuses one failure of a record: the same client stop cannot
// excuse two of its timeouts.
func TestVerifyExcusesOneFailureOfARecordPerFault(t *testing.T) {
	in := healthy()
	in.Faults = []Fault{{Kind: FaultClientStop, Target: "c0", Start: at(900), End: at(12_000)}}
	var l dlog
	l.partition(0, deliverylog.Start, "all-partitions")
	// Acked in time, but the stopped client's acks never left it.
	in.Events = append(in.Events, l.deliver(1000, 100, 1, 1, "c0.1", "m2"), ev(1005, EventAck, "c0.1", 100, 0, 0))
	l.outcome(6000, deliverylog.Timeout, 100, 1, 1, deliverylog.Counted, "c0.1")
	in.Events = append(in.Events, l.deliver(6001, 101, 2, 1, "c0.1", "m2"), ev(6005, EventAck, "c0.1", 101, 0, 0))
	l.outcome(11_001, deliverylog.Timeout, 101, 2, 1, deliverylog.Counted, "c0.1")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	res := Verify(in, true)
	if res.Failures[faultCause(FaultClientStop)] != 1 || res.Failures[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("failures %v (passed %v), want one excused by the stop and one not", res.Failures, res.Passed())
	}
}

// A failure the daemon counted that its client did not cause, with no
// fault of its holder, fails the run even when the record is acked later:
// a nack no client sent, an ack timeout cut short.
func TestVerifyFindsAFailureNoClientCaused(t *testing.T) {
	for name, fail := range map[string]func(l *dlog){
		"a nack no client sent": func(l *dlog) { l.outcome(1100, deliverylog.Nack, 100, 1, 1, deliverylog.Counted, "c0.1") },
		"a timeout before the ack timeout": func(l *dlog) {
			l.outcome(3000, deliverylog.Timeout, 100, 1, 1, deliverylog.Counted, "c0.1")
		},
	} {
		in := healthy()
		var l dlog
		l.partition(0, deliverylog.Start, "all-partitions")
		in.Events = append(in.Events, l.deliver(1000, 100, 1, 1, "c0.1", "m2"))
		fail(&l)
		in.Events = append(in.Events, l.deliver(3500, 101, 2, 2, "c1.1", "m2"), ev(3510, EventAck, "c1.1", 101, 0, 0))
		l.outcome(3511, deliverylog.Ack, 101, 2, 2, "", "c1.1")
		in.Deliveries = map[string][]deliverylog.Event{"d2": l}
		res := Verify(in, true)
		if res.Failures[causeUnexplained] != 1 || len(res.UnexplainedFailures) != 1 || res.Passed() {
			t.Errorf("%s: failures %v %v (passed %v), want one unexplained", name, res.Failures, res.UnexplainedFailures, res.Passed())
		}
	}
}

// A record acked and delivered again is explained by the end of what served
// it: a fault of the daemon that held the ack, or in spread mode its
// partition handed over; never by what served it going on.
func TestVerifyExplainsAReplayByTheEndOfWhatServedIt(t *testing.T) {
	build := func(spread bool, ended deliverylog.Kind, detail string) Input {
		in := healthy()
		var d2, d1 dlog
		start, serves := 0, "all-partitions"
		if spread {
			serves = "assigned-partitions"
		}
		d2.partition(start, deliverylog.Start, serves)
		d1.partition(start, deliverylog.Start, serves)
		if spread {
			d2.add(10, deliverylog.Assign, 0, -1, 0, 0, 0, "", "")
		}
		in.Events = append(in.Events, d2.deliver(1000, 100, 1, 1, "c0.1", "m2"), ev(1010, EventAck, "c0.1", 100, 0, 0))
		d2.outcome(1011, deliverylog.Ack, 100, 1, 1, "", "c0.1")
		if ended != 0 {
			d2.add(2000, ended, 0, -1, 0, 0, 0, detail, "")
		}
		if spread {
			d1.add(2100, deliverylog.Assign, 0, -1, 0, 0, 0, "", "")
		}
		in.Events = append(in.Events, d1.deliver(3000, 200, 1, 1, "c1.1", "m1"), ev(3010, EventAck, "c1.1", 200, 0, 0))
		d1.outcome(3011, deliverylog.Ack, 200, 1, 1, "", "c1.1")
		in.Deliveries = map[string][]deliverylog.Event{"d2": d2, "d1": d1}
		return in
	}
	for _, tc := range []struct {
		name   string
		spread bool
		ended  deliverylog.Kind
		detail string
		faults []Fault
		want   string
	}{
		{"leader: its daemon killed", false, 0, "", []Fault{{Kind: FaultDaemonKill, Target: "d2", Start: at(1500), End: at(2500)}}, faultCause(FaultDaemonKill)},
		{"leader: its term lost in a ZooKeeper restart", false, deliverylog.Stop, "commits-failing",
			[]Fault{{Kind: FaultZKRestart, Target: "zookeeper", Start: at(1200), End: at(4000)}}, faultCause(FaultZKRestart)},
		{"leader: a follower killed", false, 0, "", []Fault{{Kind: FaultDaemonKill, Target: "d0", Start: at(1500), End: at(2500)}}, causeUnexplained},
		{"leader: partitions added", false, deliverylog.Stop, "drained",
			[]Fault{{Kind: FaultAddPartitions, Target: "t", Start: at(1500), End: at(1600)}}, causeUnexplained},
		{"spread: handed over", true, deliverylog.Revoked, "", nil, causeHandoff},
		{"spread: lost after a cut from ZooKeeper", true, deliverylog.Lost, "lost",
			[]Fault{{Kind: FaultCutZooKeeper, Target: "d2", Start: at(1500), End: at(1900)}}, faultCause(FaultCutZooKeeper)},
		{"spread: never handed over", true, 0, "", nil, causeUnexplained},
	} {
		in := build(tc.spread, tc.ended, tc.detail)
		in.Faults = tc.faults
		res := Verify(in, !tc.spread)
		if res.Duplicates[tc.want] != 1 || (tc.want == causeUnexplained) == res.Passed() {
			t.Errorf("%s: duplicates %v (passed %v), want %s", tc.name, res.Duplicates, res.Passed(), tc.want)
		}
	}

	// The same stretch delivering again what it had acked: unexplained,
	// unless the source restarted the partition below it.
	in := healthy()
	var l dlog
	l.partition(0, deliverylog.Start, "all-partitions")
	in.Events = append(in.Events, l.deliver(1000, 100, 1, 1, "c0.1", "m2"), ev(1010, EventAck, "c0.1", 100, 0, 0))
	l.outcome(1011, deliverylog.Ack, 100, 1, 1, "", "c0.1")
	in.Events = append(in.Events, l.deliver(3000, 101, 1, 2, "c1.1", "m2"), ev(3010, EventAck, "c1.1", 101, 0, 0))
	l.outcome(3011, deliverylog.Ack, 101, 1, 2, "", "c1.1")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	in.Faults = []Fault{{Kind: FaultKafkaRestart, Target: "kafka", Start: at(1500), End: at(2500)}}
	if res := Verify(in, true); res.Duplicates[causeUnexplained] != 1 {
		t.Fatalf("the same term: duplicates %v, want unexplained", res.Duplicates)
	}
	l = append(l[:3:3], deliverylog.Event{At: at(2600), Kind: deliverylog.Restart, Partition: 0, Offset: 0})
	l = append(l, in.Deliveries["d2"][3:]...)
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	if res := Verify(in, true); res.Duplicates[causeRestart] != 1 || !res.Passed() {
		t.Fatalf("restarted below it: duplicates %v (passed %v)", res.Duplicates, res.Passed())
	}
}

// A duplicate after a failure: its client's doing (a nack, no ack in time,
// a goodbye while holding it), or a fault of its holder; and the order is
// the daemons', not the order the clients logged in.
func TestVerifyExplainsADuplicateByTheFailureBeforeIt(t *testing.T) {
	in := healthy()
	var l dlog
	l.partition(0, deliverylog.Start, "all-partitions")
	l.add(0, deliverylog.Join, -1, -1, 0, 0, 3, "", "c2.1")
	// The silent client holds attempt 1 past the ack timeout; stopped, it
	// logs it late, after the redelivery's client did.
	first := l.deliver(1000, 100, 1, 1, "silent.1", "m2")
	first.At = at(6500)
	l.outcome(6000, deliverylog.Timeout, 100, 1, 1, deliverylog.Counted, "silent.1")
	// c2 says goodbye holding attempt 2.
	in.Events = append(in.Events, first, l.deliver(6001, 101, 2, 3, "c2.1", "m2"))
	l.add(6100, deliverylog.Leave, -1, -1, 0, 0, 3, "goodbye", "c2.1")
	l.outcome(6100, deliverylog.Gone, 101, 2, 3, deliverylog.Counted, "c2.1")
	// c0 acks attempt 3, but its connection was cut before the ack left.
	in.Events = append(in.Events, l.deliver(6200, 102, 3, 4, "c0.1", "m2"), ev(6210, EventAck, "c0.1", 102, 0, 0))
	l.outcome(6215, deliverylog.Gone, 102, 3, 4, deliverylog.Counted, "c0.1")
	in.Events = append(in.Events, l.deliver(6300, 103, 4, 5, "c1.1", "m2"), ev(6310, EventAck, "c1.1", 103, 0, 0))
	l.outcome(6311, deliverylog.Ack, 103, 4, 5, "", "c1.1")
	in.Deliveries = map[string][]deliverylog.Event{"d2": l}
	in.Faults = []Fault{{Kind: FaultClientStop, Target: "silent", Start: at(900), End: at(6400)},
		{Kind: FaultCutClients, Target: "d2", Start: at(6212), End: at(7000)}}
	res := Verify(in, true)
	want := map[string]int{causeTimeout: 1, causeClientLeft: 1, faultCause(FaultCutClients): 1, causeUnexplained: 0}
	for c, n := range want {
		if res.Duplicates[c] != n || res.Failures[c] != n {
			t.Errorf("%s: duplicates %d, failures %d, want %d (all %v, %v)", c, res.Duplicates[c], res.Failures[c], n, res.Duplicates, res.Failures)
		}
	}
	if !res.Passed() {
		t.Fatalf("not passed: %v %v", res.Unexplained, res.UnexplainedFailures)
	}
	// Without the cut, the lost ack is unexplained.
	in.Faults = in.Faults[:1]
	if res := Verify(in, true); res.Duplicates[causeUnexplained] != 1 || res.Failures[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("without the cut: duplicates %v, failures %v", res.Duplicates, res.Failures)
	}
}

// A delivery its daemon took back by closing the connection itself (it
// stopped serving the partition: in a ZooKeeper restart, a spread member
// sends its clients away) is delivered again by what serves it next: a
// handoff; while its partition stays with it, nothing explains it.
func TestVerifyExplainsADeliveryTheDaemonTookBackByWhatServesItNext(t *testing.T) {
	in := healthy()
	var l dlog
	l.partition(0, deliverylog.Start, "assigned-partitions")
	l.add(10, deliverylog.Assign, 0, -1, 0, 0, 0, "", "")
	// The client reads, and acks, what was in its socket when the daemon
	// closed it.
	first := l.deliver(1000, 100, 1, 1, "c0.1", "m2")
	l.add(1010, deliverylog.Leave, -1, -1, 0, 0, 1, "shutdown", "c0.1")
	l.outcome(1010, deliverylog.Gone, 100, 1, 1, deliverylog.Uncounted+"shutdown", "c0.1")
	first.At = at(1020)
	in.Events = append(in.Events, first, ev(1030, EventAck, "c0.1", 100, 0, 0))
	handoff := []deliverylog.Event{{At: at(1100), Kind: deliverylog.Revoked, Partition: 0, Offset: 0},
		{At: at(5000), Kind: deliverylog.Assign, Partition: 0, Offset: 0}}
	var next dlog
	in.Events = append(in.Events, next.deliver(5100, 101, 1, 2, "c1.1", "m2"), ev(5110, EventAck, "c1.1", 101, 0, 0))
	next.outcome(5111, deliverylog.Ack, 101, 1, 2, "", "c1.1")
	in.Deliveries = map[string][]deliverylog.Event{"d2": append(append(l, handoff...), next...)}
	res := Verify(in, false)
	if res.Duplicates[causeHandoff] != 1 || res.NotCounted[deliverylog.Uncounted+"shutdown"] != 1 || !res.Passed() {
		t.Fatalf("handed over: duplicates %v, not counted %v (passed %v)", res.Duplicates, res.NotCounted, res.Passed())
	}
	in.Deliveries = map[string][]deliverylog.Event{"d2": append(l, next...)}
	if res := Verify(in, false); res.Duplicates[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("kept: duplicates %v (passed %v), want unexplained", res.Duplicates, res.Passed())
	}
	// Kept, but the daemon closed the connection in a Kafka restart (it
	// sent every client away, one after another, giving what each held to
	// the next): the restart explains it. A fault of another daemon does not.
	in.Faults = []Fault{{Kind: FaultCutKafka, Target: "d0", Start: at(900), End: at(2000)}}
	if res := Verify(in, false); res.Duplicates[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("kept, another daemon cut: duplicates %v (passed %v), want unexplained", res.Duplicates, res.Passed())
	}
	in.Faults = []Fault{{Kind: FaultKafkaRestart, Target: "kafka", Start: at(900), End: at(2000)}}
	if res := Verify(in, false); res.Duplicates[faultCause(FaultKafkaRestart)] != 1 || !res.Passed() {
		t.Fatalf("kept in a Kafka restart: duplicates %v (passed %v), want explained by it", res.Duplicates, res.Passed())
	}
}
