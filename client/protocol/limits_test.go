package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// idsFrame returns an encoded Ack frame body (no length prefix) of n ids,
// each a one-byte varint: the densest list a peer can send.
func idsFrame(field protowire.Number, n int) []byte {
	inner := protowire.AppendTag(nil, 1, protowire.BytesType)
	inner = protowire.AppendVarint(inner, uint64(n))
	inner = append(inner, bytes.Repeat([]byte{1}, n)...)
	b := protowire.AppendTag(nil, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(inner)))
	return append(b, inner...)
}

func TestTooManyIDs(t *testing.T) {
	t.Parallel()
	unpacked := func(n int) []byte { // field 5 holding n unpacked ids
		var inner []byte
		for range n {
			inner = protowire.AppendTag(inner, 1, protowire.VarintType)
			inner = protowire.AppendVarint(inner, 300)
		}
		b := protowire.AppendTag(nil, fieldAck, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(inner)))
		return append(b, inner...)
	}
	tests := []struct {
		name string
		body []byte
		want int // ids counted
	}{
		{"ack packed", idsFrame(fieldAck, 11), 11},
		{"nack packed", idsFrame(fieldNack, 11), 11},
		{"touch packed", idsFrame(fieldTouch, 11), 11},
		{"ack unpacked", unpacked(11), 11},
		// protobuf merges repeated occurrences of a message field: the ids of
		// both count, as Unmarshal would decode both.
		{"two acks of six", append(idsFrame(fieldAck, 6), idsFrame(fieldAck, 6)...), 12},
		{"ack after an unknown field", append(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1), idsFrame(fieldAck, 11)...), 11},
		{"multi-byte ids", mustMarshal(t, AckFrame([]uint64{1 << 62, 1 << 40, 300, 1, 2, 3, 4, 5, 6, 7, 8})), 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := countIDs(tc.body); got != tc.want {
				t.Errorf("countIDs = %d, want %d", got, tc.want)
			}
			ping := mustMarshal(t, PingFrame(9))
			stream := append(rawFrame(uint32(len(tc.body)), tc.body), rawFrame(uint32(len(ping)), ping)...)
			r := NewReader(bytes.NewReader(stream), 0)
			r.SetMaxIDs(10)
			var f Frame
			var tooMany *TooManyIDsError
			if err := r.ReadFrame(&f); !errors.As(err, &tooMany) || tooMany.Count != tc.want || tooMany.Max != 10 {
				t.Fatalf("ReadFrame: %v, want *TooManyIDsError{%d, 10}", err, tc.want)
			}
			if CodeOf(fmt.Errorf("read: %w", tooMany)) != ErrorCode_ERROR_CODE_TOO_MANY_IDS {
				t.Errorf("CodeOf(%v) = %v", tooMany, CodeOf(tooMany))
			}
			// The frame was read whole: the stream is still in step.
			if err := r.ReadFrame(&f); err != nil || f.GetPing().GetNonce() != 9 {
				t.Fatalf("next frame: %v, %v; want ping 9", &f, err)
			}
			// At the limit, the frame decodes.
			r = NewReader(bytes.NewReader(rawFrame(uint32(len(tc.body)), tc.body)), 0)
			r.SetMaxIDs(tc.want)
			if err := r.ReadFrame(&f); err != nil {
				t.Fatalf("ReadFrame at the limit: %v", err)
			}
		})
	}
}

