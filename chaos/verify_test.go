package chaos

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func ev(ms int, kind byte, client string, idx uint64, p int32, o int64) Event {
	return Event{At: at(ms), Kind: kind, Client: client, Index: idx, Partition: p, Offset: o, Attempt: 1, Member: "m", Value: "1"}
}

func records(p int32, n int) []Record {
	var out []Record
	for o := range n {
		out = append(out, Record{Partition: p, Offset: int64(o), At: at(o)})
	}
	return out
}

func TestVerifyCountsARecordNeverAckedAsLost(t *testing.T) {
	in := Input{Records: records(0, 3), AckTimeout: 5 * time.Second, Events: []Event{
		ev(10, EventDeliver, "c0.1", 1, 0, 0), ev(11, EventAck, "c0.1", 1, 0, 0),
		ev(12, EventDeliver, "c0.1", 2, 0, 1), // delivered, never acked
		ev(13, EventDeliver, "c0.1", 3, 0, 2), ev(14, EventAck, "c0.1", 3, 0, 2),
	}}
	in.Sent = append(records(0, 3), Record{Partition: 0, Offset: 3, At: at(20)}) // acknowledged, then gone from Kafka
	res := Verify(in, true)
	if res.Vanished != 1 {
		t.Fatalf("vanished %d, want 1", res.Vanished)
	}
	if res.Lost != 1 || res.Acked != 2 || len(res.LostRecords) != 1 || !strings.HasPrefix(res.LostRecords[0], "0/1 ") {
		t.Fatalf("lost %d acked %d %v, want 0/1 lost", res.Lost, res.Acked, res.LostRecords)
	}
	if res.Passed() {
		t.Fatal("a run that lost a record passed")
	}
}

func TestVerifyExplainsEachRedelivery(t *testing.T) {
	faults := []Fault{
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(1000), End: at(2000)},
		{Kind: FaultClientKill, Target: "c1", Start: at(20_000), End: at(21_000)},
	}
	in := Input{Records: records(0, 5), AckTimeout: 5 * time.Second, Faults: faults, Members: map[string]string{"m": "d2"}, Events: []Event{
		// nacked, then delivered again
		ev(10, EventDeliver, "nacker.1", 1, 0, 0), ev(210, EventNack, "nacker.1", 1, 0, 0),
		ev(220, EventDeliver, "c0.1", 1, 0, 0), ev(230, EventAck, "c0.1", 1, 0, 0),
		// acked before the leader's kill, replayed by the next leader
		ev(500, EventDeliver, "c0.1", 2, 0, 1), ev(510, EventAck, "c0.1", 2, 0, 1),
		ev(3000, EventDeliver, "c0.1", 3, 0, 1), ev(3010, EventAck, "c0.1", 3, 0, 1),
		// held by the silent client past the ack timeout
		ev(4000, EventDeliver, "silent.1", 1, 0, 2),
		// (logged on receipt: the redelivery comes a little less than the timeout after the log line)
		ev(8950, EventDeliver, "c0.1", 4, 0, 2), ev(8960, EventAck, "c0.1", 4, 0, 2),
		// acked by c0, delivered again with no fault, nack or timeout in between
		ev(10_000, EventDeliver, "c0.1", 5, 0, 3), ev(10_010, EventAck, "c0.1", 5, 0, 3),
		ev(12_000, EventDeliver, "c2.1", 1, 0, 3), ev(12_010, EventAck, "c2.1", 1, 0, 3),
		// c0 acked, c1 (not c0) was killed: the kill of another client explains nothing
		ev(19_000, EventDeliver, "c0.1", 6, 0, 4), ev(19_500, EventAck, "c0.1", 6, 0, 4),
		ev(21_500, EventDeliver, "c2.1", 2, 0, 4), ev(21_510, EventAck, "c2.1", 2, 0, 4),
	}}
	// A leader resumed from SIGSTOP at 30 s drops a client whose ack it had not read: acked, delivered again.
	faults = append(faults, Fault{Kind: FaultDaemonStop, Target: "d2", Leader: true, Start: at(28_000), End: at(30_000)},
		Fault{Kind: FaultClientStop, Target: "silent", Start: at(38_000), End: at(40_000)})
	in.Faults = faults
	in.Records = records(0, 7)
	in.Events = append(in.Events,
		ev(30_005, EventDeliver, "c0.1", 7, 0, 5), ev(30_006, EventAck, "c0.1", 7, 0, 5),
		ev(30_020, EventDeliver, "c2.1", 3, 0, 5), ev(30_030, EventAck, "c2.1", 3, 0, 5),
		// the silent client, stopped, logs at 40 s a delivery it was sent before
		ev(39_500, EventDeliver, "c0.1", 8, 0, 6), ev(39_510, EventAck, "c0.1", 8, 0, 6),
		ev(40_001, EventDeliver, "silent.1", 2, 0, 6))
	res := Verify(in, true)
	want := map[string]int{causeNack: 1, faultCause(FaultDaemonKill): 1, faultCause(FaultDaemonStop): 1, faultCause(FaultClientStop): 1, causeTimeout: 1, causeUnexplained: 2}
	for c, n := range want {
		if res.Duplicates[c] != n {
			t.Errorf("duplicates %s: %d, want %d (all %v)", c, res.Duplicates[c], n, res.Duplicates)
		}
	}
	if len(res.Unexplained) != 2 || res.Passed() {
		t.Fatalf("unexplained %v, passed %v", res.Unexplained, res.Passed())
	}
}

