package chaos

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/deliverylog"
)

// Attribution: what the daemons' delivery logs (--delivery-log) say of each
// attempt, joined with the clients' logs by member and delivery id, and the
// rules that excuse a failed attempt or a duplicate. A failure (or the
// failure behind a duplicate) is excused by what its client logged (a nack;
// no ack within the ack timeout; a goodbye while holding it), or by a fault
// that hit its holder (its client, the daemon that delivered it, a cut
// between them) while it held it, one failure per record and fault; a
// record delivered again after it was acked, by the end of what the daemon
// served it under: a handoff that moved its partition, or a fault of that
// daemon (or a server restart).

// Causes of duplicates and failures besides "fault: <kind>" (faultCause).
const (
	causeNack        = "nack"
	causeTimeout     = "timeout"
	causeClientLeft  = "client left holding it"
	causeHandoff     = "handoff"
	causeRestart     = "partition restarted below it"
	causeUnexplained = "unexplained"
)

// faultCause names a fault's kind as a cause.
func faultCause(kind string) string { return "fault: " + kind }

// attempt is one delivery attempt a daemon's delivery log shows.
type attempt struct {
	deliverylog.Event                   // its Deliver event
	node              string            // the daemon that made it
	inc               int               // the daemon's incarnation (Open events)
	out               deliverylog.Event // its outcome; Kind 0 when the log has none
	stretch           *stretch          // what the daemon served it under
	seen              *delivery         // the client's log of it; nil when no client logged it
	cause             string            // why its counted failure is excused (failureCause); "" before
}

// role is the client's role without its incarnation (c0 of c0.2).
func (a *attempt) role() string {
	role, _, _ := strings.Cut(a.Client, ".")
	return role
}

// outcomeKind is the kind of failure or end of a: a Returned outcome (during
// a handoff) counts as the failure it names.
func (a *attempt) outcomeKind() deliverylog.Kind {
	if a.out.Kind != deliverylog.Returned {
		return a.out.Kind
	}
	switch a.out.Detail {
	case deliverylog.Nack.String():
		return deliverylog.Nack
	case deliverylog.Timeout.String():
		return deliverylog.Timeout
	case deliverylog.Gone.String():
		return deliverylog.Gone
	}
	return deliverylog.Returned
}

// failedCounted reports whether a's failure counted toward --max-attempts.
func (a *attempt) failedCounted() bool {
	switch a.out.Kind {
	case deliverylog.Nack, deliverylog.Timeout, deliverylog.Gone:
		return a.out.Counted()
	}
	return false
}

// stretch is one span during which a daemon served a partition: a leader's
// term (every partition: partition -1) or, in spread mode, a partition from
// its assignment to its handoff or loss.
type stretch struct {
	node       string
	partition  int32
	start, end time.Time // end: the last event of the log when it did not end before
	how        string    // why it ended: revoked, lost, reassigned, stopped: <why>, died, end of log
}

// Why a stretch ended (stretch.how), besides "stopped: <Stop's detail>".
const (
	endRevoked = "revoked"
	endDied    = "died"
	endOfLog   = "end of log"
)

type attemptKey struct {
	node string
	id   uint64
}

type sessionKey struct {
	node    string
	inc     int
	session uint64
}

// deadLetterEvent is a DeadLetter event of a daemon's log.
type deadLetterEvent struct {
	node     string
	at       time.Time
	failures uint32
}

// history is what the delivery logs show.
type history struct {
	attempts    map[attemptKey]*attempt
	byRecord    map[key][]*attempt // in time order
	leaves      map[sessionKey]deliverylog.Event
	deadLetters map[key][]deadLetterEvent
	restarts    map[string][]deliverylog.Event // by node
	stretches   map[string][]*stretch          // by node, in order
	events      int
	gaps        int // events the daemons dropped (Gap lines)
	notCounted  map[string]int
}

