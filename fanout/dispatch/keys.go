package dispatch

import "hash/maphash"

// Key ordering (Config.KeyOrdering). Messages with the same Kafka key in
// the same partition go out in offset order, one at a time: a key's next
// message waits until the previous one is acked or dead-lettered. While one
// of its messages is out (in flight, waiting for a redelivery or a delay, or
// for the dead-letter topic), the key's gate is held by that message, and
// the key's later messages wait in a chain behind it, in arrival (offset)
// order. When the holder is done, the next in the chain holds the gate and
// goes to unblocked, which is served after redeliveries and before fresh
// messages. A redelivery keeps the order, as the holder keeps the gate
// across its attempts. Messages without a key are not ordered. Different
// keys go out in parallel.
//
// A key is known by a 64-bit hash of its partition and bytes: two keys that
// collide are ordered together, which costs parallelism, never order. The
// gates and chains cost a map entry per key with a message out and a pointer
// per message; the waiting messages are buffered (they count against
// MaxBuffered), so few keys with many messages make fetching pause while
// they drain.

// keyGate is a key with a message out: holder is that message; the key's
// later messages wait in the chain holder.keyNext … tail.
type keyGate struct {
	holder, tail *Message
}

// keyHash returns the gate key of m, never 0.
func (s *state) keyHash(m *Message) uint64 {
	// The partition is mixed in by a multiplication with an odd constant
	// (Fibonacci hashing): a bijection, so one key never collides with
	// itself across partitions unless the hash of its bytes does.
	k := maphash.Bytes(s.keySeed, m.Key) ^ (uint64(uint32(m.Partition))+1)*0x9e3779b97f4a7c15
	if k == 0 {
		return 1
	}
	return k
}

// takeKey lets m out if its key has no message out, making m the holder;
// otherwise m joins the end of the key's chain and takeKey returns false.
func (s *state) takeKey(m *Message) bool {
	g, busy := s.keys[m.keyHash]
	if !busy {
		s.keys[m.keyHash] = keyGate{holder: m, tail: m}
		return true
	}
	g.tail.keyNext = m
	g.tail = m
	s.keys[m.keyHash] = g
	s.keyWaiting++
	return false
}

// keyDone ends m's hold on its key (acked, dead-lettered, or forgotten): the
// next message of the key, if any, holds the gate and goes to unblocked.
func (s *state) keyDone(m *Message) {
	g, ok := s.keys[m.keyHash]
	if !ok || g.holder != m {
		return // never held it (unordered), or its gate was dropped by a restart
	}
	next := m.keyNext
	m.keyNext = nil
	if next == nil {
		delete(s.keys, m.keyHash)
		return
	}
	g.holder = next
	s.keys[m.keyHash] = g
	s.keyWaiting--
	s.unblocked.push(next)
}

// dropKeys drops from the gates the messages for which gone returns true
// (a restart or a handoff forgot them) and returns how many waited in the
// chains. dropped are the forgotten messages that were buffered (not in
// flight): a gate whose holder is one of them passes to the first message
// of its chain that is not forgotten. A forgotten holder in flight keeps its
// gate until its flight comes back or is dropped (keyDone).
func (s *state) dropKeys(gone func(*Message) bool, dropped []*Message) int {
	n := 0
	buffered := make(map[*Message]bool, len(dropped))
	for _, m := range dropped {
		buffered[m] = true
	}
	for h, g := range s.keys {
		// Unlink the forgotten messages of the chain.
		prev := g.holder
		for m := prev.keyNext; m != nil; m = prev.keyNext {
			if !gone(m) {
				prev = m
				continue
			}
			prev.keyNext = m.keyNext
			m.keyNext = nil
			s.keyWaiting--
			s.bytes -= m.Size()
			n++
		}
		g.tail = prev
		if !buffered[g.holder] {
			s.keys[h] = g
			continue
		}
		// The holder was dropped from a queue: the next one holds the gate.
		next := g.holder.keyNext
		g.holder.keyNext = nil
		if next == nil {
			delete(s.keys, h)
			continue
		}
		s.keys[h] = keyGate{holder: next, tail: g.tail}
		s.keyWaiting--
		s.unblocked.push(next)
	}
	return n
}