func TestVerifyFindsACommittedOffsetPastAnUnackedRecord(t *testing.T) {
	in := Input{Records: records(0, 3), AckTimeout: 5 * time.Second, Events: []Event{
		ev(10, EventDeliver, "c0.1", 1, 0, 0), ev(11, EventAck, "c0.1", 1, 0, 0),
		ev(12, EventDeliver, "c0.1", 2, 0, 1), ev(500, EventAck, "c0.1", 2, 0, 1),
		ev(13, EventDeliver, "c0.1", 3, 0, 2), ev(14, EventAck, "c0.1", 3, 0, 2),
	}, Samples: []OffsetSample{
		{At: at(100), Partition: 0, Offset: 1}, // fine: 0 acked at 11
		{At: at(200), Partition: 0, Offset: 3}, // 1 acked only at 500
		{At: at(600), Partition: 0, Offset: 3}, // fine
		{At: at(700), Partition: 1, Offset: 9}, // a partition without records: nothing to check
	}}
	res := Verify(in, true)
	if res.OffsetViolations != 1 || res.OffsetSamples != 4 || !strings.Contains(res.Violations[0], "committed 3") {
		t.Fatalf("violations %d of %d: %v", res.OffsetViolations, res.OffsetSamples, res.Violations)
	}
	if res.Passed() {
		t.Fatal("a run whose offsets passed an unacked record passed")
	}
}

func TestVerifyMeasuresRecoveryAfterLeaderFaults(t *testing.T) {
	var recs []Record
	var evs []Event
	idx := uint64(0)
	for p := range int32(2) {
		for ms := 0; ms < 10_000; ms += 100 {
			o := int64(ms / 100)
			recs = append(recs, Record{Partition: p, Offset: o, At: at(ms)})
			d := ms + 5
			if ms >= 3000 {
				d = max(d, 5000+int(p)*700) // held up by the failover; partition 1 resumes at 5.7 s
			}
			idx++
			evs = append(evs, ev(d, EventDeliver, "c0.1", idx, p, o), ev(d+1, EventAck, "c0.1", idx, p, o))
		}
	}
	// A client reads late, after the kill, what the dead leader sent before it: not a recovery.
	idx++
	evs = append(evs, ev(3050, EventDeliver, "c1.1", idx, 1, 29), ev(3051, EventAck, "c1.1", idx, 1, 29))
	faults := []Fault{
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(3000), End: at(4000)},
		{Kind: FaultDaemonKill, Target: "d1", Start: at(7000), End: at(8000)}, // not the leader
		{Kind: FaultCutZooKeeper, Target: "d2", Leader: true, Start: at(8000), End: at(8100)},
	}
	res := Verify(Input{Records: recs, Events: evs, Faults: faults, AckTimeout: 5 * time.Second}, true)
	if len(res.Recovery) != 1 || res.Recovery[0] != 2700*time.Millisecond {
		t.Fatalf("recovery %v, want [2.7s]", res.Recovery)
	}
	res = Verify(Input{Records: recs, Events: evs, Faults: faults, AckTimeout: 5 * time.Second}, false)
	if len(res.Recovery) != 2 {
		t.Fatalf("spread mode: recovery %v, want one per member fault", res.Recovery)
	}
	// Nothing delivered after the fault: not recovered.
	res = Verify(Input{Records: recs, Events: evs[:60], Faults: faults[:1], AckTimeout: 5 * time.Second}, true)
	if res.NotRecovered != 1 || res.Passed() {
		t.Fatalf("not recovered %d, passed %v", res.NotRecovered, res.Passed())
	}
	// Only the stale delivery after the fault: not recovered either.
	res = Verify(Input{Records: recs, Events: append(evs[:60:60], evs[len(evs)-2:]...), Faults: faults[:1], AckTimeout: 5 * time.Second}, true)
	if res.NotRecovered != 1 || res.Passed() {
		t.Fatalf("not recovered %d, passed %v", res.NotRecovered, res.Passed())
	}
	// No record produced to partition 1 after the fault (the producer's
	// sends to it failed until the end): it tells nothing of the recovery;
	// partition 0 does.
	var recs1 []Record
	var evs1 []Event
	for _, r := range recs {
		if r.Partition == 0 || r.At.Before(at(3000)) {
			recs1 = append(recs1, r)
		}
	}
	for _, e := range evs[:len(evs)-2] {
		if e.Partition == 0 || e.Offset < 30 {
			evs1 = append(evs1, e)
		}
	}
	res = Verify(Input{Records: recs1, Events: evs1, Faults: faults[:1], AckTimeout: 5 * time.Second}, true)
	if res.NotRecovered != 0 || len(res.Recovery) != 1 || res.Recovery[0] != 2000*time.Millisecond || !res.Passed() {
		t.Fatalf("not recovered %d, recovery %v, passed %v; want partition 0's 2s alone", res.NotRecovered, res.Recovery, res.Passed())
	}
}

