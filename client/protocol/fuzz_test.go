package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/proto"
)

// fuzzMax is the frame size limit in the fuzz targets, small enough that
// declared lengths above it are easy to reach.
const fuzzMax = 1 << 16

// readFrameSeeds returns streams for FuzzReadFrame: valid frames of every
// type, several in a row, truncated frames, huge, zero and odd lengths.
func readFrameSeeds(tb testing.TB) [][]byte {
	var all []*Frame
	var seeds [][]byte
	for _, tc := range sampleFrames() {
		one := encodeFrames(tb, tc.frame)
		seeds = append(seeds, one, one[:len(one)-1], one[:HeaderSize+1])
		all = append(all, tc.frame)
	}
	seeds = append(seeds,
		encodeFrames(tb, all...),
		nil,
		[]byte{0, 0},
		rawFrame(0, nil),
		rawFrame(1<<32-1, []byte{0x42, 0x00}),
		rawFrame(fuzzMax+1, nil),
		rawFrame(fuzzMax, nil),
		rawFrame(2, []byte{0x60, 0x01}),             // unknown field only
		rawFrame(4, []byte{0x42, 0x02, 0x08, 0x01}), // ping with nonce 1
		rawFrame(6, []byte{0x2a, 0x04, 0x08, 0x01, 0x08, 0x02}), // ack ids unpacked
		rawFrame(5, []byte{0x5a, 0x03, 0x0a, 0x01, 0xff}),       // goodbye, invalid UTF-8
		[]byte("\x00\x00\x00\x10GET / HTTP/1.1\r\n"),
		[]byte("GET / HTTP/1.1\r\nHost: fanout\r\n\r\n"),                 // an HTTP client
		[]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"),  // an HTTP server
		append(encodeFrames(tb, PingFrame(1)), "HTTP/1.1 200 OK\r\n"...), // HTTP's bytes later: a length
	)
	// Capabilities and member lists: the paths protobuf decodes for them.
	seeds = append(seeds,
		rawFrame(7, []byte{0x0a, 0x05, 0x10, 0x01, 0x32, 0x01, 0x01}),             // hello with CAPABILITY_MEMBERS
		rawFrame(7, []byte{0x0a, 0x05, 0x30, 0x01, 0x30, 0xac, 0x02}),             // hello, capabilities unpacked, one unknown
		rawFrame(7, []byte{0x62, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xff}),             // members, invalid UTF-8 address
		rawFrame(9, []byte{0x62, 0x07, 0x0a, 0x05, 0x0a, 0x01, 0x61, 0x10, 0x01}), // members, member with an unknown field
		rawFrame(4, []byte{0x62, 0x02, 0x0a, 0x00}),                               // members, one empty member
		rawFrame(6, []byte{0x12, 0x04, 0x52, 0x02, 0x0a, 0x00}),                   // welcome, one empty member
	)
	// Deliver frames for the fast path, and bodies it must leave to
	// proto.Unmarshal.
	for _, tc := range deliverCases() {
		if b, err := marshalDeliver(tb, tc.d); err == nil && len(b) <= 4<<10 {
			seeds = append(seeds, b)
		}
	}
	for _, tc := range rawDeliverCases() {
		seeds = append(seeds, rawFrame(uint32(len(tc.body)), tc.body))
	}
	// DeliverBatch frames and id ranges.
	for _, tc := range rawBatchCases() {
		seeds = append(seeds, rawFrame(uint32(len(tc.body)), tc.body))
	}
	for _, body := range [][]byte{
		rangesFrame(fieldAck, []uint64{1, 2}, []uint64{10, 5}),
		rangesFrame(fieldNack, nil, []uint64{1 << 40, 1000}),
		rangesFrame(fieldTouch, nil, []uint64{7}),
		rangesFrame(fieldAck, nil, []uint64{5, 0}),
		rangesFrame(fieldAck, nil, []uint64{math.MaxUint64, 2}),
	} {
		seeds = append(seeds, rawFrame(uint32(len(body)), body))
	}
	return seeds
}

