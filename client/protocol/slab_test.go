package protocol

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/proto"
)

// slabStream returns a stream of about 3.5 MiB: DeliverBatch frames of
// values from 1 B to 200 KiB, pings and Deliver frames between them, and a
// frame larger than a slab; and the frames' bytes (length prefix excluded),
// in order.
func slabStream(t *testing.T) (stream []byte, frames [][]byte) {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf, 4<<20)
	add := func(write func() error) {
		t.Helper()
		before := buf.Len()
		if err := write(); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, slices.Clone(buf.Bytes()[before+HeaderSize:]))
	}
	id := uint64(0)
	for i := range 60 {
		size := []int{1, 100, 1024, 7000, 200 << 10}[i%5]
		var ds []*Deliver
		for range 1 + i%7 {
			id++
			v := bytes.Repeat([]byte{byte(id)}, size)
			ds = append(ds, &Deliver{DeliveryId: id, Partition: int32(i % 3), Offset: int64(id), Value: v,
				Headers: []*Header{{Key: "n", Value: []byte(fmt.Sprint(id))}}})
		}
		add(func() error {
			_, err := w.WriteDeliverBatch(ds, 256<<10)
			return err
		})
		if i%4 == 0 {
			add(func() error { return w.WriteFrame(PingFrame(uint64(i))) })
		}
		if i%9 == 0 {
			id++
			add(func() error { return w.WriteDeliver(&Deliver{DeliveryId: id, Value: []byte("one")}) })
		}
		if i == 30 {
			id++
			big := &Deliver{DeliveryId: id, Value: bytes.Repeat([]byte{'L'}, slabSize+100)}
			add(func() error { return w.WriteFrame(DeliverFrame(big)) })
		}
	}
	return buf.Bytes(), frames
}

// TestSlabReaderAcrossSlabs reads a stream of several slabs, whole and in
// chunks of several sizes: every frame comes out as proto.Unmarshal decodes
// it, and the bytes of every Batch, all kept until the end while the
// collector runs, are still the frame's: a slab is not written again while
// a batch references it.
func TestSlabReaderAcrossSlabs(t *testing.T) {
	t.Parallel()
	stream, frames := slabStream(t)
	for _, chunk := range []int{len(stream), 300 << 10, 65536, 1000} {
		t.Run(fmt.Sprintf("chunks of %d", chunk), func(t *testing.T) {
			t.Parallel()
			r := NewSlabReader(&splitReader{data: stream, size: chunk}, 4<<20)
			type kept struct {
				b    *Batch
				want []byte
			}
			var keep []kept
			for i, raw := range frames {
				var want Frame
				if err := proto.Unmarshal(raw, &want); err != nil {
					t.Fatal(err)
				}
				b := new(Batch)
				var f Frame
				ok, err := r.ReadBatch(&f, b)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if ok != (want.GetDeliver() != nil || want.GetDeliverBatch() != nil) {
					t.Fatalf("frame %d: ReadBatch says deliveries %v for %v", i, ok, &want)
				}
				if !ok {
					if !proto.Equal(&f, &want) {
						t.Fatalf("frame %d: %v, want %v", i, &f, &want)
					}
					continue
				}
				checkDeliveries(t, b, &want)
				if !bytes.Equal(b.Buf, raw) || cap(b.Buf) != len(b.Buf) {
					t.Fatalf("frame %d: Buf is not the frame's bytes, capped at their length", i)
				}
				keep = append(keep, kept{b, raw})
				if i%10 == 0 {
					runtime.GC()
				}
			}
			if _, err := r.ReadBatch(new(Frame), new(Batch)); err != io.EOF {
				t.Fatalf("at the end: %v", err)
			}
			runtime.GC()
			for i, k := range keep {
				if !bytes.Equal(k.b.Buf, k.want) {
					t.Fatalf("batch %d: its bytes were written again while referenced", i)
				}
			}
		})
	}
}

// countingReader counts the Read calls that returned bytes.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.reads++
	}
	return n, err
}