func TestParseEventsSkipsOnlyATruncatedLastLine(t *testing.T) {
	good := "1700000000000000000 D c0.1 1 2 3 1 127.0.0.1:19210 42\n1700000000000000001 A c0.1 1 2 3 1 127.0.0.1:19210 42\n"
	evs, err := ParseEvents(strings.NewReader(good + "1700000000000000002 D c0.1 2 2"))
	if err != nil || len(evs) != 2 {
		t.Fatalf("events %v, err %v", evs, err)
	}
	e := evs[1]
	if e.Kind != EventAck || e.Client != "c0.1" || e.Role() != "c0" || e.Partition != 2 || e.Offset != 3 || e.Value != "42" {
		t.Fatalf("parsed %+v", e)
	}
	if _, err := ParseEvents(strings.NewReader("garbage\n" + good)); err == nil {
		t.Fatal("a malformed line in the middle was accepted")
	}
}

func TestVerifyFindsADeliveryByAMemberThatNoLongerOwnsThePartition(t *testing.T) {
	members := map[string]string{"127.0.0.1:1": "d0", "127.0.0.1:2": "d1"}
	var owners []OwnerSample
	for ms := 0; ms <= 20_000; ms += 250 {
		owner := "d0"
		if ms >= 5000 {
			owner = "d1" // handed over at 5 s
		}
		owners = append(owners, OwnerSample{At: at(ms), Partition: 0, Owner: owner})
	}
	d := func(ms int, member string, o int64) Event {
		e := ev(ms, EventDeliver, "c0.1", uint64(o+1), 0, o)
		e.Member = member
		return e
	}
	in := Input{Records: records(0, 5), AckTimeout: 5 * time.Second, Owners: owners, Members: members,
		Faults: []Fault{{Kind: FaultClientStop, Target: "c1", Start: at(9000), End: at(12_000)}},
		Events: []Event{
			d(1000, "127.0.0.1:1", 0), // d0 owns it
			d(5500, "127.0.0.1:1", 1), // d0, just after the handoff: within the slack
			d(6000, "127.0.0.1:2", 2), // d1 owns it
			d(9000, "127.0.0.1:1", 3), // d0, 4 s after the handoff: a second owner
		}}
	late := d(12_500, "127.0.0.1:1", 4) // logged by a client just resumed from SIGSTOP: not judged
	late.Client = "c1.1"
	in.Events = append(in.Events, late)
	res := Verify(in, false)
	if res.TwoOwners != 1 || !strings.Contains(res.TwoOwnersAt[0], "offset 3 delivered by d0") || res.Passed() {
		t.Fatalf("two owners %d: %v (passed %v)", res.TwoOwners, res.TwoOwnersAt, res.Passed())
	}
}

