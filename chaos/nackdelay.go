package chaos

import (
	"fmt"
	"slices"
	"time"
)

// delayStoreWindow is how long after a nack its delay may not be stored
// yet: the daemons store it with their next commit (every 500 ms in these
// runs); the rest is slack for a loaded machine.
const delayStoreWindow = 2 * time.Second

// checkDelayedNacks finds the records nacked with a delay (Input.NackDelays,
// by the nacking client's role) that came again sooner than the delay after
// the nack line (the daemon starts the delay when it reads the nack, after
// the line; a restored delay keeps its time), and counts those that no
// fault excuses (Result.EarlyNackRedeliveries). The daemons store a
// delay with the offsets, so that a failover or handoff keeps it; what can
// lose it is a fault before it was stored or while it could not be: of the
// daemon that delivered the record (killed, stopped, cut), from up to an
// ack timeout before the nack (a deposed leader delivers until its next
// commit fails) until delayStoreWindow after it; a restart of Kafka or
// ZooKeeper then; or a fault of the nacking client (its nack may never have
// been sent: the delivery comes back without the delay). The redelivery is
// the next delivery of a later attempt (clients log the daemon's attempt
// number: a nack that counts makes it grow, and the count is stored with
// the delay); a nack logged 90 % of the ack timeout or more after its
// delivery is not judged: the daemon may have timed the delivery out before
// it read the nack.
func checkDelayedNacks(res *Result, events []Event, in Input) {
	if len(in.NackDelays) == 0 {
		return
	}
	type ck struct {
		client string
		idx    uint64
	}
	deliveries := map[ck]Event{}
	again := map[key][]Event{} // each record's deliveries, in time order (events are sorted)
	for _, e := range events {
		if e.Kind == EventDeliver {
			deliveries[ck{e.Client, e.Index}] = e
			k := key{e.Partition, e.Offset}
			again[k] = append(again[k], e)
		}
	}
	for _, n := range events {
		delay := in.NackDelays[n.Role()]
		if n.Kind != EventNack || delay <= 0 {
			continue
		}
		d, ok := deliveries[ck{n.Client, n.Index}]
		if !ok || n.At.Sub(d.At) >= in.AckTimeout*9/10 {
			continue
		}
		// The next delivery of a later attempt: one of the same or an
		// earlier attempt logged after the nack was sent before it (a
		// stopped client logs late what it read before).
		ds := again[key{n.Partition, n.Offset}]
		i, _ := slices.BinarySearchFunc(ds, n.At, func(e Event, t time.Time) int { return e.At.Compare(t) })
		for i < len(ds) && (!ds[i].At.After(n.At) || ds[i].Attempt <= d.Attempt) {
			i++
		}
		if i == len(ds) || !ds[i].At.Before(n.At.Add(delay)) || delayLost(in, d, n) {
			continue
		}
		res.EarlyNackRedeliveries++
		if len(res.EarlyNackRedeliveriesAt) < maxListed {
			res.EarlyNackRedeliveriesAt = append(res.EarlyNackRedeliveriesAt, fmt.Sprintf(
				"%d/%d: attempt %d delivered by %s, nacked by %s at %s asking %v; attempt %d delivered by %s to %s at %s (%v after the nack)",
				n.Partition, n.Offset, d.Attempt, d.Member, n.Client, n.At.Format(time.RFC3339Nano), delay,
				ds[i].Attempt, ds[i].Member, ds[i].Client, ds[i].At.Format(time.RFC3339Nano), ds[i].At.Sub(n.At)))
		}
	}
}

// delayLost reports whether a fault could have lost the delay of nack n of
// delivery d (see checkDelayedNacks).
func delayLost(in Input, d, n Event) bool {
	daemon, known := in.Members[d.Member]
	for _, f := range in.Faults {
		if f.Start.After(n.At.Add(delayStoreWindow)) || f.End.Add(in.AckTimeout).Before(n.At) {
			continue
		}
		switch {
		case f.Kind == FaultKafkaRestart || f.Kind == FaultZKRestart:
			return true
		case clientFault(f.Kind) && f.Target == n.Role():
			return true
		case daemonFault(f.Kind) || f.Kind == FaultCutKafka || f.Kind == FaultCutZooKeeper || f.Kind == FaultCutClients:
			if !known || f.Target == daemon {
				return true
			}
		}
	}
	return false
}