// newHistory reads the delivery logs, by node.
func newHistory(logs map[string][]deliverylog.Event) *history {
	h := &history{attempts: map[attemptKey]*attempt{}, byRecord: map[key][]*attempt{}, leaves: map[sessionKey]deliverylog.Event{},
		deadLetters: map[key][]deadLetterEvent{}, restarts: map[string][]deliverylog.Event{}, stretches: map[string][]*stretch{},
		notCounted: map[string]int{}}
	for _, node := range slices.Sorted(mapKeys(logs)) {
		h.read(node, logs[node])
	}
	for _, as := range h.byRecord {
		slices.SortStableFunc(as, func(a, b *attempt) int { return a.At.Compare(b.At) })
	}
	for _, ds := range h.deadLetters {
		slices.SortStableFunc(ds, func(a, b deadLetterEvent) int { return a.at.Compare(b.at) })
	}
	return h
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// read adds one daemon's log.
func (h *history) read(node string, evs []deliverylog.Event) {
	inc := 0
	var all *stretch              // the running leader's term
	parts := map[int32]*stretch{} // spread mode: the partitions served
	var last time.Time
	begin := func(p int32, at time.Time) *stretch {
		st := &stretch{node: node, partition: p, start: at}
		h.stretches[node] = append(h.stretches[node], st)
		return st
	}
	end := func(st *stretch, at time.Time, how string) {
		if st != nil && st.how == "" {
			st.end, st.how = at, how
		}
	}
	endAll := func(at time.Time, how string) {
		end(all, at, how)
		all = nil
		for _, st := range parts {
			end(st, at, how)
		}
		clear(parts)
	}
	for _, e := range evs {
		h.events++
		switch e.Kind {
		case deliverylog.Open:
			endAll(last, endDied)
			inc++
		case deliverylog.Start:
			endAll(e.At, endDied) // a stop the log lost
			if e.Detail == "all-partitions" {
				all = begin(-1, e.At)
			}
		case deliverylog.Stop:
			endAll(e.At, "stopped: "+e.Detail)
		case deliverylog.Assign:
			end(parts[e.Partition], e.At, "reassigned")
			parts[e.Partition] = begin(e.Partition, e.At)
		case deliverylog.Revoked:
			end(parts[e.Partition], e.At, endRevoked)
			delete(parts, e.Partition)
		case deliverylog.Lost:
			end(parts[e.Partition], e.At, e.Detail)
			delete(parts, e.Partition)
		case deliverylog.Deliver:
			a := &attempt{Event: e, node: node, inc: inc, stretch: all}
			if a.stretch == nil {
				a.stretch = parts[e.Partition]
			}
			h.attempts[attemptKey{node, e.ID}] = a
			k := key{e.Partition, e.Offset}
			h.byRecord[k] = append(h.byRecord[k], a)
		case deliverylog.Ack, deliverylog.Nack, deliverylog.Timeout, deliverylog.Gone, deliverylog.Returned,
			deliverylog.Dropped, deliverylog.Forgotten:
			if a := h.attempts[attemptKey{node, e.ID}]; a != nil && a.out.Kind == 0 {
				a.out = e
			}
			if (e.Kind == deliverylog.Nack || e.Kind == deliverylog.Gone) && !e.Counted() {
				h.notCounted[e.Detail]++
			}
		case deliverylog.Leave:
			h.leaves[sessionKey{node, inc, e.Session}] = e
		case deliverylog.DeadLetter:
			k := key{e.Partition, e.Offset}
			h.deadLetters[k] = append(h.deadLetters[k], deadLetterEvent{node: node, at: e.At, failures: e.Attempt})
		case deliverylog.Restart:
			h.restarts[node] = append(h.restarts[node], e)
		case deliverylog.Gap:
			n, _ := strconv.Atoi(e.Detail)
			h.gaps += n
		}
		last = e.At
	}
	endAll(last, endOfLog)
}

// stretchAt returns the stretch of node serving partition p at t, or nil.
func (h *history) stretchAt(node string, p int32, t time.Time) *stretch {
	for _, st := range h.stretches[node] {
		if (st.partition == -1 || st.partition == p) && !t.Before(st.start) && (st.how == "" || !t.After(st.end)) {
			return st
		}
	}
	return nil
}

// restartedBelow reports whether node restarted partition p at or below
// offset o within [from, to]: the record was fetched and delivered again.
func (h *history) restartedBelow(node string, p int32, o int64, from, to time.Time) bool {
	for _, e := range h.restarts[node] {
		if e.Partition == p && e.Offset <= o && !e.At.Before(from) && !e.At.After(to) {
			return true
		}
	}
	return false
}

// verifier holds what the rules need.
type verifier struct {
	in        Input
	h         *history // nil without delivery logs
	spread    bool
	aftermath time.Duration // how long a fault's effects outlast it
	// used holds, per record, the faults (by index) that excused one of its
	// counted failures: a fault excuses one failure of a record.
	used map[key]map[int]bool
}

// node returns the node id of a client-logged delivery's member.
func (v *verifier) node(d *delivery) string { return v.in.Members[d.Member] }

// attemptOf returns the delivery log's attempt of a client-logged delivery,
// or nil.
func (v *verifier) attemptOf(d *delivery) *attempt {
	if v.h == nil || d.DeliveryID == 0 {
		return nil
	}
	return v.h.attempts[attemptKey{v.node(d), d.DeliveryID}]
}

// hitsHolder reports whether fault f hits the holder of an attempt: its
// client (role), the daemon that delivered it (node), or the link between.
func hitsHolder(f Fault, role, node string) bool {
	switch {
	case clientFault(f.Kind):
		return f.Target == role
	case daemonFault(f.Kind), f.Kind == FaultCutClients:
		return f.Target == node
	}
	return false
}

// endsStretch reports whether fault f can end what node serves: a fault of
// the daemon itself, a cut of it from Kafka or ZooKeeper (its term or its
// ownership lost), a restart of Kafka or ZooKeeper (every member's).
func endsStretch(f Fault, node string) bool {
	switch f.Kind {
	case FaultKafkaRestart, FaultZKRestart:
		return true
	case FaultCutKafka, FaultCutZooKeeper:
		return f.Target == node
	}
	return daemonFault(f.Kind) && f.Target == node
}

// faultIn returns the index of the first fault for which hits holds that
// overlaps [from, to] (its aftermath included) and that skip does not
// reject, or -1.
func (v *verifier) faultIn(from, to time.Time, hits func(Fault) bool, skip func(int) bool) int {
	for i, f := range v.in.Faults {
		if hits(f) && !f.Start.After(to) && !f.End.Add(v.aftermath).Before(from) && (skip == nil || !skip(i)) {
			return i
		}
	}
	return -1
}

// heldPastDeadline reports whether the client that logged d did not ack
// (nor nack) it in time for a daemon whose deadline was deadline: it
// never did, or only within the last ackMargin before it (the ack was on
// its way).
func heldPastDeadline(d *delivery, deadline time.Time) bool {
	return d.outcome == 0 || !d.doneAt.Before(deadline.Add(-ackMargin))
}

// ackMargin is how long before a daemon's ack deadline a client's ack (its
// log line comes first) may still miss it on a loaded machine.
const ackMargin = time.Second

// leftHolding reports whether a's client said goodbye while it held a: the
// session left with reason goodbye, and the client had logged the delivery
// and neither acked nor nacked it before.
func (v *verifier) leftHolding(a *attempt) bool {
	leave, ok := v.h.leaves[sessionKey{a.node, a.inc, a.Session}]
	return ok && leave.Detail == "goodbye" && a.seen != nil &&
		(a.seen.outcome == 0 || a.seen.doneAt.After(leave.At))
}

// closedByDaemon reports whether a's daemon closed its client's connection
// itself (leave reason shutdown: it stopped serving, or shut down).
func (v *verifier) closedByDaemon(a *attempt) bool {
	leave, ok := v.h.leaves[sessionKey{a.node, a.inc, a.Session}]
	return ok && leave.Detail == "shutdown"
}

// failureCause explains the counted failure of attempt a of record k, or
// returns causeUnexplained. A fault that excuses it is used up for k.
func (v *verifier) failureCause(a *attempt, k key) string {
	switch a.out.Kind {
	case deliverylog.Nack:
		if a.seen != nil && a.seen.outcome == EventNack {
			return causeNack
		}
	case deliverylog.Timeout:
		if a.out.At.Sub(a.At) < v.in.AckTimeout-time.Millisecond {
			return causeUnexplained // timed out early
		}
		if a.seen != nil && heldPastDeadline(a.seen, a.At.Add(v.in.AckTimeout)) {
			return causeTimeout
		}
	case deliverylog.Gone:
		if v.leftHolding(a) {
			return causeClientLeft
		}
	}
	role, used := a.role(), v.used[k]
	i := v.faultIn(a.At, a.out.At, func(f Fault) bool { return hitsHolder(f, role, a.node) }, func(i int) bool { return used[i] })
	if i < 0 {
		return causeUnexplained
	}
	if used == nil {
		used = map[int]bool{}
		v.used[k] = used
	}
	used[i] = true
	return faultCause(v.in.Faults[i].Kind)
}

// failures explains every counted failure the delivery logs show.
func (v *verifier) failures(res *Result) {
	for _, k := range slices.SortedFunc(func(yield func(key) bool) {
		for k := range v.h.byRecord {
			if !yield(k) {
				return
			}
		}
	}, func(a, b key) int { return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.o, b.o)) }) {
		for _, a := range v.h.byRecord[k] {
			if !a.failedCounted() {
				continue
			}
			a.cause = v.failureCause(a, k)
			res.Failures[a.cause]++
			if a.cause == causeUnexplained {
				res.UnexplainedFailures = appendListed(res.UnexplainedFailures, describe(a))
			}
		}
	}
}