func TestVerifyLeavesOutOfTheFiguresARecoveryDuringAServerRestart(t *testing.T) {
	var recs []Record
	var evs []Event
	for ms := 0; ms < 20_000; ms += 100 {
		if ms >= 3000 && ms < 9000 {
			continue // the broker is down: nothing produced
		}
		o := int64(len(recs))
		recs = append(recs, Record{Partition: 0, Offset: o, At: at(ms)})
		evs = append(evs, ev(ms+5, EventDeliver, "c0.1", uint64(o+1), 0, o), ev(ms+6, EventAck, "c0.1", uint64(o+1), 0, o))
	}
	faults := []Fault{
		{Kind: FaultKafkaRestart, Target: "kafka", Start: at(3000), End: at(9000)},
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(4000), End: at(5000)},   // during it
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(12000), End: at(13000)}, // after it
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(8500), End: at(8600)},   // no traffic before
		{Kind: FaultZKRestart, Target: "zookeeper", Start: at(15000), End: at(16000)},
		{Kind: FaultDaemonKill, Target: "d2", Leader: true, Start: at(15500), End: at(15600)}, // during a ZooKeeper restart
	}
	res := Verify(Input{Records: recs, Events: evs, Faults: faults, AckTimeout: 5 * time.Second}, true)
	if len(res.Recovery) != 1 || res.Recovery[0] != 105*time.Millisecond || res.Unmeasured != 3 || res.NotRecovered != 0 {
		t.Fatalf("recovery %v, unmeasured %d, not recovered %d", res.Recovery, res.Unmeasured, res.NotRecovered)
	}
}

func TestVerifyExplainsARedeliveryByTheNextOwnerAsAHandoffInSpreadMode(t *testing.T) {
	d := func(ms int, kind byte, client, member string, idx uint64) Event {
		e := ev(ms, kind, client, idx, 0, 0)
		e.Member = member
		return e
	}
	in := Input{Records: records(0, 1), AckTimeout: 5 * time.Second, Events: []Event{
		d(1000, EventDeliver, "c0.1", "127.0.0.1:1", 1), d(1010, EventAck, "c0.1", "127.0.0.1:1", 1),
		d(3000, EventDeliver, "c0.1", "127.0.0.1:2", 2), d(3010, EventAck, "c0.1", "127.0.0.1:2", 2),
		d(4000, EventDeliver, "c0.1", "127.0.0.1:2", 3), d(4010, EventAck, "c0.1", "127.0.0.1:2", 3),
	}}
	if res := Verify(in, false); res.Duplicates[causeUnexplained] != 2 {
		t.Fatalf("leader mode (no ownership records): %v, want both unexplained", res.Duplicates)
	}
	in.Owners = []OwnerSample{{At: at(0), Partition: 0, Owner: "d0"}, {At: at(2000), Partition: 0, Owner: "d1"}}
	res := Verify(in, false)
	if res.Duplicates[causeHandoff] != 1 || res.Duplicates[causeUnexplained] != 1 {
		t.Fatalf("spread mode: %v, want one handoff (another member) and one unexplained (the same member)", res.Duplicates)
	}
}

func TestVerifyExplainsARedeliveryByANackOnlyAfterItsDelay(t *testing.T) {
	in := Input{Records: records(0, 2), AckTimeout: 5 * time.Second, NackDelays: map[string]time.Duration{"nacker": time.Second},
		Events: []Event{
			// nacked with a delay of 1 s, delivered again 1.2 s after the nack
			ev(10, EventDeliver, "nacker.1", 1, 0, 0), ev(210, EventNack, "nacker.1", 1, 0, 0),
			ev(1410, EventDeliver, "c0.1", 1, 0, 0), ev(1420, EventAck, "c0.1", 1, 0, 0),
			// nacked with a delay of 1 s, delivered again 0.5 s after the nack: the delay was not honoured
			ev(2000, EventDeliver, "nacker.1", 2, 0, 1), ev(2200, EventNack, "nacker.1", 2, 0, 1),
			ev(2700, EventDeliver, "c0.1", 2, 0, 1), ev(2710, EventAck, "c0.1", 2, 0, 1),
		}}
	res := Verify(in, true)
	if res.Duplicates[causeNack] != 1 || res.Duplicates[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("duplicates %v (passed %v), want one nack and one unexplained", res.Duplicates, res.Passed())
	}
	// A fault of the daemon that had it between the nack and the early
	// redelivery explains it (the delay is not stored); a fault of another
	// daemon does not.
	in.Members = map[string]string{"m": "d0"}
	in.Faults = []Fault{{Kind: FaultDaemonKill, Target: "d1", Start: at(2300), End: at(2400)}}
	if res := Verify(in, true); res.Duplicates[causeUnexplained] != 1 {
		t.Fatalf("with another daemon's fault: duplicates %v, want the early one unexplained", res.Duplicates)
	}
	in.Faults = []Fault{{Kind: FaultDaemonKill, Target: "d0", Leader: true, Start: at(2300), End: at(2400)}}
	if res := Verify(in, true); res.Duplicates[causeNack] != 2 || res.Duplicates[causeUnexplained] != 0 {
		t.Fatalf("with a fault: duplicates %v, want the early one explained by it", res.Duplicates)
	}
}