func FuzzReadFrame(f *testing.F) {
	for _, seed := range readFrameSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), fuzzMax)
		rest := data // what a reference parser has not consumed yet
		for first := true; ; first = false {
			var got Frame
			err := r.ReadFrame(&got)
			// A reference parse of the same frame.
			want, size, wantErr := referenceFrame(rest, first)
			if len(rest) >= HeaderSize+size && decodeDeliver(rest[HeaderSize:HeaderSize+size]) != nil && wantErr != nil {
				t.Fatalf("Deliver fast path decoded a frame proto.Unmarshal refuses: %v", wantErr)
			}
			if wantErr != nil {
				if !sameError(err, wantErr) {
					t.Fatalf("ReadFrame error %v, reference says %v", err, wantErr)
				}
				if errors.Is(err, ErrBadFrame) {
					rest = rest[HeaderSize+size:]
					continue // the stream is still in step
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadFrame: %v, reference decoded %v", err, want)
			}
			body := rest[HeaderSize : HeaderSize+size]
			rest = rest[HeaderSize+size:]
			if !proto.Equal(&got, want) {
				t.Fatalf("ReadFrame = %v, reference decoded %v", &got, want)
			}
			// Also nil against empty bytes, for the Deliver fast path.
			checkSameAsUnmarshal(t, body, &got)
			checkReencode(t, &got)
		}
	})
}

// referenceFrame parses the first frame of data independently of Reader,
// returning the frame, its declared size and the error ReadFrame must give.
// first says data starts the stream, where HTTP's first bytes are refused.
func referenceFrame(data []byte, first bool) (*Frame, int, error) {
	switch {
	case len(data) == 0:
		return nil, 0, io.EOF
	case len(data) < HeaderSize:
		return nil, 0, io.ErrUnexpectedEOF
	}
	if first {
		for _, s := range []string{"HTTP", "GET ", "HEAD", "POST", "PUT ", "DELE", "CONN", "OPTI", "TRAC", "PATC", "PRI "} {
			if string(data[:HeaderSize]) == s {
				return nil, 0, &HTTPError{Start: s}
			}
		}
	}
	size := binary.BigEndian.Uint32(data)
	switch {
	case size > fuzzMax:
		return nil, 0, &FrameTooLargeError{Size: uint64(size), Max: fuzzMax}
	case uint64(len(data)-HeaderSize) < uint64(size):
		return nil, 0, io.ErrUnexpectedEOF
	}
	var f Frame
	if err := proto.Unmarshal(data[HeaderSize:HeaderSize+int(size)], &f); err != nil {
		return nil, int(size), ErrBadFrame
	}
	if f.Body == nil || !rangesValid(&f) {
		return nil, int(size), ErrBadFrame
	}
	return &f, int(size), nil
}

// rangesValid is the reference rule for the ranges of an Ack, Nack or
// Touch: pairs of a first id and a count of at least one, ending at or
// before the largest id.
func rangesValid(f *Frame) bool {
	var ranges []uint64
	switch {
	case f.GetAck() != nil:
		ranges = f.GetAck().GetRanges()
	case f.GetNack() != nil:
		ranges = f.GetNack().GetRanges()
	case f.GetTouch() != nil:
		ranges = f.GetTouch().GetRanges()
	}
	if len(ranges)%2 == 1 {
		return false
	}
	for i := 0; i < len(ranges); i += 2 {
		if ranges[i+1] == 0 || ranges[i+1]-1 > math.MaxUint64-ranges[i] {
			return false
		}
	}
	return true
}

func sameError(got, want error) bool {
	var g, w *FrameTooLargeError
	var gh, wh *HTTPError
	switch {
	case errors.As(want, &w):
		return errors.As(got, &g) && *g == *w
	case errors.As(want, &wh):
		return errors.As(got, &gh) && *gh == *wh
	case want == io.EOF:
		return got == io.EOF
	}
	return errors.Is(got, want)
}

