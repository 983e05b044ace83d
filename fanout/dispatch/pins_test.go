package dispatch

import (
	"bytes"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// bufferedBatch returns the messages from..to-1 of partition p whose values
// alias one fetched buffer of size bytes (each value 10 bytes of it).
func bufferedBatch(p int32, from, to int64, size int) (Batch, []byte) {
	mem := make([]byte, size)
	buf := &Buffer{Size: size}
	b := Batch{Partition: p, Start: -1, Buffers: []*Buffer{buf}}
	for o := from; o < to; o++ {
		i := int(o-from) * 10
		v := mem[i : i+10 : i+10]
		copy(v, []byte{byte(o), 1, 2, 3, 4, 5, 6, 7, 8, 9})
		b.Messages = append(b.Messages, &Message{Partition: p, Offset: o, Value: v, Buffer: buf,
			Headers: []Header{{Key: "k", Value: mem[size-2 : size-1 : size-1]}}})
	}
	return b, mem
}

// inside reports whether v lies in mem.
func inside(v, mem []byte) bool {
	if len(v) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	return p >= start && p < start+uintptr(len(mem))
}

// A buffer counts from the batch that brings it until a scan finds no
// message of it held; then it counts no more.
func TestBuffersCountedWhileHeld(t *testing.T) {
	t.Parallel()
	s, sinks := setup(10)
	b1, _ := bufferedBatch(0, 0, 5, 1000)
	b2, _ := bufferedBatch(0, 5, 10, 500)
	s.addBatch(b1, t0)
	s.addBatch(b2, t0)
	s.addBatch(b2, t0) // listed again (a re-fetch): counted once
	if s.pinned != 1500 {
		t.Fatalf("pinned %d, want 1500", s.pinned)
	}
	s.dispatch(t0)
	ds := sinks[0].got
	s.ack(1, ids(ds[:5])) // b1's messages done
	if got := s.scanBuffers(1<<20, t0); got != 500 {
		t.Fatalf("pinned after b1's messages were acked: %d, want 500", got)
	}
	s.ack(1, ids(ds[5:]))
	if got := s.scanBuffers(1<<20, t0); got != 0 || len(s.bufs) != 0 {
		t.Fatalf("pinned after every message was acked: %d (%d buffers), want 0", got, len(s.bufs))
	}
	if st := s.snapshot(); st.Pinned != 0 {
		t.Fatalf("Stats.Pinned %d, want 0", st.Pinned)
	}
}

// At the bound, a buffer its messages use less than half of is compacted:
// its messages get their bytes copied into a buffer of just those bytes,
// whatever state they are in; a connection writing one of them still reads
// the bytes it was given. A buffer used more than half stays.
func TestBuffersCompactedAtTheBound(t *testing.T) {
	t.Parallel()
	s, sinks := setup(4)
	// Each message holds 12 bytes: a value of 10, a header of 1 and 1.
	sparse, sparseMem := bufferedBatch(0, 0, 4, 1000) // 4 messages in 1000 bytes
	dense, denseMem := bufferedBatch(1, 0, 40, 420)   // 40 in 420
	s.addBatch(sparse, t0)
	s.addBatch(dense, t0)
	s.dispatch(t0) // 4 of partition 0 in flight; partition 1 buffered
	inFlight := sinks[0].got
	s.nack(1, ids(inFlight[:1]), NackInfo{Delay: time.Hour}, t0) // one waits out a delay
	if got := s.scanBuffers(2000, t0); got != 1420 {
		t.Fatalf("pinned %d below the bound, want 1420 (nothing compacted)", got)
	}
	if got := s.scanBuffers(1000, t0); got != 4*12+420 {
		t.Fatalf("pinned %d at the bound, want %d: the sparse buffer compacted, the dense one kept", got, 4*12+420)
	}
	if st := s.snapshot(); st.Compacted != 1000-4*12 {
		t.Fatalf("Stats.Compacted %d, want %d", st.Compacted, 1000-4*12)
	}
	for i, d := range inFlight {
		m := d.Msg
		if inside(m.Value, sparseMem) || inside(m.Headers[0].Value, sparseMem) || m.Buffer == sparse.Buffers[0] {
			t.Errorf("message %d still aliases the compacted buffer", i)
		}
		if m.Value[0] != byte(m.Offset) || !bytes.Equal(m.Value[1:], []byte{1, 2, 3, 4, 5, 6, 7, 8, 9}) {
			t.Errorf("message %d: value %v after compaction", i, m.Value)
		}
		_, v, hs := d.Payload()
		if !inside(v, sparseMem) || !inside(hs[0].Value, sparseMem) {
			t.Errorf("delivery %d: its payload is not what was delivered", i)
		}
	}
	for _, m := range dense.Messages {
		if !inside(m.Value, denseMem) {
			t.Fatalf("offset %d of the dense buffer moved", m.Offset)
		}
	}
	// Once their messages are done the new buffers count no more.
	s.ack(1, ids(inFlight[1:]))
	s.dropWaiting(func(*Message) bool { return true })
	if got := s.scanBuffers(1000, t0); got != 0 {
		t.Fatalf("pinned %d with nothing held, want 0", got)
	}
}

// A message handed to the DeadLetter gets bytes of its own: its producer
// reads them, and scans do not see it.
func TestDeadLetterOwnsItsBytes(t *testing.T) {
	t.Parallel()
	s, sinks := setup(1)
	dl := &recDeadLetter{}
	s.maxAttempts, s.deadLetter = 1, dl
	b, mem := bufferedBatch(0, 0, 1, 100)
	s.addBatch(b, t0)
	s.dispatch(t0)
	s.nack(1, ids(sinks[0].got), NackInfo{}, t0)
	if len(dl.sent) != 1 {
		t.Fatalf("%d records dead-lettered, want 1", len(dl.sent))
	}
	if m := dl.sent[0].Msg; inside(m.Value, mem) || m.Buffer != nil || m.Value[0] != 0 {
		t.Fatalf("the dead letter still aliases the fetched buffer (or lost its value %v)", m.Value)
	}
	if got := s.scanBuffers(1<<20, t0); got != 0 {
		t.Fatalf("pinned %d, want 0", got)
	}
}

// Fetching pauses while the buffers held reach MaxBufferedBytes, and
// resumes once a scan finds they do not: here a client holds one message of
// each of two buffers it uses most of, so compaction cannot help; its acks
// let them go.
func TestRunPausesWhileBuffersHeldReachTheBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{MaxBufferedBytes: 1000})
		k := newChanSink()
		h.d.Join(1, "a", 100, k)
		b1, _ := bufferedBatch(0, 0, 40, 600)
		b2, _ := bufferedBatch(0, 40, 80, 600)
		h.src.ch <- b1
		h.src.ch <- b2
		var ds []Delivery
		for range 80 {
			ds = append(ds, k.next(t))
		}
		testutil.WaitFor(t, 5*time.Second, "a pause for the buffers held", func() bool { return h.src.paused.Load() })
		if st := h.stats(t); st.Pinned != 1200 || st.Buffered != 0 {
			t.Fatalf("stats %+v, want 1200 bytes pinned and nothing buffered", st)
		}
		select {
		case h.src.ch <- batch(0, 80, 81):
			t.Fatal("a batch taken while the buffers held reach the bound")
		case <-time.After(time.Second):
		}
		for _, d := range ds {
			h.d.Ack(1, []uint64{d.ID})
		}
		h.src.ch <- batch(0, 80, 81)
		testutil.WaitFor(t, 5*time.Second, "fetching again", func() bool { return !h.src.paused.Load() })
		if st := h.stats(t); st.Pinned != 0 {
			t.Fatalf("%d bytes pinned with every message acked", st.Pinned)
		}
	})
}