// deadLetterRun is a partition of 4 records, 1 and 3 poison, nacked by
// every client; 1 is dead-lettered at 3 s.
func deadLetterRun() Input {
	recs := records(0, 4)
	for _, i := range []int{1, 3} {
		recs[i].Value = PoisonPrefix + "1"
	}
	recs[0].Value, recs[2].Value = "1", "1"
	in := Input{Records: recs, AckTimeout: 5 * time.Second, Topic: "t", MaxAttempts: 2, Events: []Event{
		ev(10, EventDeliver, "c0.1", 1, 0, 0), ev(11, EventAck, "c0.1", 1, 0, 0),
		ev(20, EventDeliver, "c0.1", 2, 0, 1), ev(21, EventNack, "c0.1", 2, 0, 1),
		ev(30, EventDeliver, "c1.1", 1, 0, 1), ev(31, EventNack, "c1.1", 1, 0, 1),
		ev(40, EventDeliver, "c0.1", 3, 0, 2), ev(41, EventAck, "c0.1", 3, 0, 2),
		ev(50, EventDeliver, "c0.1", 4, 0, 3), ev(51, EventNack, "c0.1", 4, 0, 3),
		ev(60, EventDeliver, "c1.1", 2, 0, 3), ev(61, EventNack, "c1.1", 2, 0, 3),
	}}
	in.DeadLetters = []DeadLetter{{At: at(3000), Topic: "t", Partition: 0, Offset: 1, Value: recs[1].Value}}
	return in
}

func TestVerifyCountsAPoisonRecordAsDoneOnceDeadLettered(t *testing.T) {
	in := deadLetterRun()
	// 3 is poison and was never dead-lettered: lost.
	res := Verify(in, true)
	if res.Poison != 2 || res.DeadLettered != 1 || res.Lost != 1 || !strings.HasPrefix(res.LostRecords[0], "0/3 ") || res.Passed() {
		t.Fatalf("poison %d dead-lettered %d lost %d %v (passed %v), want 0/3 lost", res.Poison, res.DeadLettered, res.Lost, res.LostRecords, res.Passed())
	}
	// Dead-lettered twice (a failover produced it again): done at the first.
	in.DeadLetters = append(in.DeadLetters, DeadLetter{At: at(4000), Topic: "t", Partition: 0, Offset: 3, Value: in.Records[3].Value},
		DeadLetter{At: at(6000), Topic: "t", Partition: 0, Offset: 3, Value: in.Records[3].Value})
	in.Samples = []OffsetSample{
		{At: at(2000), Partition: 0, Offset: 1}, // fine: 0 acked
		{At: at(2500), Partition: 0, Offset: 2}, // 1 dead-lettered only at 3 s
		{At: at(5000), Partition: 0, Offset: 4}, // fine: 3 dead-lettered at 4 s
	}
	res = Verify(in, true)
	if res.Lost != 0 || res.DeadLettered != 2 || res.DeadLetters != 3 || res.DeadLetterWrong != 0 {
		t.Fatalf("lost %d dead-lettered %d of %d, wrong %v", res.Lost, res.DeadLettered, res.DeadLetters, res.DeadLetterWrongAt)
	}
	if res.OffsetViolations != 1 || !strings.Contains(res.Violations[0], "committed 2") || res.Passed() {
		t.Fatalf("offset violations %v (passed %v), want the commit of 2 before the dead letter of 1", res.Violations, res.Passed())
	}
}

