package dispatch

import "time"

// Retry timing. A failed delivery (ack timeout, nack, client gone) is
// redelivered at once, unless a delay applies: the one its nack asked for
// (NackInfo.Delay), else, with Config.RetryBackoffMin set, the backoff
// RetryBackoffMin·2^(failures−1) capped at RetryBackoffMax, jittered into
// its upper half (internal/backoff.Delay). Delayed messages wait in one
// min-heap by due time, shared by all (no timer or goroutine per message):
// the dispatcher's one timer is armed for the earliest of the ack deadlines
// and the due times (state.nextDeadline). While they wait they are buffered
// like any message: they count against MaxBuffered and MaxBufferedBytes, and
// hold their partition's committed offset (they are not acked). Their due
// times are stored with the partition's progress, and restored after a
// failover or restart (restore.go, progress.go).

// delayed is a redelivery waiting until due.
type delayed struct {
	msg  *Message
	last uint64 // the client that had it, to prefer another one
	due  time.Time
}

// delay puts m in the delay heap until due; last is the client that had it
// (0: none). The partition's progress changed: the next commit stores the
// due time (progress.go).
func (s *state) delay(m *Message, last uint64, due time.Time) {
	s.delays.push(delayed{msg: m, last: last, due: due})
	s.tracker.MarkProgress(m.Partition)
}

// delayHeap is a min-heap of delayed redeliveries by due time.
type delayHeap []delayed

func (h *delayHeap) push(d delayed) {
	*h = append(*h, d)
	h.up(len(*h) - 1)
}

// pop removes and returns the earliest; the heap must not be empty.
func (h *delayHeap) pop() delayed {
	old := *h
	d := old[0]
	last := len(old) - 1
	old[0] = old[last]
	old[last] = delayed{} // let the GC have it
	*h = old[:last]
	h.down(0)
	return d
}

// filter keeps the entries for which keep returns true and returns how many
// it removed.
func (h *delayHeap) filter(keep func(delayed) bool) int {
	n := len(*h)
	kept := (*h)[:0]
	for _, d := range *h {
		if keep(d) {
			kept = append(kept, d)
		}
	}
	clear((*h)[len(kept):])
	*h = kept
	for i := len(kept)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
	return n - len(kept)
}

func (h delayHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h[j].due.Before(h[i].due) {
			break
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

func (h delayHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		j := l
		if r := l + 1; r < len(h) && h[r].due.Before(h[l].due) {
			j = r
		}
		if !h[j].due.Before(h[i].due) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

// counts reports whether a failed delivery of m, for reason (how: the
// nack's, or Unprocessed for a client's goodbye or a connection the daemon
// closed), counts toward
// Config.MaxAttempts. These do not:
//   - a nack of a delivery the client never handed to its application
//     (NackInfo.Unprocessed: a client session retiring gives back what
//     arrives after it stopped taking work); nothing tried to process it;
//   - a delivery unanswered when its client said goodbye: it left
//     gracefully, not crashed by it (a retiring session gives a delivery
//     back once, and holds, unprocessed, what reaches it again until its
//     goodbye, when no other client had room); or when the daemon itself
//     closed the connection (LeaveShutdown: it stops serving);
//   - a disconnect within Config.DisconnectWindow of the disconnect last
//     counted for m: when clients drop together (a network cut, a pause of
//     the daemon itself), the message requeued by the first leave goes to
//     the next client, whose connection is just as dead but not yet seen
//     closed, and so on; each leave would burn an attempt of a message no
//     client saw. A poison message that kills every worker it reaches
//     still runs out of attempts, one per window.
func (s *state) counts(m *Message, reason int, how NackInfo, now time.Time) bool {
	switch {
	case how.Unprocessed:
		return false
	case reason == RedeliverDisconnect && s.disconnectWindow > 0 && m.failure == RedeliverDisconnect &&
		m.failed > 0 && now.UnixNano()-m.failedAt < int64(s.disconnectWindow):
		return false
	}
	return true
}

// failed records one more failed delivery of m at now, for its attempt
// count, the dead-letter record and the progress a commit stores.
func (s *state) failed(m *Message, reason int, why string, now time.Time) {
	if m.failed < 1<<32-1 {
		m.failed++
	}
	m.failure = uint8(reason)
	m.failedAt = now.UnixNano()
	if why != "" {
		m.reason = why
	}
	s.tracker.SetFailures(m.Partition, m.Offset, m.gen, m.failed)
}