// checkReencode encodes f, which was decoded, and decodes it again: it must
// encode and come back equal.
func checkReencode(t *testing.T, f *Frame) {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf, fuzzMax)
	if err := w.WriteFrame(f); err != nil {
		t.Fatalf("re-encoding decoded frame %v: %v", f, err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf, fuzzMax)
	var again Frame
	if err := r.ReadFrame(&again); err != nil {
		t.Fatalf("decoding re-encoded frame %v: %v", f, err)
	}
	if !proto.Equal(f, &again) {
		t.Fatalf("re-encoded frame decodes to %v, want %v", &again, f)
	}
	if err := r.ReadFrame(&again); err != io.EOF {
		t.Fatalf("after the re-encoded frame: %v, want io.EOF", err)
	}
}

// framesFrom builds a sequence of valid frames of every type from fuzz input:
// each byte of kinds picks a frame type, and fields are cut from payload.
func framesFrom(kinds, payload []byte, n uint64) []*Frame {
	cut := func(i int) []byte {
		if len(payload) == 0 {
			return nil
		}
		a := i % len(payload)
		b := a + int(n%uint64(len(payload)-a+1))
		return payload[a:b]
	}
	text := func(i int) string { return strings.ToValidUTF8(string(cut(i)), "?") }
	// addrs cuts a list of addresses, possibly invalid UTF-8 (MemberList
	// repairs them), at the bytes below 0x20.
	addrs := func(i int) []string {
		return strings.FieldsFunc(string(cut(i)), func(r rune) bool { return r < 0x20 })
	}
	ids := func(i int) []uint64 {
		var out []uint64
		for j, c := range cut(i) {
			out = append(out, n*uint64(j+1)+uint64(c))
		}
		return out
	}
	var frames []*Frame
	for i, k := range kinds {
		v := n + uint64(i)
		var f *Frame
		switch k % 14 {
		case 0:
			f = HelloFrame(&Hello{ClientId: text(i), ProtocolVersion: uint32(v), MaxInFlight: uint32(k), AuthToken: text(i + 1),
				Capabilities: capabilities(cut(i + 2))})
		case 1:
			f = WelcomeFrame(&Welcome{NodeId: text(i), SessionId: v, ProtocolVersion: Version, MaxInFlight: uint32(k),
				AckTimeoutMs: uint32(v), HeartbeatMs: uint32(v >> 3), LivenessIntervals: 3, MaxFrameSize: fuzzMax, Topic: text(i + 2),
				Members: MemberList(addrs(i + 3))})
		case 2:
			f = RedirectFrame(text(i), text(i+1), v)
		case 3:
			f = DeliverFrame(&Deliver{DeliveryId: v, Partition: int32(v), Offset: int64(v), Key: cut(i), Value: cut(i + 1),
				Headers: []*Header{{Key: text(i + 2), Value: cut(i + 3)}}, TimestampMs: -int64(v), Attempt: uint32(k)})
		case 4:
			f = AckFrame(ids(i))
		case 5:
			f = NackFrame(ids(i))
		case 6:
			f = TouchFrame(ids(i))
		case 7:
			f = PingFrame(v)
		case 8:
			f = PongFrame(v)
		case 9:
			f = ErrorFrame(ErrorCode(k%10), k%2 == 0, "%s", cut(i))
		case 10:
			f = GoodbyeFrame(string(cut(i)))
		case 11:
			f = MembersFrame(addrs(i), nil)
		case 12:
			var ds []*Deliver
			for j := range int(k % 5) {
				ds = append(ds, &Deliver{DeliveryId: v + uint64(j), Partition: int32(j), Offset: int64(v), Key: cut(i + j), Value: cut(i + j + 1),
					Headers: []*Header{{Key: text(i + j + 2), Value: cut(i + j + 3)}}, TimestampMs: int64(v), Attempt: uint32(j)})
			}
			f = DeliverBatchFrame(ds)
		case 13:
			var ranges []uint64
			for _, id := range ids(i) {
				ranges = append(ranges, id>>2, 1+id%1000) // never past the largest id
			}
			f = &Frame{Body: &Frame_Ack{Ack: &Ack{DeliveryIds: ids(i + 1), Ranges: ranges}}}
		}
		frames = append(frames, f)
	}
	return frames
}