func TestVerifyFindsADeadLetterThatShouldNotBeThere(t *testing.T) {
	base := deadLetterRun()
	base.DeadLetters = append(base.DeadLetters, DeadLetter{At: at(4000), Topic: "t", Partition: 0, Offset: 3, Value: base.Records[3].Value})
	for name, dl := range map[string]DeadLetter{
		"a record acked, not poison":   {At: at(5000), Topic: "t", Partition: 0, Offset: 2, Value: "1"},
		"headers naming another topic": {At: at(5000), Topic: "u", Partition: 0, Offset: 1, Value: base.Records[1].Value},
		"headers naming no record":     {At: at(5000), Topic: "t", Partition: 0, Offset: 9, Value: base.Records[1].Value},
		"headers missing":              {At: at(5000), Offset: -1, Value: base.Records[1].Value},
		"the value of another record":  {At: at(5000), Topic: "t", Partition: 0, Offset: 1, Value: "2"},
	} {
		in := base
		in.DeadLetters = append(slices.Clone(base.DeadLetters), dl)
		if res := Verify(in, true); res.DeadLetterWrong != 1 || res.Passed() {
			t.Errorf("%s: wrong %d %v (passed %v), want 1", name, res.DeadLetterWrong, res.DeadLetterWrongAt, res.Passed())
		}
	}
	// A record that is not poison but failed MaxAttempts logged deliveries
	// (a nack, and an ack after the ack timeout) may be dead-lettered.
	in := base
	in.Events = slices.DeleteFunc(slices.Clone(base.Events), func(e Event) bool { return e.Offset == 2 })
	second := ev(200, EventDeliver, "c2.1", 1, 0, 2)
	second.Attempt = 2
	in.Events = append(in.Events, ev(100, EventDeliver, "nacker.1", 1, 0, 2), ev(101, EventNack, "nacker.1", 1, 0, 2),
		second, ev(5300, EventAck, "c2.1", 1, 0, 2))
	in.DeadLetters = append(slices.Clone(base.DeadLetters), DeadLetter{At: at(5400), Topic: "t", Partition: 0, Offset: 2, Value: "1"})
	if res := Verify(in, true); res.DeadLetterWrong != 0 || !res.Passed() {
		t.Fatalf("wrong %v (passed %v, %+v), want none", res.DeadLetterWrongAt, res.Passed(), res)
	}
}