// A 4 MiB Ack of one-byte ids would decode into 4 million ids (32 MiB). With
// a limit it is refused before a single id is allocated: what is allocated
// is the frame's bytes (the read buffer, released after it).
func TestTooManyIDsAllocatesNoIDs(t *testing.T) {
	// Not parallel: it reads the whole process's allocation counters.
	body := idsFrame(fieldAck, DefaultMaxFrameSize-16)
	stream := rawFrame(uint32(len(body)), body)
	r := NewReader(bytes.NewReader(stream), 0)
	r.SetMaxIDs(1000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var f Frame
	err := r.ReadFrame(&f)
	runtime.ReadMemStats(&after)
	var tooMany *TooManyIDsError
	if !errors.As(err, &tooMany) {
		t.Fatalf("ReadFrame: %v, want *TooManyIDsError", err)
	}
	// The read buffer grows by doubling up to 4 MiB: about 8 MiB in all.
	// Decoding the ids alone would allocate 32 MiB more.
	if got := after.TotalAlloc - before.TotalAlloc; got > 12<<20 {
		t.Errorf("reading a refused 4 MiB ack allocated %d MiB, want < 12 MiB (no ids decoded)", got>>20)
	}
	if cap(r.buf) > keepBuffer {
		t.Errorf("read buffer kept at %d bytes after the frame", cap(r.buf))
	}
}

// After a frame larger than keepBuffer the Reader lets go of its buffer; a
// stream of small frames keeps one small buffer.
func TestReadBufferShrinksAfterLargeFrame(t *testing.T) {
	t.Parallel()
	big := DeliverFrame(&Deliver{DeliveryId: 1, Value: make([]byte, 1<<20)})
	small := AckFrame([]uint64{1, 2, 3})
	mid := DeliverFrame(&Deliver{DeliveryId: 2, Value: make([]byte, 40<<10)}) // above the bufio size, below keepBuffer
	r := NewReader(bytes.NewReader(encodeFrames(t, mid, big, small, mid, mid)), 2<<20)
	var f Frame
	if err := r.ReadFrame(&f); err != nil {
		t.Fatal(err)
	}
	kept := cap(r.buf)
	if kept == 0 || kept > keepBuffer {
		t.Fatalf("buffer of %d bytes after a 40 KiB frame, want one kept below %d", kept, keepBuffer)
	}
	if err := r.ReadFrame(&f); err != nil || len(f.GetDeliver().GetValue()) != 1<<20 {
		t.Fatalf("big frame: %v", err)
	}
	if cap(r.buf) > keepBuffer {
		t.Errorf("buffer of %d bytes kept after a 1 MiB frame, want at most %d", cap(r.buf), keepBuffer)
	}
	for i := range 3 {
		if err := r.ReadFrame(&f); err != nil {
			t.Fatalf("frame %d after the big one: %v", i, err)
		}
	}
	if c := cap(r.buf); c == 0 || c > keepBuffer {
		t.Errorf("buffer of %d bytes after 40 KiB frames", c)
	}
}

func TestSetMaxFrameSize(t *testing.T) {
	t.Parallel()
	hello := HelloFrame(&Hello{ClientId: string(bytes.Repeat([]byte("x"), 5000)), ProtocolVersion: Version})
	stream := encodeFrames(t, hello, hello)
	r := NewReader(bytes.NewReader(stream), 4096)
	var f Frame
	var tooLarge *FrameTooLargeError
	if err := r.ReadFrame(&f); !errors.As(err, &tooLarge) || tooLarge.Max != 4096 {
		t.Fatalf("ReadFrame under a 4 KiB limit: %v, want *FrameTooLargeError", err)
	}
	r = NewReader(bytes.NewReader(stream), 4096)
	r.SetMaxFrameSize(8192)
	if err := r.ReadFrame(&f); err != nil || !proto.Equal(&f, hello) {
		t.Fatalf("ReadFrame under a raised limit: %v", err)
	}
	r.SetMaxFrameSize(0)
	if r.max != DefaultMaxFrameSize {
		t.Errorf("SetMaxFrameSize(0): limit %d, want the default", r.max)
	}
}

// Whatever the bytes, countIDs never counts fewer ids and ranges than
// Unmarshal decodes, so that a frame under the limit cannot allocate more.
func FuzzCountIDs(f *testing.F) {
	f.Add(idsFrame(fieldAck, 3))
	f.Add([]byte{0x2a, 0x06, 0x08, 0x01, 0x12, 0x02, 0x05, 0x03})                     // ack: id 1, range 5..7
	f.Add([]byte{0x32, 0x07, 0x10, 0x05, 0x10, 0x02, 0x12, 0x01, 0x09})               // nack: ranges unpacked, then packed
	f.Add(append([]byte{0x2a, 0x02, 0x10, 0x05}, 0x3a, 0x04, 0x12, 0x02, 0x07, 0x01)) // ack replaced by touch
	f.Add(append(idsFrame(fieldNack, 2), idsFrame(fieldNack, 2)...))
	f.Add([]byte{0x2a, 0x04, 0x08, 0x01, 0x08, 0x02})
	f.Add([]byte{0x3a, 0x03, 0x0a, 0x01, 0x80})
	f.Fuzz(func(t *testing.T, body []byte) {
		n := countIDs(body)
		var fr Frame
		if proto.Unmarshal(body, &fr) != nil {
			return
		}
		ids, ranges, _ := idsOf(&fr)
		if len(ids)+len(ranges)/2 > n {
			t.Fatalf("countIDs = %d, Unmarshal decoded %d ids and %d range values", n, len(ids), len(ranges))
		}
	})
}

func mustMarshal(tb testing.TB, f *Frame) []byte {
	tb.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// rangesFrame returns an encoded Frame body of the body field holding the
// ids listed and the ranges.
func rangesFrame(field protowire.Number, ids, ranges []uint64) []byte {
	var inner []byte
	if len(ids) > 0 {
		inner = protowire.AppendTag(inner, 1, protowire.BytesType)
		var packed []byte
		for _, id := range ids {
			packed = protowire.AppendVarint(packed, id)
		}
		inner = append(protowire.AppendVarint(inner, uint64(len(packed))), packed...)
	}
	if len(ranges) > 0 {
		inner = protowire.AppendTag(inner, 2, protowire.BytesType)
		var packed []byte
		for _, v := range ranges {
			packed = protowire.AppendVarint(packed, v)
		}
		inner = append(protowire.AppendVarint(inner, uint64(len(packed))), packed...)
	}
	b := protowire.AppendTag(nil, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(inner)))
	return append(b, inner...)
}

func TestCheckRanges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ranges []uint64
		n      uint64
		bad    bool
	}{
		{nil, 0, false},
		{[]uint64{10, 1}, 1, false},
		{[]uint64{10, 5, 1, 2, 100, 1000}, 1007, false},
		{[]uint64{math.MaxUint64, 1}, 1, false},
		{[]uint64{math.MaxUint64 - 9, 10}, 10, false},
		{[]uint64{0, math.MaxUint64}, math.MaxUint64, false},
		{[]uint64{0, math.MaxUint64, 5, 5}, math.MaxUint64, false}, // saturated
		{[]uint64{10}, 0, true},                                    // no count
		{[]uint64{10, 0}, 0, true},                                 // names nothing
		{[]uint64{math.MaxUint64 - 9, 11}, 0, true},                // past the largest id
		{[]uint64{1, 1, math.MaxUint64, 2}, 0, true},               // the second runs past it
	}
	for _, tc := range tests {
		n, err := CheckRanges(tc.ranges)
		if tc.bad != (err != nil) || (err != nil && !errors.Is(err, ErrBadFrame)) || n != tc.n {
			t.Errorf("CheckRanges(%v) = %d, %v; want %d, bad %v", tc.ranges, n, err, tc.n, tc.bad)
		}
	}
}