// describe names an attempt and its outcome for the summary.
func describe(a *attempt) string {
	b := strings.Builder{}
	b.WriteString(strconv.Itoa(int(a.Partition)) + "/" + strconv.FormatInt(a.Offset, 10) + " attempt " + strconv.Itoa(int(a.Attempt)) +
		" by " + a.node + " to " + a.Client + " (session " + strconv.FormatUint(a.Session, 10) + ") at " + a.At.Format(time.RFC3339Nano) +
		": " + a.out.Kind.String())
	if a.out.Detail != "" {
		b.WriteString(" (" + a.out.Detail + ")")
	}
	b.WriteString(" at " + a.out.At.Format(time.RFC3339Nano))
	switch {
	case a.seen == nil:
		b.WriteString("; no client logged it")
	case a.seen.outcome == 0:
		b.WriteString("; its client logged it, and no ack or nack")
	default:
		b.WriteString("; its client logged " + string(a.seen.outcome) + " at " + a.seen.doneAt.Format(time.RFC3339Nano))
	}
	return b.String()
}

func appendListed(xs []string, x string) []string {
	if len(xs) < maxListed {
		xs = append(xs, x)
	}
	return xs
}

// duplicateCause explains why cur delivered again the record prev (the
// client-logged delivery before it) had delivered.
func (v *verifier) duplicateCause(prev, cur *delivery) string {
	a, b := v.attemptOf(prev), v.attemptOf(cur)
	if b == nil {
		// A client stopped logs late what it was sent before: without the
		// daemon's log of cur, a fault of cur's client between the two
		// explains the order.
		role := cur.Role()
		if i := v.faultIn(prev.At, cur.At, func(f Fault) bool { return clientFault(f.Kind) && f.Target == role }, nil); i >= 0 {
			return faultCause(v.in.Faults[i].Kind)
		}
	}
	kind := deliverylog.Kind(0)
	switch {
	case a != nil && a.out.Kind != 0:
		kind = a.outcomeKind()
	case prev.outcome == EventNack:
		kind = deliverylog.Nack
	case prev.outcome == EventAck:
		kind = deliverylog.Ack
	}
	switch kind {
	case deliverylog.Nack:
		if prev.outcome == EventNack {
			// The daemon starts the delay when it reads the nack, after the
			// client logged it, and the next client logs the delivery after
			// it was sent: sooner, it was not honoured, unless the record
			// was served anew meanwhile (a delay is not stored).
			if cur.At.Sub(prev.doneAt) >= v.in.NackDelays[prev.Role()] || v.servedAnew(prev, cur, a, b) {
				return causeNack
			}
			return causeUnexplained
		}
	case deliverylog.Timeout:
		if a != nil && a.out.At.Sub(a.At) < v.in.AckTimeout-time.Millisecond {
			return causeUnexplained // timed out early
		}
		if a != nil && heldPastDeadline(prev, a.At.Add(v.in.AckTimeout)) {
			return causeTimeout
		}
	case deliverylog.Gone:
		if v.leftHolding(a) {
			return causeClientLeft
		}
		if v.closedByDaemon(a) {
			// The daemon sent its clients away (it stopped serving):
			// what served it ended.
			if c := v.replayCause(prev, cur, a, b); c != causeUnexplained {
				return c
			}
			// It kept the partition, and gave what the closed connection
			// held to another client: explained only by a fault that can
			// end what it serves while it closed the connection (in a
			// restart of Kafka, or its cut from it, a spread member sends
			// its clients away one after another before it hands over).
			if i := v.faultIn(a.At, a.out.At, func(f Fault) bool { return endsStretch(f, a.node) }, nil); i >= 0 {
				return faultCause(v.in.Faults[i].Kind)
			}
			return causeUnexplained
		}
	case 0:
		// Without the daemon's log: the client never answered it; the
		// daemon's deadline started before the client's log line.
		if cur.At.Sub(prev.At) >= v.in.AckTimeout*9/10 {
			return causeTimeout
		}
	default: // acked, or it ended unanswered with what served it
		return v.replayCause(prev, cur, a, b)
	}
	// A failure the client did not cause: a fault of its holder.
	role, node, from, to := prev.Role(), v.node(prev), prev.At, cur.At
	if a != nil {
		from = a.At
		if a.out.Kind != 0 {
			to = a.out.At
		}
	}
	if i := v.faultIn(from, to, func(f Fault) bool { return hitsHolder(f, role, node) }, nil); i >= 0 {
		return faultCause(v.in.Faults[i].Kind)
	}
	return causeUnexplained
}