// Without the daemons' delivery logs a failure no client logged cannot be
// attributed: no fault excuses it, whoever it hit.
func TestVerifyDeadLetterAfterFailuresNoClientLogged(t *testing.T) {
	recs := records(0, 1)
	recs[0].Value = "1"
	third := ev(4000, EventDeliver, "c1.1", 1, 0, 0)
	third.Attempt = 3
	base := Input{Records: recs, AckTimeout: time.Second, Topic: "t", MaxAttempts: 3, Members: map[string]string{"m": "d1"},
		Events:      []Event{ev(100, EventDeliver, "silent.1", 1, 0, 0), third, ev(4100, EventNack, "c1.1", 1, 0, 0)},
		DeadLetters: []DeadLetter{{At: at(4200), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}}
	for _, faults := range [][]Fault{
		nil,
		{{Kind: FaultClientKill, Target: "c2", Start: at(2000), End: at(2500)}},
		{{Kind: FaultDaemonStop, Target: "d1", Start: at(1000), End: at(3000)}},
		{{Kind: FaultCutClients, Target: "d1", Start: at(0), End: at(50)}},
	} {
		in := base
		in.Faults = faults
		res := Verify(in, true)
		if res.DeadLetterWrong != 1 || res.Passed() || !strings.Contains(res.DeadLetterWrongAt[0], "attempt 2 failing") {
			t.Fatalf("faults %v: wrong %v (passed %v), want attempt 2 named", faults, res.DeadLetterWrongAt, res.Passed())
		}
	}
}

// The pattern of the seed-262474 defect: a healthy record delivered once
// (to the silent client) and never answered while the leader was stopped,
// bounced unseen from attempt 1 to 5 when it woke, and dead-lettered.
func TestVerifyFailsAHealthyRecordBouncedUnseenWhileTheLeaderWasStopped(t *testing.T) {
	recs := records(0, 1)
	recs[0].Value = "1"
	in := Input{Records: recs, AckTimeout: 5 * time.Second, Topic: "t", MaxAttempts: 5,
		Faults:      []Fault{{Kind: FaultDaemonStop, Target: "d2", Leader: true, Start: at(2000), End: at(4450)}},
		Events:      []Event{ev(1000, EventDeliver, "silent.1", 1, 0, 0)},
		DeadLetters: []DeadLetter{{At: at(4500), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}}
	res := Verify(in, true)
	if res.Passed() || res.DeadLetterWrong != 1 {
		t.Fatalf("passed %v, wrong dead letters %v: want the dead letter found wrong", res.Passed(), res.DeadLetterWrongAt)
	}
}

// One logged nack, and the kill of a client that never held the record,
// cannot explain the four other failures of a healthy record.
func TestVerifyFailsFailuresExcusedByAnUnrelatedClientsKill(t *testing.T) {
	recs := records(0, 1)
	recs[0].Value = "1"
	in := Input{Records: recs, AckTimeout: 5 * time.Second, Topic: "t", MaxAttempts: 5,
		Faults:      []Fault{{Kind: FaultClientKill, Target: "c1", Start: at(1100), End: at(1600)}},
		Events:      []Event{ev(1000, EventDeliver, "nacker.1", 1, 0, 0), ev(1050, EventNack, "nacker.1", 1, 0, 0)},
		DeadLetters: []DeadLetter{{At: at(2000), Topic: "t", Partition: 0, Offset: 0, Value: "1"}}}
	res := Verify(in, true)
	if res.Passed() || res.DeadLetterWrong != 1 {
		t.Fatalf("passed %v, wrong dead letters %v: want the dead letter found wrong", res.Passed(), res.DeadLetterWrongAt)
	}
}

// A duplicate of a record acked is explained only by a fault that hit the
// daemon that held the ack (or a handoff that moved its partition): not by
// the kill of a follower, a Kafka restart nobody's term ended in, or
// partitions added.
func TestVerifyFailsADuplicateExcusedByAnUnrelatedFault(t *testing.T) {
	for _, f := range []Fault{
		{Kind: FaultDaemonKill, Target: "d0", Start: at(2000), End: at(2500)},
		{Kind: FaultAddPartitions, Target: "t", Start: at(2000), End: at(2100)},
	} {
		in := Input{Records: records(0, 1), AckTimeout: 5 * time.Second, Faults: []Fault{f}, Members: map[string]string{"m": "d2"},
			Events: []Event{
				ev(1000, EventDeliver, "c0.1", 1, 0, 0), ev(1010, EventAck, "c0.1", 1, 0, 0),
				ev(3000, EventDeliver, "c2.1", 1, 0, 0), ev(3010, EventAck, "c2.1", 1, 0, 0),
			}}
		if res := Verify(in, true); res.Duplicates[causeUnexplained] != 1 || res.Passed() {
			t.Errorf("%s: duplicates %v (passed %v), want one unexplained", f.Kind, res.Duplicates, res.Passed())
		}
	}
}

// In spread mode a record delivered again by another member is a handoff
// only when its partition moved: here nothing shows it did (no ownership
// sample of it, no trace).
func TestVerifyFailsAHandoffWhereOwnershipDidNotMove(t *testing.T) {
	d := func(ms int, kind byte, client, member string, idx uint64) Event {
		e := ev(ms, kind, client, idx, 0, 0)
		e.Member = member
		return e
	}
	var owners []OwnerSample
	for ms := 0; ms <= 5000; ms += 250 {
		owners = append(owners, OwnerSample{At: at(ms), Partition: 1, Owner: "d0"})
	}
	in := Input{Records: records(0, 1), AckTimeout: 5 * time.Second, Owners: owners,
		Members: map[string]string{"127.0.0.1:1": "d0", "127.0.0.1:2": "d1"}, Events: []Event{
			d(1000, EventDeliver, "c0.1", "127.0.0.1:1", 1), d(1010, EventAck, "c0.1", "127.0.0.1:1", 1),
			d(3000, EventDeliver, "c0.1", "127.0.0.1:2", 2), d(3010, EventAck, "c0.1", "127.0.0.1:2", 2),
		}}
	if res := Verify(in, false); res.Duplicates[causeUnexplained] != 1 || res.Passed() {
		t.Fatalf("duplicates %v (passed %v), want one unexplained", res.Duplicates, res.Passed())
	}
}