func TestReadFrameRanges(t *testing.T) {
	t.Parallel()
	for _, field := range []protowire.Number{fieldAck, fieldNack, fieldTouch} {
		t.Run(fmt.Sprint("field ", field), func(t *testing.T) {
			ping := mustMarshal(t, PingFrame(9))
			read := func(body []byte, maxIDs int) (*Frame, error) {
				t.Helper()
				stream := append(rawFrame(uint32(len(body)), body), rawFrame(uint32(len(ping)), ping)...)
				r := NewReader(bytes.NewReader(stream), 0)
				r.SetMaxIDs(maxIDs)
				var f Frame
				err := r.ReadFrame(&f)
				// Whatever the outcome, the stream is in step.
				var next Frame
				if err := r.ReadFrame(&next); err != nil || next.GetPing().GetNonce() != 9 {
					t.Fatalf("frame after %x: %v, %v", body, &next, err)
				}
				return &f, err
			}
			f, err := read(rangesFrame(field, []uint64{1, 2}, []uint64{10, 5}), 7)
			ids, ranges, ok := idsOf(f)
			if err != nil || !ok || fmt.Sprint(ids, ranges) != "[1 2] [10 5]" {
				t.Fatalf("ReadFrame: %v, %v", f, err)
			}
			var tooMany *TooManyIDsError
			if _, err := read(rangesFrame(field, []uint64{1, 2}, []uint64{10, 5}), 6); !errors.As(err, &tooMany) || *tooMany != (TooManyIDsError{Count: 7, Max: 6}) {
				t.Fatalf("7 ids under a limit of 6: %v", err)
			}
			// A range of 2^64-1 ids is refused, not overflowed.
			if _, err := read(rangesFrame(field, nil, []uint64{0, math.MaxUint64, 7, 2}), 100); !errors.As(err, &tooMany) || tooMany.Max != 100 {
				t.Fatalf("a huge range: %v", err)
			}
			for _, bad := range [][]uint64{{10}, {10, 0}, {math.MaxUint64, 2}} {
				if _, err := read(rangesFrame(field, nil, bad), 0); !errors.Is(err, ErrBadFrame) {
					t.Fatalf("ranges %v: %v, want ErrBadFrame", bad, err)
				}
			}
		})
	}
}

// An Ack of many one-byte ranges is refused before any is decoded, as one
// of ids is.
func TestTooManyRangesAllocatesNone(t *testing.T) {
	// Not parallel: it reads the whole process's allocation counters.
	pairs := make([]uint64, 2*(1<<20))
	for i := range pairs {
		pairs[i] = 1
	}
	body := rangesFrame(fieldAck, nil, pairs)
	stream := rawFrame(uint32(len(body)), body)
	r := NewReader(bytes.NewReader(stream), 0)
	r.SetMaxIDs(1000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := r.ReadFrame(new(Frame))
	runtime.ReadMemStats(&after)
	var tooMany *TooManyIDsError
	if !errors.As(err, &tooMany) || tooMany.Count != 1<<20 {
		t.Fatalf("ReadFrame: %v, want *TooManyIDsError of %d", err, 1<<20)
	}
	// The read buffer: about 2 x 2 MiB. Decoding would allocate 16 MiB more.
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Errorf("reading a refused 2 MiB ack allocated %d MiB, want < 8 MiB", got>>20)
	}
}