// servedAnew reports whether cur comes from another stretch than prev's:
// what served prev ended (a handoff, a fault) and cur's daemon resumed from
// the committed offset.
func (v *verifier) servedAnew(prev, cur *delivery, a, b *attempt) bool {
	if v.h == nil {
		// Without the daemons' logs: a fault that can end what served it.
		node := v.node(prev)
		return v.faultIn(prev.doneAt, cur.At, func(f Fault) bool { return endsStretch(f, node) }, nil) >= 0
	}
	sa, sb := v.stretchOf(prev, a), v.stretchOf(cur, b)
	return sa != nil && sb != nil && sa != sb
}

// sentAt is when a client-logged delivery was sent, as its daemon's log
// says, or else when its client logged it: a stopped client logs late what
// it was sent before.
func (v *verifier) sentAt(d *delivery) time.Time {
	if a := v.attemptOf(d); a != nil {
		return a.At
	}
	return d.At
}

// stretchOf returns what served a client-logged delivery, or nil.
func (v *verifier) stretchOf(d *delivery, a *attempt) *stretch {
	if a != nil {
		return a.stretch
	}
	if v.h == nil {
		return nil
	}
	return v.h.stretchAt(v.node(d), d.Partition, d.At)
}

// replayCause explains a record delivered again after prev was acked (or
// ended unanswered, its daemon's stretch over): its partition restarted
// below it within the stretch, or cur comes from another stretch than
// prev's, which a handoff or a fault of prev's daemon ended.
func (v *verifier) replayCause(prev, cur *delivery, a, b *attempt) string {
	node := v.node(prev)
	if a != nil && a.out.Kind == deliverylog.Forgotten {
		return causeRestart
	}
	sa, sb := v.stretchOf(prev, a), v.stretchOf(cur, b)
	switch {
	case sa != nil && sa == sb:
		// The same stretch delivered it again: only after its source
		// restarted the partition below it (a new stretch starts each
		// partition where the store says: that is no restart).
		if v.h.restartedBelow(sa.node, cur.Partition, cur.Offset, prev.At, cur.At) {
			return causeRestart
		}
		return causeUnexplained
	case sa != nil && v.spread && sa.how == endRevoked && !sa.end.After(cur.At):
		return causeHandoff // its ownership moved
	case sa == nil && v.spread && v.ownerMoved(node, prev, cur):
		return causeHandoff
	}
	// Until what served prev ended, when its log says when (a process
	// killed ends it somewhere after its last line).
	to := cur.At
	if sa != nil && sa.how != endDied && sa.how != endOfLog && sa.end.Before(to) {
		to = sa.end
	}
	if i := v.faultIn(prev.At, to, func(f Fault) bool { return endsStretch(f, node) }, nil); i >= 0 {
		return faultCause(v.in.Faults[i].Kind)
	}
	return causeUnexplained
}