// A slab Reader takes a burst of frames that has arrived in one read, and
// a frame that arrives in pieces with a read per piece, never one per
// frame.
func TestSlabReaderReadsManyFramesAtOnce(t *testing.T) {
	t.Parallel()
	var frames []*Frame
	for i := range 500 {
		frames = append(frames, DeliverBatchFrame([]*Deliver{{DeliveryId: uint64(i), Value: make([]byte, 1000)}}))
	}
	stream := encodeFrames(t, frames...)
	src := &countingReader{r: bytes.NewReader(stream)}
	r := NewSlabReader(src, 0)
	var f Frame
	var b Batch
	for i := range frames {
		if ok, err := r.ReadBatch(&f, &b); !ok || err != nil {
			t.Fatalf("frame %d: %v, %v", i, ok, err)
		}
	}
	if src.reads != 1 {
		t.Errorf("%d reads for %d frames (%d bytes) available at once, want 1", src.reads, len(frames), len(stream))
	}
	big := encodeFrames(t, DeliverBatchFrame([]*Deliver{{Value: make([]byte, 200<<10)}}))
	src = &countingReader{r: iotest.HalfReader(bytes.NewReader(big))}
	if ok, err := NewSlabReader(src, 0).ReadBatch(&f, &b); !ok || err != nil {
		t.Fatalf("a frame in pieces: %v, %v", ok, err)
	}
	if src.reads > 20 {
		t.Errorf("%d reads for a frame of %d bytes arriving in halves", src.reads, len(big))
	}
}

// TestSlabsReused: once no batch references a slab, the collector hands it
// back and the next slab a reader needs is that one; a slab a batch still
// references is not handed back. Not parallel: the slabs kept for reuse
// are the process's, and another test's reader would take them.
func TestSlabsReused(t *testing.T) {
	stream, frames := slabStream(t)
	r := NewSlabReader(bytes.NewReader(stream), 4<<20)
	var f Frame
	var held *Batch // a batch of the first slab, kept
	var first *slab
	for range frames {
		b := new(Batch)
		ok, err := r.ReadBatch(&f, b)
		if err != nil {
			t.Fatal(err)
		}
		if held == nil && ok {
			held, first = b, r.sl.cur
		}
	}
	if r.sl.cur == first {
		t.Fatal("the stream fit in one slab")
	}
	want := slices.Clone(held.Buf)
	r = nil
	freed := func() bool {
		slabFree.mu.Lock()
		defer slabFree.mu.Unlock()
		return len(slabFree.slabs) > 0
	}
	for i := 0; !freed(); i++ {
		if i == 1000 {
			t.Fatal("no slab handed back after 1000 collections")
		}
		runtime.GC() // finalizers run on their own goroutine: let it run
		runtime.Gosched()
	}
	slabFree.mu.Lock()
	reused := slices.Clone(slabFree.slabs)
	slabFree.mu.Unlock()
	if slices.Contains(reused, first) || !bytes.Equal(held.Buf, want) {
		t.Fatal("the slab of a batch still referenced was handed back for reuse")
	}
	next := newSlab()
	if !slices.Contains(reused, next) {
		t.Fatal("a new slab was allocated while one was free")
	}
	runtime.KeepAlive(held)
}

func TestDeliveriesBuffered(t *testing.T) {
	t.Parallel()
	batch := DeliverBatchFrame([]*Deliver{{DeliveryId: 1, Value: []byte("v")}})
	stream := encodeFrames(t, batch, batch, PingFrame(1), batch)
	last := encodeFrames(t, batch)
	stream = append(stream, last[:len(last)-1]...) // the last frame cut short
	r := NewSlabReader(bytes.NewReader(stream), 0)
	var f Frame
	var b Batch
	for i, want := range []bool{true, false, true, false} { // after frame i: is a whole delivery frame buffered?
		if _, err := r.ReadBatch(&f, &b); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got := r.DeliveriesBuffered(); got != want {
			t.Fatalf("after frame %d: DeliveriesBuffered %v, want %v", i, got, want)
		}
	}
	if NewReader(bytes.NewReader(stream), 0).DeliveriesBuffered() {
		t.Fatal("a bufio Reader says deliveries are buffered")
	}
	// A frame above the limit is not taken for one: ReadBatch refuses it.
	ping := encodeFrames(t, PingFrame(1))
	r = NewSlabReader(bytes.NewReader(append(ping, encodeFrames(t, batch)...)), len(ping)-HeaderSize)
	if err := r.ReadFrame(&f); err != nil {
		t.Fatal(err)
	}
	if r.DeliveriesBuffered() {
		t.Fatal("a frame above the limit is said to be buffered")
	}
}
