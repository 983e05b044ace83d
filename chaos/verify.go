package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// Record is one message Kafka holds at the end of a run.
type Record struct {
	Partition int32
	Offset    int64
	At        time.Time // the record's timestamp: when it was produced
	Value     string    `json:",omitempty"`
}

// Poison reports whether the record is a poison record (PoisonPrefix):
// every client nacks it, so it must end in the dead-letter topic.
func (r Record) Poison() bool { return strings.HasPrefix(r.Value, PoisonPrefix) }

// DeadLetter is one record of the dead-letter topic at the end of a run.
type DeadLetter struct {
	At time.Time // when Kafka appended it (the topic keeps LogAppendTime)
	// Topic, Partition and Offset are what its fanout.dlq.* headers name
	// (Offset -1 when the headers are missing or malformed).
	Topic     string
	Partition int32
	Offset    int64
	Value     string
}

// Fault is one injected fault, from its start to the moment it was healed
// (the process restarted, the link restored, the server answering again).
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"` // d0, c1, kafka, zookeeper, topic
	Leader bool      `json:"leader,omitempty"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
}

// Fault kinds.
const (
	FaultDaemonKill     = "daemon-kill9"
	FaultDaemonTerm     = "daemon-term"
	FaultDaemonStop     = "daemon-stop"
	FaultClientKill     = "client-kill9"
	FaultClientTerm     = "client-term"
	FaultClientStop     = "client-stop"
	FaultKafkaRestart   = "kafka-restart"
	FaultZKRestart      = "zookeeper-restart"
	FaultCutKafka       = "cut-kafka"
	FaultCutZooKeeper   = "cut-zookeeper"
	FaultCutClients     = "cut-clients"
	FaultAddPartitions  = "add-partitions"
	maxListed           = 20 // lost records, unexplained duplicates and failures, violations: listed in full
	recoveryActiveSince = 5 * time.Second
)

// clientFault reports whether a fault of this kind hits one client (and so
// explains only the redeliveries of what that client held).
func clientFault(kind string) bool {
	return kind == FaultClientKill || kind == FaultClientTerm || kind == FaultClientStop
}

// daemonFault reports whether a fault of this kind stops a daemon.
func daemonFault(kind string) bool {
	return kind == FaultDaemonKill || kind == FaultDaemonTerm || kind == FaultDaemonStop
}

// OffsetSample is a committed offset read from the offset store during the run.
type OffsetSample struct {
	At        time.Time // after the read returned
	Partition int32
	Offset    int64 // the next offset to deliver: every record below it was acked
}

// OwnerSample is a partition's ownership record (spread mode) read from
// ZooKeeper during the run: Owner is a daemon's node id, "" when released.
type OwnerSample struct {
	At        time.Time // after the read returned
	Partition int32
	Owner     string
}

// Input is what a run leaves for verification.
type Input struct {
	Records    []Record
	Events     []Event
	Faults     []Fault
	Samples    []OffsetSample
	Owners     []OwnerSample     // spread mode
	Members    map[string]string // a daemon's advertised address (Event.Member) → its node id
	Sent       []Record          // the producer's sends Kafka acknowledged
	AckTimeout time.Duration
	// Topic is the topic the daemons consume; DeadLetters is what their
	// dead-letter topic holds at the end, MaxAttempts their --max-attempts
	// (0: no dead-letter topic).
	Topic       string       `json:",omitempty"`
	DeadLetters []DeadLetter `json:",omitempty"`
	MaxAttempts int          `json:",omitempty"`
	// NackDelays is, by client role, the delay its nacks ask for: no
	// redelivery may come sooner after its nack.
	NackDelays map[string]time.Duration `json:",omitempty"`
	// Deliveries is each daemon's delivery log (--delivery-log), by node
	// id; DeliveryLogBad counts the lines that could not be read. Read from
	// the run's files, like the client logs.
	Deliveries     map[string][]deliverylog.Event `json:"-"`
	DeliveryLogBad int                            `json:"-"`
	// Liveness is the daemons' client liveness window (--heartbeat ×
	// --liveness): a fault's effects outlast it by up to this (a daemon
	// resumed from SIGSTOP finds the connections its clients closed
	// meanwhile), plus a second for a loaded machine.
	Liveness time.Duration `json:",omitempty"`
}

// Result is the verdict of a run.
type Result struct {
	Messages   int `json:"messages"`   // records in Kafka
	Deliveries int `json:"deliveries"` // D events
	Acked      int `json:"acked"`      // records acked at least once
	Lost       int `json:"lost"`       // records neither acked nor dead-lettered
	// Poison counts the poison records; DeadLettered the records the
	// dead-letter topic holds (poison or not), DeadLetters its records (a
	// record may be dead-lettered more than once).
	Poison       int `json:"poison"`
	DeadLettered int `json:"dead_lettered"`
	DeadLetters  int `json:"dead_letters"`
	// DeadLetteredHealthy counts the records of DeadLettered that are not
	// poison: each failure of theirs excused (deadLetterUnexplained), by
	// faults of their holders mostly. What faults cost in records given up
	// on.
	DeadLetteredHealthy int `json:"dead_lettered_healthy"`
	// DeadLetterWrong counts dead-letter records that are not what they
	// should be: headers naming no record of the topic or another value,
	// or a record that is not poison with a failure behind its dead letter
	// that nothing excuses (deadLetterUnexplained).
	DeadLetterWrong   int      `json:"dead_letter_wrong"`
	DeadLetterWrongAt []string `json:"dead_letter_wrong_at,omitempty"`
	// Vanished counts sends Kafka acknowledged that it no longer holds at
	// the end (a restart that lost data would hide records from Lost).
	Vanished    int            `json:"vanished"`
	LostRecords []string       `json:"lost_records,omitempty"`
	Duplicates  map[string]int `json:"duplicates"` // redeliveries by cause
	Unexplained []string       `json:"unexplained,omitempty"`
	// Failures counts the failed attempts that counted toward
	// --max-attempts, as the delivery logs show them, by cause
	// (failureCause); NotCounted those that did not, by why.
	Failures            map[string]int `json:"failures"`
	UnexplainedFailures []string       `json:"unexplained_failures,omitempty"`
	NotCounted          map[string]int `json:"failures_not_counted,omitempty"`
	// DeliveryLogs is what the daemons' delivery logs held.
	DeliveryLogs     DeliveryLogStats `json:"delivery_logs"`
	OffsetSamples    int              `json:"offset_samples"`
	OffsetViolations int              `json:"offset_violations"`
	Violations       []string         `json:"violations,omitempty"`
	// Recovery is, per daemon fault that needed one (leader mode: the
	// leader's; spread mode: any member's), the time from the fault until
	// every partition that had been receiving records delivered again.
	Recovery []time.Duration `json:"-"`
	// NotRecovered counts such faults after which some partition never
	// delivered again.
	NotRecovered int `json:"not_recovered"`
	// Unmeasured counts daemon faults that recovered but whose time is left
	// out of Recovery: no partition was receiving records before them, or
	// Kafka or ZooKeeper restarted meanwhile (then nothing can flow or move).
	Unmeasured int `json:"recovery_unmeasured"`
	// TwoOwners counts deliveries (spread mode) by a member while the
	// ownership record had named another member throughout the
	// ownerSlack before it: two owners of one partition at once.
	OwnerSamples int      `json:"owner_samples"`
	TwoOwners    int      `json:"two_owners"`
	TwoOwnersAt  []string `json:"two_owners_at,omitempty"`
	// EarlyNackRedeliveries counts records nacked with a delay that came
	// again sooner than the delay after the nack, with no fault that could
	// have lost the delay (checkDelayedNacks): a delay survives failovers.
	EarlyNackRedeliveries   int      `json:"early_nack_redeliveries"`
	EarlyNackRedeliveriesAt []string `json:"early_nack_redeliveries_at,omitempty"`
}

// DeliveryLogStats is what the daemons' delivery logs held.
type DeliveryLogStats struct {
	Events   int `json:"events"`
	Attempts int `json:"attempts"`
	// Dropped counts the events the daemons dropped (a slow disk), Bad the
	// lines that could not be read.
	Dropped int `json:"dropped"`
	Bad     int `json:"bad_lines"`
	// Unmatched counts client-logged deliveries whose attempt is in no
	// delivery log (a daemon killed before it wrote it, or a log missing).
	Unmatched int `json:"unmatched_deliveries"`
}

// Passed reports whether nothing was lost, every duplicate and counted
// failure is explained, no record that is not poison was dead-lettered
// without its failures excused, and no committed offset passed an unacked
// record.
func (r *Result) Passed() bool {
	return r.Lost == 0 && r.Vanished == 0 && r.DeadLetterWrong == 0 && r.Duplicates[causeUnexplained] == 0 &&
		r.Failures[causeUnexplained] == 0 && r.OffsetViolations == 0 && r.NotRecovered == 0 && r.TwoOwners == 0 &&
		r.EarlyNackRedeliveries == 0
}

type key struct {
	p int32
	o int64
}

// delivery is a D event with what its client did with it.
type delivery struct {
	Event
	outcome byte      // EventAck, EventNack or 0 (nothing logged)
	doneAt  time.Time // time of the ack or nack
}

// Verify checks a run: no record lost, every redelivery and every counted
// failure explained, every committed offset sample behind acked records
// only, and recovery after each daemon fault (leaderOnly: leader mode, only
// faults of the leader count).
func Verify(in Input, leaderOnly bool) *Result {
	res := &Result{Messages: len(in.Records), Duplicates: map[string]int{causeUnexplained: 0},
		Failures: map[string]int{causeUnexplained: 0}}
	v := &verifier{in: in, spread: !leaderOnly, aftermath: in.Liveness + time.Second, used: map[key]map[int]bool{}}
	if in.Liveness == 0 {
		v.aftermath = 3 * time.Second // runs that did not record it: --heartbeat 1s × --liveness 2, and a second
	}
	if len(in.Deliveries) > 0 {
		v.h = newHistory(in.Deliveries)
		res.NotCounted = v.h.notCounted
		res.DeliveryLogs = DeliveryLogStats{Events: v.h.events, Attempts: len(v.h.attempts), Dropped: v.h.gaps, Bad: in.DeliveryLogBad}
	}
	type ck struct {
		client string
		idx    uint64
	}
	byIdx := map[ck]*delivery{}
	perRecord := map[key][]*delivery{}
	firstAck := map[key]time.Time{}
	events := slices.Clone(in.Events)
	slices.SortStableFunc(events, func(a, b Event) int { return a.At.Compare(b.At) })
	for _, e := range events {
		k := key{e.Partition, e.Offset}
		switch e.Kind {
		case EventDeliver:
			d := &delivery{Event: e}
			byIdx[ck{e.Client, e.Index}] = d
			perRecord[k] = append(perRecord[k], d)
			res.Deliveries++
			if v.h != nil {
				if a := v.attemptOf(d); a != nil && a.Partition == e.Partition && a.Offset == e.Offset {
					a.seen = d
				} else {
					res.DeliveryLogs.Unmatched++
				}
			}
		case EventAck, EventNack:
			if d := byIdx[ck{e.Client, e.Index}]; d != nil && d.outcome == 0 {
				d.outcome, d.doneAt = e.Kind, e.At
			}
			if t, ok := firstAck[k]; e.Kind == EventAck && (!ok || e.At.Before(t)) {
				firstAck[k] = e.At
			}
		}
	}
	records := slices.Clone(in.Records)
	slices.SortFunc(records, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	if v.h != nil {
		v.failures(res)
	}
	done := v.deadLetters(res, records, perRecord, firstAck)
	for _, r := range records {
		if r.Poison() {
			res.Poison++
		}
		if _, ok := firstAck[key{r.Partition, r.Offset}]; ok {
			res.Acked++
			continue
		}
		if _, ok := done[key{r.Partition, r.Offset}]; ok {
			continue // dead-lettered
		}
		res.Lost++
		if len(res.LostRecords) < maxListed {
			res.LostRecords = append(res.LostRecords, fmt.Sprintf("%d/%d (produced %s)", r.Partition, r.Offset, r.At.Format(time.RFC3339Nano)))
		}
	}
	held := make(map[key]bool, len(records))
	for _, r := range records {
		held[key{r.Partition, r.Offset}] = true
	}
	for _, s := range in.Sent {
		if !held[key{s.Partition, s.Offset}] {
			res.Vanished++
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(perRecord), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.o, b.o))
	}) {
		// In the order the daemons sent them.
		ds := slices.Clone(perRecord[k])
		slices.SortStableFunc(ds, func(a, b *delivery) int { return v.sentAt(a).Compare(v.sentAt(b)) })
		for i := 1; i < len(ds); i++ {
			cause := v.duplicateCause(ds[i-1], ds[i])
			res.Duplicates[cause]++
			if cause == causeUnexplained && len(res.Unexplained) < maxListed {
				res.Unexplained = append(res.Unexplained, fmt.Sprintf("%d/%d: delivered to %s at %s (outcome %q at %s), again to %s at %s",
					k.p, k.o, ds[i-1].Client, ds[i-1].At.Format(time.RFC3339Nano), ds[i-1].outcome,
					ds[i-1].doneAt.Format(time.RFC3339Nano), ds[i].Client, ds[i].At.Format(time.RFC3339Nano)))
			}
		}
	}
	checkOffsets(res, records, done, in.Samples)
	recovery(res, records, perRecord, in.Faults, leaderOnly)
	checkOwners(res, events, in)
	checkDelayedNacks(res, events, in)
	return res
}

// serverDown reports whether a restart of Kafka (nothing flows) or of
// ZooKeeper (no fence or ownership record can change hands) overlapped
// [from, to].
func serverDown(faults []Fault, from, to time.Time) bool {
	for _, f := range faults {
		if (f.Kind == FaultKafkaRestart || f.Kind == FaultZKRestart) && !f.Start.After(to) && !f.End.Before(from) {
			return true
		}
	}
	return false
}

// ownerSlack is how long the ownership record must have named another
// member before a delivery for it to count as a second owner's: a delivery
// is logged when the client reads it, a little after the daemon sent it.
const ownerSlack = 2 * time.Second

// checkOwners finds deliveries (spread mode) by a member while the ownership
// record of their partition named another member, continuously from
// ownerSlack before the delivery until after it. Deliveries to a client
// while a fault held it, or within ownerSlack after, are not judged: a
// stopped client logs late what it was sent long before.
func checkOwners(res *Result, events []Event, in Input) {
	res.OwnerSamples = len(in.Owners)
	if len(in.Owners) == 0 {
		return
	}
	type run struct {
		owner      string
		from, till time.Time // first and last sample of an unbroken run of one owner
	}
	runs := map[int32][]run{}
	owners := slices.Clone(in.Owners)
	slices.SortStableFunc(owners, func(a, b OwnerSample) int { return a.At.Compare(b.At) })
	for _, o := range owners {
		rs := runs[o.Partition]
		if n := len(rs); n > 0 && rs[n-1].owner == o.Owner {
			rs[n-1].till = o.At
			continue
		}
		runs[o.Partition] = append(rs, run{owner: o.Owner, from: o.At, till: o.At})
	}
	held := func(e Event) bool {
		for _, f := range in.Faults {
			if clientFault(f.Kind) && f.Target == e.Role() && !e.At.Before(f.Start) && !e.At.After(f.End.Add(ownerSlack)) {
				return true
			}
		}
		return false
	}
	for _, e := range events {
		member, ok := in.Members[e.Member]
		if e.Kind != EventDeliver || !ok {
			continue
		}
		rs := runs[e.Partition]
		// The run covering the delivery: started ownerSlack before it, lasted until after it.
		i, _ := slices.BinarySearchFunc(rs, e.At, func(r run, t time.Time) int { return r.from.Compare(t) })
		if i == 0 {
			continue
		}
		r := rs[i-1]
		if r.owner == "" || r.owner == member || r.from.After(e.At.Add(-ownerSlack)) || !r.till.After(e.At) || held(e) {
			continue
		}
		res.TwoOwners++
		if len(res.TwoOwnersAt) < maxListed {
			res.TwoOwnersAt = append(res.TwoOwnersAt, fmt.Sprintf("partition %d offset %d delivered by %s to %s at %s; its record named %s from %s to %s",
				e.Partition, e.Offset, member, e.Client, e.At.Format(time.RFC3339Nano), r.owner,
				r.from.Format(time.RFC3339Nano), r.till.Format(time.RFC3339Nano)))
		}
	}
}

// deadLetters checks the dead-letter records and returns when each record
// was first done: acked, or appended to the dead-letter topic.
func (v *verifier) deadLetters(res *Result, records []Record, perRecord map[key][]*delivery, firstAck map[key]time.Time) map[key]time.Time {
	in := v.in
	done := maps.Clone(firstAck)
	byKey := make(map[key]Record, len(records))
	for _, r := range records {
		byKey[key{r.Partition, r.Offset}] = r
	}
	res.DeadLetters = len(in.DeadLetters)
	dead := map[key]bool{}
	wrong := func(format string, args ...any) {
		res.DeadLetterWrong++
		if len(res.DeadLetterWrongAt) < maxListed {
			res.DeadLetterWrongAt = append(res.DeadLetterWrongAt, fmt.Sprintf(format, args...))
		}
	}
	for _, dl := range in.DeadLetters {
		k := key{dl.Partition, dl.Offset}
		r, ok := byKey[k]
		switch {
		case dl.Topic != in.Topic || !ok:
			wrong("a dead letter at %s names %s/%d/%d: no such record", dl.At.Format(time.RFC3339Nano), dl.Topic, dl.Partition, dl.Offset)
			continue
		case dl.Value != r.Value:
			wrong("the dead letter of %d/%d holds %q, the record %q", dl.Partition, dl.Offset, dl.Value, r.Value)
			continue
		}
		if !r.Poison() {
			// A record that is not poison may fail MaxAttempts times too
			// (nacks, timeouts, its holders' faults): each failure must be
			// excused.
			if why := v.deadLetterUnexplained(k, perRecord[k], dl.At); why != "" {
				wrong("%d/%d (not poison) was dead-lettered at %s, but %s",
					dl.Partition, dl.Offset, dl.At.Format(time.RFC3339Nano), why)
				continue
			}
		}
		if !dead[k] && !r.Poison() {
			res.DeadLetteredHealthy++
		}
		dead[k] = true
		if t, ok := done[k]; !ok || dl.At.Before(t) {
			done[k] = dl.At
		}
	}
	res.DeadLettered = len(dead)
	return done
}

// checkOffsets compares every sampled committed offset with when each
// record was first done (acked or dead-lettered): each record below it
// must have been done before the sample was read.
func checkOffsets(res *Result, records []Record, firstAck map[key]time.Time, samples []OffsetSample) {
	// Per partition, the latest first-ack among the records up to each offset
	// (an unacked record counts as acked never).
	never := time.Unix(1<<40, 0)
	type prefix struct {
		offs   []int64
		latest []time.Time
	}
	parts := map[int32]*prefix{}
	for _, r := range records {
		p := parts[r.Partition]
		if p == nil {
			p = &prefix{}
			parts[r.Partition] = p
		}
		t, ok := firstAck[key{r.Partition, r.Offset}]
		if !ok {
			t = never
		}
		if n := len(p.latest); n > 0 && p.latest[n-1].After(t) {
			t = p.latest[n-1]
		}
		p.offs, p.latest = append(p.offs, r.Offset), append(p.latest, t)
	}
	res.OffsetSamples = len(samples)
	for _, s := range samples {
		p := parts[s.Partition]
		if p == nil {
			continue
		}
		// The records below s.Offset: p.offs[:i].
		i, _ := slices.BinarySearch(p.offs, s.Offset)
		if i == 0 || p.latest[i-1].Before(s.At) {
			continue
		}
		res.OffsetViolations++
		if len(res.Violations) < maxListed {
			what := "done only at " + p.latest[i-1].Format(time.RFC3339Nano)
			if p.latest[i-1].Equal(never) {
				what = "never acked nor dead-lettered"
			}
			res.Violations = append(res.Violations, fmt.Sprintf("partition %d committed %d at %s, but a record below it was %s",
				s.Partition, s.Offset, s.At.Format(time.RFC3339Nano), what))
		}
	}
}

// recovery measures, for each daemon fault that interrupts delivery, the
// time until every partition that was receiving records delivers again a
// record produced after the fault: only a live owner can have sent that one
// (a client logs a delivery when it reads it, and may read late what a dead
// daemon sent before the fault).
func recovery(res *Result, records []Record, perRecord map[key][]*delivery, faults []Fault, leaderOnly bool) {
	type rec struct{ at, first time.Time } // produced; first delivered (zero: never)
	parts := map[int32][]rec{}
	for _, r := range records {
		var first time.Time
		for _, d := range perRecord[key{r.Partition, r.Offset}] {
			if first.IsZero() || d.At.Before(first) {
				first = d.At
			}
		}
		parts[r.Partition] = append(parts[r.Partition], rec{r.At, first})
	}
	for _, rs := range parts {
		slices.SortFunc(rs, func(a, b rec) int { return a.at.Compare(b.at) })
	}
	byAt := func(r rec, t time.Time) int { return r.at.Compare(t) }
	for _, f := range faults {
		if !daemonFault(f.Kind) || (leaderOnly && !f.Leader) {
			continue
		}
		var worst time.Duration
		recovered, active := true, 0
		for _, rs := range parts {
			// Active: records were produced just before the fault, and some
			// after it (none after it, e.g. the producer's sends to the
			// partition failed until the end: nothing can show it recovered).
			i, _ := slices.BinarySearchFunc(rs, f.Start.Add(-recoveryActiveSince), byAt)
			j, _ := slices.BinarySearchFunc(rs, f.Start.Add(time.Nanosecond), byAt)
			if i == len(rs) || rs[i].at.After(f.Start) || j == len(rs) {
				continue
			}
			active++
			var best time.Time
			for ; j < len(rs) && (best.IsZero() || rs[j].at.Before(best)); j++ {
				if !rs[j].first.IsZero() && (best.IsZero() || rs[j].first.Before(best)) {
					best = rs[j].first
				}
			}
			if best.IsZero() {
				recovered = false
				continue
			}
			worst = max(worst, best.Sub(f.Start))
		}
		if !recovered {
			res.NotRecovered++
			continue
		}
		if active == 0 || serverDown(faults, f.Start, f.Start.Add(worst)) {
			// Nothing flowed, or nothing could move: no failover time to measure.
			res.Unmeasured++
			continue
		}
		res.Recovery = append(res.Recovery, worst)
	}
}