// ownerMoved reports whether the sampled ownership records show prev's
// partition owned by another member than prev's (or released) between prev
// and cur: without delivery logs, the evidence of a handoff.
func (v *verifier) ownerMoved(node string, prev, cur *delivery) bool {
	for _, o := range v.in.Owners {
		if o.Partition == prev.Partition && o.Owner != node && o.At.After(prev.At) && !o.At.After(cur.At) {
			return true
		}
	}
	return false
}

// deadLetterUnexplained checks the failures behind the dead letter of a
// record that is not poison, stored at dlAt: each of its attempts 1 to the
// failures its daemon counted must show a counted failure that is excused.
// It returns what is wrong, or "".
func (v *verifier) deadLetterUnexplained(k key, ds []*delivery, dlAt time.Time) string {
	if v.h == nil || len(v.h.deadLetters[k]) == 0 {
		return v.deadLetterUnexplainedByClients(ds, dlAt)
	}
	var de deadLetterEvent
	for _, e := range v.h.deadLetters[k] {
		if !e.at.After(dlAt) || de.at.IsZero() {
			de = e
		}
	}
	if int(de.failures) < v.in.MaxAttempts {
		return "its daemon " + de.node + " dead-lettered it after " + strconv.Itoa(int(de.failures)) + " failures"
	}
	for n := uint32(1); n <= de.failures; n++ {
		var last *attempt
		for _, a := range v.h.byRecord[k] {
			if a.Attempt == n && a.failedCounted() && !a.out.At.After(de.at) {
				last = a
			}
		}
		switch {
		case last == nil:
			return "no delivery log shows its attempt " + strconv.Itoa(int(n)) + " failing"
		case last.cause == causeUnexplained:
			return "nothing explains its failed attempt " + describe(last)
		}
	}
	return ""
}

// deadLetterUnexplainedByClients is deadLetterUnexplained without the
// daemons' logs: each attempt 1 to MaxAttempts needs a client-logged
// delivery of that attempt that failed (a nack, no ack, an ack after the
// ack timeout). A failure no client saw cannot be attributed.
func (v *verifier) deadLetterUnexplainedByClients(ds []*delivery, dlAt time.Time) string {
	for n := 1; n <= v.in.MaxAttempts; n++ {
		seen := false
		for _, d := range ds {
			if d.Attempt == n && !d.At.After(dlAt) && (d.outcome != EventAck || d.doneAt.Sub(d.At) >= v.in.AckTimeout) {
				seen = true
			}
		}
		if !seen {
			return "no client logged its attempt " + strconv.Itoa(n) + " failing, and no daemon's delivery log shows it"
		}
	}
	return ""
}