// capabilities reads one capability per byte, known or not (an enum is open).
func capabilities(b []byte) []Capability {
	var cs []Capability
	for _, c := range b {
		cs = append(cs, Capability(c))
	}
	return cs
}

// splitReader returns its data in chunks of at most size bytes.
type splitReader struct {
	data []byte
	size int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.size)], r.data)
	r.data = r.data[n:]
	return n, nil
}

func FuzzSplitFrames(f *testing.F) {
	every := make([]byte, 12)
	for i := range every {
		every[i] = byte(i)
	}
	f.Add(every, []byte("payload \xff with bytes"), uint64(3), uint32(1))
	f.Add(every, []byte{}, uint64(0), uint32(4))
	f.Add([]byte{3, 3, 4}, bytes.Repeat([]byte{0x80}, 300), uint64(1<<62), uint32(5))
	f.Add([]byte{7}, []byte("x"), uint64(0), uint32(3))
	f.Fuzz(func(t *testing.T, kinds, payload []byte, n uint64, split uint32) {
		frames := framesFrom(kinds, payload, n)
		var buf bytes.Buffer
		w := NewWriter(&buf, fuzzMax)
		var sent []*Frame
		for _, fr := range frames {
			err := w.WriteFrame(fr)
			var tooLarge *FrameTooLargeError
			if errors.As(err, &tooLarge) {
				continue // refused without writing; the stream stays in step
			}
			if err != nil {
				t.Fatalf("WriteFrame(%v): %v", fr, err)
			}
			sent = append(sent, fr)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		stream := buf.Bytes()
		chunk := 1 + int(split%uint32(len(stream)+1))
		for _, src := range []struct {
			name string
			r    io.Reader
		}{
			{"one byte", iotest.OneByteReader(bytes.NewReader(stream))},
			{fmt.Sprintf("chunks of %d", chunk), &splitReader{data: stream, size: chunk}},
			{"slab, one byte", iotest.OneByteReader(bytes.NewReader(stream))},
			{fmt.Sprintf("slab, chunks of %d", chunk), &splitReader{data: stream, size: chunk}},
		} {
			r := NewReader(src.r, fuzzMax)
			if strings.HasPrefix(src.name, "slab") {
				r = NewSlabReader(src.r, fuzzMax)
			}
			for i, want := range sent {
				var got Frame
				if err := r.ReadFrame(&got); err != nil {
					t.Fatalf("%s: frame %d: %v", src.name, i, err)
				}
				if !proto.Equal(&got, want) {
					t.Fatalf("%s: frame %d = %v, want %v", src.name, i, &got, want)
				}
			}
			if err := r.ReadFrame(new(Frame)); err != io.EOF {
				t.Fatalf("%s: after %d frames: %v, want io.EOF", src.name, len(sent), err)
			}
		}
	})
}

// FuzzWriteDeliver builds a Deliver from fuzzed field values: WriteDeliver
// must write exactly what proto.Marshal encodes (or fail when it fails), and
// ReadFrame must decode it back to an equal message, exactly as
// proto.Unmarshal does.
func FuzzWriteDeliver(f *testing.F) {
	f.Add(uint64(1<<40), int32(7), int64(123456789), []byte("order-42"), bytes.Repeat([]byte{'x'}, 1024),
		"trace-id", []byte("0af7651916cd43dd8448eb211c80319c"), uint8(1), int64(1764672000000), uint32(1))
	f.Add(uint64(0), int32(0), int64(0), []byte(nil), []byte{}, "", []byte(nil), uint8(0), int64(0), uint32(0))
	f.Add(uint64(math.MaxUint64), int32(math.MinInt32), int64(math.MinInt64), []byte{0}, []byte{0xff},
		"a\xffb", []byte{1, 2, 3}, uint8(3), int64(-1), uint32(math.MaxUint32))
	f.Add(uint64(127), int32(-1), int64(128), bytes.Repeat([]byte{'k'}, 300), []byte("v"),
		"k1k2k3", []byte("v1v2v3v4"), uint8(200), int64(1<<14), uint32(1<<21))
	f.Fuzz(func(t *testing.T, id uint64, partition int32, offset int64, key, value []byte,
		hkeys string, hvals []byte, nheaders uint8, timestamp int64, attempt uint32) {
		d := &Deliver{DeliveryId: id, Partition: partition, Offset: offset, Key: key, Value: value,
			TimestampMs: timestamp, Attempt: attempt}
		// Header i takes overlapping cuts of hkeys and hvals; every fifth
		// is empty, every seventh nil.
		for i := range int(nheaders % 32) {
			switch {
			case i%7 == 6:
				d.Headers = append(d.Headers, nil)
			case i%5 == 4:
				d.Headers = append(d.Headers, &Header{})
			default:
				h := &Header{}
				if len(hkeys) > 0 {
					a := i % len(hkeys)
					h.Key = hkeys[a : a+(len(hkeys)-a+i)%(len(hkeys)-a+1)]
				}
				if len(hvals) > 0 {
					a := (i * 3) % len(hvals)
					h.Value = hvals[a : a+(len(hvals)-a+i)%(len(hvals)-a+1)]
				}
				d.Headers = append(d.Headers, h)
			}
		}
		want, wantErr := marshalDeliver(t, d)
		got, err := writeDeliver(t, d, fuzzMax)
		if wantErr != nil {
			if err == nil {
				t.Fatalf("WriteDeliver accepted what proto.Marshal refuses (%v): %x", wantErr, got)
			}
			return
		}
		if len(want)-HeaderSize > fuzzMax {
			if !isTooLarge(uint64(len(want)-HeaderSize), fuzzMax)(err) {
				t.Fatalf("WriteDeliver of %d bytes: %v, want *FrameTooLargeError", len(want)-HeaderSize, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("WriteDeliver: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("WriteDeliver wrote\n%x\nproto.Marshal gives\n%x", got, want)
		}
		var fr Frame
		if err := NewReader(bytes.NewReader(got), fuzzMax).ReadFrame(&fr); err != nil {
			t.Fatalf("ReadFrame: %v", err)
		}
		if !proto.Equal(fr.GetDeliver(), d) {
			t.Fatalf("read back %v, want %v", fr.GetDeliver(), d)
		}
		checkSameAsUnmarshal(t, got[HeaderSize:], &fr)
	})
}

// FuzzReadBatch reads an arbitrary stream with ReadBatch: every frame must
// come out as ReadFrame (the reference parse) gives it, deliveries in the
// Batch exactly as proto.Unmarshal decodes them, the rest in the Frame.
func FuzzReadBatch(f *testing.F) {
	for _, seed := range readFrameSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, rd := range readers {
			fuzzReadBatch(t, rd.make(bytes.NewReader(data), fuzzMax), data)
		}
	})
}

// fuzzReadBatch reads data with r's ReadBatch and compares every frame
// with the reference parse.
func fuzzReadBatch(t *testing.T, r *Reader, data []byte) {
	rest := data
	var b Batch
	for first := true; ; first = false {
		var got Frame
		ok, err := r.ReadBatch(&got, &b)
		want, size, wantErr := referenceFrame(rest, first)
		if wantErr != nil {
			if ok || !sameError(err, wantErr) {
				t.Fatalf("ReadBatch: %v, %v; reference says %v", ok, err, wantErr)
			}
			if errors.Is(err, ErrBadFrame) {
				rest = rest[HeaderSize+size:]
				continue
			}
			return
		}
		if err != nil {
			t.Fatalf("ReadBatch: %v, reference decoded %v", err, want)
		}
		body := rest[HeaderSize : HeaderSize+size]
		rest = rest[HeaderSize+size:]
		isDeliveries := want.GetDeliver() != nil || want.GetDeliverBatch() != nil
		if ok != isDeliveries {
			t.Fatalf("ReadBatch says deliveries %v for %v", ok, want)
		}
		if ok {
			checkDeliveries(t, &b, want)
			if b.Buf != nil && !bytes.Equal(b.Buf, body) {
				t.Fatalf("Buf holds other bytes than the frame's")
			}
			continue
		}
		if !proto.Equal(&got, want) {
			t.Fatalf("ReadBatch = %v, reference decoded %v", &got, want)
		}
	}
}

// FuzzWriteDeliverBatch builds a batch from fuzzed deliveries and a budget:
// WriteDeliverBatch must write exactly what proto.Marshal encodes for the
// longest prefix that fits (or fail when it fails), and ReadBatch must read
// it back as proto.Unmarshal does.
func FuzzWriteDeliverBatch(f *testing.F) {
	f.Add([]byte{3, 0, 7}, []byte("order-42 value \xff"), "trace-id", uint64(1<<40), uint16(0))
	f.Add([]byte{}, []byte{}, "", uint64(0), uint16(0))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, bytes.Repeat([]byte{'x'}, 300), "a\xffb", uint64(math.MaxUint64), uint16(200))
	f.Add([]byte{255, 128, 0}, []byte("v"), "k", uint64(127), uint16(40))
	f.Add([]byte{2, 5, 8}, bytes.Repeat([]byte{'y'}, 3*VectorMin), "trace", uint64(9), uint16(0)) // payloads a vector Writer refers to
	f.Fuzz(func(t *testing.T, shape, payload []byte, hkey string, id uint64, budget uint16) {
		var ds []*Deliver
		for i, c := range shape {
			d := &Deliver{DeliveryId: id + uint64(i), Partition: int32(c) - 100, Offset: int64(id) - int64(i),
				TimestampMs: int64(c) << 30, Attempt: uint32(c % 4)}
			if len(payload) > 0 {
				a := int(c) % len(payload)
				d.Value = payload[a : a+(len(payload)-a)*int(c%3)/2]
				d.Key = payload[:int(c)%(len(payload)+1)]
			}
			for j := range int(c % 3) {
				d.Headers = append(d.Headers, &Header{Key: hkey[:j%(len(hkey)+1)], Value: d.Key})
			}
			ds = append(ds, d)
		}
		got, n, err := writeBatch(t, ds, fuzzMax, int(budget))
		// The reference: the longest prefix proto.Marshal encodes within the limit.
		limit := fuzzMax
		if budget > 0 {
			limit = min(limit, int(budget))
		}
		wantN, wantErr := 0, error(nil)
		for k := 1; k <= len(ds); k++ {
			b, err := marshalBatch(t, ds[:k])
			if err != nil {
				wantErr = err
				break
			}
			if len(b)-HeaderSize > limit {
				break
			}
			wantN = k
		}
		switch {
		case wantErr != nil:
			// It sizes the delivery proto.Marshal refuses before it knows
			// whether it fits, and writes nothing.
			if err == nil || n != 0 {
				t.Fatalf("WriteDeliverBatch took %d (%v); proto.Marshal refuses %d: %v", n, err, wantN+1, wantErr)
			}
			return
		case len(ds) > 0 && wantN == 0:
			var tooLarge *FrameTooLargeError
			if n != 0 || !errors.As(err, &tooLarge) {
				t.Fatalf("WriteDeliverBatch of a first delivery above %d bytes: %d, %v", limit, n, err)
			}
			return
		case err != nil || n != wantN:
			t.Fatalf("WriteDeliverBatch took %d (%v), want %d", n, err, wantN)
		case n == 0:
			return
		}
		want, _ := marshalBatch(t, ds[:n])
		if !bytes.Equal(got, want) {
			t.Fatalf("WriteDeliverBatch wrote\n%x\nproto.Marshal gives\n%x", got, want)
		}
		var b Batch
		if ok, err := NewReader(bytes.NewReader(got), fuzzMax).ReadBatch(new(Frame), &b); !ok || err != nil {
			t.Fatalf("ReadBatch: %v, %v", ok, err)
		}
		var wantFrame Frame
		if err := proto.Unmarshal(got[HeaderSize:], &wantFrame); err != nil {
			t.Fatal(err)
		}
		checkDeliveries(t, &b, &wantFrame)
	})
}
