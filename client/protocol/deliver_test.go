package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshalDeliver returns the frame of d as proto.Marshal encodes it,
// length prefix included.
func marshalDeliver(tb testing.TB, d *Deliver) ([]byte, error) {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(DeliverFrame(d))
	if err != nil {
		return nil, err
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...), nil
}

// writeDeliver returns the bytes WriteDeliver writes for d, checking that
// a vector Writer writes the same (sameVector).
func writeDeliver(tb testing.TB, d *Deliver, max int) ([]byte, error) {
	tb.Helper()
	var out []byte
	var outErr error
	for _, vector := range []bool{false, true} {
		got, err := writeWith(tb, vector, max, func(w *Writer) error { return w.WriteDeliver(d) })
		if !vector {
			out, outErr = got, err
			continue
		}
		sameVector(tb, out, outErr, got, err)
	}
	return out, outErr
}

// writeWith returns what write writes through a Writer (a vector Writer
// when vector), flushed: nothing, and the error, when write fails, which it
// must do without buffering a byte.
func writeWith(tb testing.TB, vector bool, max int, write func(*Writer) error) ([]byte, error) {
	tb.Helper()
	var out bytes.Buffer
	var pw piecesWriter
	w := NewWriter(&out, max)
	if vector {
		w = NewVectorWriter(&pw, max)
	}
	if err := write(w); err != nil {
		if w.Buffered() != 0 {
			tb.Fatalf("a write failed with %v but buffered %d bytes (vector %v)", err, w.Buffered(), vector)
		}
		return nil, err
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if !vector {
		return out.Bytes(), nil
	}
	if w.Buffered() != 0 || (len(pw.pieces) > 0) != (pw.calls == 1) || pw.calls > 1 {
		tb.Fatalf("vector Writer: %d calls of WriteBuffers for one Flush, %d bytes left buffered", pw.calls, w.Buffered())
	}
	return bytes.Join(pw.pieces, nil), nil
}

// piecesWriter is a BuffersWriter that records the pieces it is given.
type piecesWriter struct {
	pieces [][]byte
	calls  int
}

func (p *piecesWriter) Write(b []byte) (int, error) {
	panic("a vector Writer wrote without WriteBuffers")
}

func (p *piecesWriter) WriteBuffers(b *net.Buffers) (int64, error) {
	p.calls++
	n := 0
	for _, piece := range *b {
		p.pieces = append(p.pieces, piece)
		n += len(piece)
	}
	*b = nil
	return int64(n), nil
}

// sameVector checks that a vector Writer wrote what the copying one did
// (got, err against want, wantErr).
func sameVector(tb testing.TB, want []byte, wantErr error, got []byte, err error) {
	tb.Helper()
	if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
		tb.Fatalf("a vector Writer wrote %x (%v), a copying one %x (%v)", got, err, want, wantErr)
	}
}

// withUnknown returns m with raw unknown fields set.
func withUnknown[M proto.Message](m M, raw []byte) M {
	m.ProtoReflect().SetUnknown(protoreflect.RawFields(raw))
	return m
}

func deliverCases() []struct {
	name string
	d    *Deliver
} {
	many := make([]*Header, 300)
	for i := range many {
		many[i] = &Header{Key: fmt.Sprintf("h%d", i), Value: bytes.Repeat([]byte{byte(i)}, i%5)}
	}
	return []struct {
		name string
		d    *Deliver
	}{
		{"zero", &Deliver{}},
		{"bench", benchDeliver().GetDeliver()},
		{"max varints", &Deliver{DeliveryId: math.MaxUint64, Partition: math.MaxInt32, Offset: math.MaxInt64,
			TimestampMs: math.MaxInt64, Attempt: math.MaxUint32}},
		{"min negatives", &Deliver{Partition: math.MinInt32, Offset: math.MinInt64, TimestampMs: math.MinInt64}},
		{"minus one", &Deliver{Partition: -1, Offset: -1, TimestampMs: -1}},
		{"varint boundaries", &Deliver{DeliveryId: 127, Partition: 128, Offset: 1<<14 - 1, TimestampMs: 1 << 14, Attempt: 1 << 21}},
		{"empty key and value", &Deliver{DeliveryId: 1, Key: []byte{}, Value: []byte{}}},
		{"nil key, value 127", &Deliver{Value: bytes.Repeat([]byte{'v'}, 127)}},
		{"key 128, nil value", &Deliver{Key: bytes.Repeat([]byte{'k'}, 128)}},
		{"value larger than the write buffer", &Deliver{DeliveryId: 9, Key: []byte("k"), Value: bytes.Repeat([]byte("0123456789"), 20000),
			Headers: []*Header{{Key: "after", Value: []byte("big")}}, Attempt: 3}},
		{"empty header", &Deliver{Headers: []*Header{{}}}},
		{"empty header key", &Deliver{Headers: []*Header{{Value: []byte("v")}}}},
		{"empty header value", &Deliver{Headers: []*Header{{Key: "k", Value: []byte{}}}}},
		{"nil header", &Deliver{Headers: []*Header{nil, {Key: "k"}}}},
		{"utf-8 header key", &Deliver{Headers: []*Header{{Key: "ключ-\u2603-\U0001F600", Value: []byte{0xff}}}}},
		{"header key 200 bytes", &Deliver{Headers: []*Header{{Key: strings.Repeat("k", 200)}}}},
		{"many headers", &Deliver{DeliveryId: 5, Headers: many}},
		{"unknown fields", withUnknown(&Deliver{DeliveryId: 2, Value: []byte("v"),
			Headers: []*Header{withUnknown(&Header{Key: "k"}, []byte{0x18, 0x01})}}, []byte{0x48, 0x07, 0x52, 0x01, 'x'})},
	}
}

func TestWriteDeliverMatchesMarshal(t *testing.T) {
	t.Parallel()
	for _, tc := range deliverCases() {
		t.Run(tc.name, func(t *testing.T) {
			want, err := marshalDeliver(t, tc.d)
			if err != nil {
				t.Fatalf("proto.Marshal: %v", err)
			}
			got, err := writeDeliver(t, tc.d, 0)
			if err != nil {
				t.Fatalf("WriteDeliver: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("WriteDeliver wrote\n%x\nproto.Marshal gives\n%x", got, want)
			}
			r := NewReader(bytes.NewReader(got), 0)
			var f Frame
			if err := r.ReadFrame(&f); err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if !proto.Equal(f.GetDeliver(), tc.d) {
				t.Fatalf("read back %v, want %v", f.GetDeliver(), tc.d)
			}
			checkSameAsUnmarshal(t, got[HeaderSize:], &f)
		})
	}
}

// checkSameAsUnmarshal checks that got, decoded from the frame body, is
// exactly what proto.Unmarshal makes of it: proto.Equal, and also the same
// nil and non-nil byte slices (which proto.Equal does not tell apart).
func checkSameAsUnmarshal(t *testing.T, body []byte, got *Frame) {
	t.Helper()
	var want Frame
	if err := proto.Unmarshal(body, &want); err != nil {
		t.Fatalf("proto.Unmarshal: %v", err)
	}
	if !proto.Equal(got, &want) {
		t.Fatalf("decoded %v, proto.Unmarshal gives %v", got, &want)
	}
	if len(got.unknownFields) != len(want.unknownFields) {
		t.Fatalf("frame unknown fields %x, want %x", got.unknownFields, want.unknownFields)
	}
	g, w := got.GetDeliver(), want.GetDeliver()
	if g == nil || w == nil {
		return
	}
	nilness := func(what string, a, b []byte) {
		if (a == nil) != (b == nil) {
			t.Fatalf("%s: nil %v, proto.Unmarshal gives nil %v", what, a == nil, b == nil)
		}
	}
	nilness("key", g.Key, w.Key)
	nilness("value", g.Value, w.Value)
	if (g.Headers == nil) != (w.Headers == nil) {
		t.Fatalf("headers nil %v, proto.Unmarshal gives nil %v", g.Headers == nil, w.Headers == nil)
	}
	for i := range g.Headers {
		nilness(fmt.Sprintf("header %d value", i), g.Headers[i].Value, w.Headers[i].Value)
	}
}

func TestWriteDeliverInvalidUTF8(t *testing.T) {
	t.Parallel()
	// proto.Marshal refuses a proto3 string that is not UTF-8, and so does
	// WriteDeliver, writing nothing (the daemon repairs header keys first).
	d := &Deliver{DeliveryId: 1, Value: []byte("v"), Headers: []*Header{{Key: "ok"}, {Key: "bad \xff"}}}
	if _, err := marshalDeliver(t, d); err == nil {
		t.Fatal("proto.Marshal accepted invalid UTF-8")
	}
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	err := w.WriteDeliver(d)
	if err == nil || !strings.Contains(err.Error(), "header 1") {
		t.Fatalf("WriteDeliver: %v, want an error naming header 1", err)
	}
	if w.Buffered() != 0 {
		t.Fatalf("%d bytes buffered after the error", w.Buffered())
	}
	// Invalid UTF-8 in bytes fields is fine.
	d.Headers[1].Key, d.Key, d.Headers[0].Value = "good", []byte{0xff}, []byte{0xfe}
	if err := w.WriteDeliver(d); err != nil {
		t.Fatalf("WriteDeliver with binary bytes: %v", err)
	}
}

func TestWriteDeliverTooLarge(t *testing.T) {
	t.Parallel()
	d := benchDeliver().GetDeliver()
	want, err := marshalDeliver(t, d)
	if err != nil {
		t.Fatal(err)
	}
	size := len(want) - HeaderSize
	if _, err := writeDeliver(t, d, size); err != nil {
		t.Fatalf("frame at the maximum: %v", err)
	}
	var out bytes.Buffer
	w := NewWriter(&out, size-1)
	err = w.WriteDeliver(d)
	if !isTooLarge(uint64(size), size-1)(err) {
		t.Fatalf("frame above the maximum: %v, want *FrameTooLargeError{%d, %d}", err, size, size-1)
	}
	if w.Buffered() != 0 {
		t.Fatalf("%d bytes buffered after the too-large frame", w.Buffered())
	}
	// The stream stays in step.
	if err := w.WriteDeliver(&Deliver{DeliveryId: 8}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	var f Frame
	if err := NewReader(&out, 0).ReadFrame(&f); err != nil || f.GetDeliver().GetDeliveryId() != 8 {
		t.Fatalf("frame after the refused one: %v, %v", &f, err)
	}
}

// failingWriter accepts limit bytes, then fails.
type failingWriter struct{ limit int }

var errWrite = errors.New("broken pipe")

func (w *failingWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.limit)
	w.limit -= n
	if n < len(p) {
		return n, errWrite
	}
	return n, nil
}

func TestWriteDeliverWriteError(t *testing.T) {
	t.Parallel()
	// A value larger than the buffer goes straight to the failing writer;
	// the error surfaces from WriteDeliver, not only from Flush.
	d := &Deliver{Key: []byte("k"), Value: make([]byte, 200<<10), Headers: []*Header{{Key: "h"}}}
	w := NewWriter(&failingWriter{limit: 1000}, 0)
	if err := w.WriteDeliver(d); !errors.Is(err, errWrite) {
		t.Fatalf("WriteDeliver: %v, want %v", err, errWrite)
	}
}

// deliverBody returns a Frame body of one Deliver field holding fields.
func deliverBody(fields ...[]byte) []byte {
	inner := bytes.Join(fields, nil)
	return append(protowire.AppendVarint([]byte{tagFrameDeliver}, uint64(len(inner))), inner...)
}

// bytesField returns a bytes field with a one-byte tag.
func bytesField(tag byte, v string) []byte {
	return append(protowire.AppendVarint([]byte{tag}, uint64(len(v))), v...)
}

// varintField returns a varint field with a one-byte tag.
func varintField(tag byte, v uint64) []byte { return protowire.AppendVarint([]byte{tag}, v) }

// rawDeliverCases are frame bodies that decodeDeliver must decode exactly as
// proto.Unmarshal does (fast: true), or leave to it.
func rawDeliverCases() []struct {
	name string
	body []byte
	fast bool
} {
	header := func(fields ...[]byte) []byte { return bytesField(tagHeader, string(bytes.Join(fields, nil))) }
	return []struct {
		name string
		body []byte
		fast bool
	}{
		{"empty deliver", deliverBody(), true},
		{"every field", deliverBody(varintField(tagDeliveryID, 1), varintField(tagPartition, 2), varintField(tagOffset, 3),
			bytesField(tagKey, "k"), bytesField(tagValue, "v"), header(bytesField(tagHeaderKey, "hk"), bytesField(tagHeaderValue, "hv")),
			varintField(tagTimestamp, 4), varintField(tagAttempt, 5)), true},
		{"fields out of order", deliverBody(varintField(tagAttempt, 5), header(bytesField(tagHeaderValue, "hv"), bytesField(tagHeaderKey, "hk")),
			bytesField(tagValue, "v"), varintField(tagDeliveryID, 1), bytesField(tagKey, "k")), true},
		{"last scalar wins", deliverBody(varintField(tagDeliveryID, 1), varintField(tagDeliveryID, 2), varintField(tagPartition, 7), varintField(tagPartition, 0)), true},
		{"last key wins", deliverBody(bytesField(tagKey, "first"), bytesField(tagKey, "second")), true},
		{"empty key after key is nil", deliverBody(bytesField(tagKey, "first"), bytesField(tagKey, ""), bytesField(tagValue, "")), true},
		{"header fields repeated", deliverBody(header(bytesField(tagHeaderKey, "a"), bytesField(tagHeaderKey, "b"),
			bytesField(tagHeaderValue, "x"), bytesField(tagHeaderValue, ""))), true},
		{"headers around key", deliverBody(header(bytesField(tagHeaderKey, "1")), bytesField(tagKey, "k"), header(), header(bytesField(tagHeaderValue, "2"))), true},
		{"20 headers", deliverBody(bytes.Repeat(header(bytesField(tagHeaderKey, "key"), bytesField(tagHeaderValue, "val")), 20)), true},
		{"int32 from a 64-bit varint", deliverBody(varintField(tagPartition, 1<<40|5), varintField(tagAttempt, 1<<33|6)), true},
		{"non-minimal varints", deliverBody([]byte{tagDeliveryID, 0x81, 0x80, 0x00}, []byte{tagKey, 0x81, 0x00, 'k'}), true},
		{"non-minimal frame length", append([]byte{tagFrameDeliver, 0x82, 0x00}, varintField(tagDeliveryID, 1)...), true},
		{"varint of 10 bytes", deliverBody(varintField(tagOffset, math.MaxUint64)), true},

		{"unknown field", deliverBody(varintField(tagDeliveryID, 1), varintField(9<<3, 1)), false},
		{"unknown field in header", deliverBody(header(bytesField(tagHeaderKey, "k"), varintField(3<<3, 1))), false},
		{"wrong wire type", deliverBody(bytesField(tagDeliveryID|2, "x")), false},
		{"wrong wire type in header", deliverBody(header(varintField(tagHeaderKey&^7, 1))), false},
		{"two-byte tag", deliverBody([]byte{0x88, 0x00, 0x01}), false},
		{"deliver and ping", append(deliverBody(), 0x42, 0x00), false},
		{"two delivers merge", append(deliverBody(varintField(tagDeliveryID, 1)), deliverBody(varintField(tagAttempt, 2))...), false},
		{"ping", []byte{0x42, 0x02, 0x08, 0x01}, false},
		{"frame unknown field first", append([]byte{0x60, 0x01}, deliverBody()...), false},

		{"invalid UTF-8 header key", deliverBody(header(bytesField(tagHeaderKey, "\xff"))), false},
		{"invalid UTF-8 key replaced later", deliverBody(header(bytesField(tagHeaderKey, "\xff"), bytesField(tagHeaderKey, "ok"))), false},
		{"varint overflow", deliverBody([]byte{tagOffset, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}), false},
		{"truncated varint", deliverBody([]byte{tagOffset, 0xff}), false},
		{"truncated key", deliverBody([]byte{tagKey, 0x05, 'k'}), false},
		{"truncated header", deliverBody([]byte{tagHeader, 0x03, tagHeaderKey, 0x05}), false},
		{"frame length too long", []byte{tagFrameDeliver, 0x05, tagDeliveryID, 0x01}, false},
		{"frame length too short", []byte{tagFrameDeliver, 0x01, tagDeliveryID, 0x01}, false},
		{"frame length overflow", []byte{tagFrameDeliver, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, false},
		{"tag only", []byte{tagFrameDeliver}, false},
	}
}

func TestDecodeDeliver(t *testing.T) {
	t.Parallel()
	for _, tc := range rawDeliverCases() {
		t.Run(tc.name, func(t *testing.T) {
			if fast := decodeDeliver(tc.body) != nil; fast != tc.fast {
				t.Fatalf("fast path taken: %v, want %v", fast, tc.fast)
			}
			stream := rawFrame(uint32(len(tc.body)), tc.body)
			var f Frame
			err := NewReader(bytes.NewReader(stream), 0).ReadFrame(&f)
			var want Frame
			wantErr := proto.Unmarshal(tc.body, &want)
			if wantErr == nil && want.Body == nil {
				wantErr = errors.New("no body")
			}
			if (err != nil) != (wantErr != nil) || (err != nil && !errors.Is(err, ErrBadFrame)) {
				t.Fatalf("ReadFrame: %v; proto.Unmarshal: %v", err, wantErr)
			}
			if err == nil {
				checkSameAsUnmarshal(t, tc.body, &f)
			}
		})
	}
}

func TestReadDeliverReusedFrame(t *testing.T) {
	t.Parallel()
	// A Frame reused for a Deliver after other frames holds only the
	// Deliver, and the Deliver read first is untouched by the next reads.
	first := &Deliver{DeliveryId: 1, Key: []byte("k1"), Value: []byte("v1"), Headers: []*Header{{Key: "h", Value: []byte("hv")}}}
	second := &Deliver{DeliveryId: 2, Value: []byte("v2")}
	var stream bytes.Buffer
	stream.Write(rawFrame(4, []byte{0x42, 0x00, 0x60, 0x01})) // ping and an unknown field
	stream.Write(encodeFrames(t, DeliverFrame(first), DeliverFrame(second)))
	r := NewReader(&stream, 0)
	var f Frame
	if err := r.ReadFrame(&f); err != nil || f.GetPing() == nil || len(f.unknownFields) == 0 {
		t.Fatalf("first frame: %v, %v; want a ping with an unknown field", &f, err)
	}
	if err := r.ReadFrame(&f); err != nil {
		t.Fatal(err)
	}
	got1 := f.GetDeliver()
	if len(f.unknownFields) != 0 || !proto.Equal(&f, DeliverFrame(first)) {
		t.Fatalf("second frame: %v (unknown %x), want %v", &f, f.unknownFields, first)
	}
	if err := r.ReadFrame(&f); err != nil || !proto.Equal(&f, DeliverFrame(second)) {
		t.Fatalf("third frame: %v, %v; want %v", &f, err, second)
	}
	if !proto.Equal(got1, first) {
		t.Fatalf("first Deliver changed to %v by the next read", got1)
	}
	// Growing one decoded slice does not overwrite the next.
	_ = append(got1.Key, "XXXX"...)
	if string(got1.Value) != "v1" || string(got1.Headers[0].Value) != "hv" {
		t.Fatalf("append to the key changed value %q or header %q", got1.Value, got1.Headers[0].Value)
	}
}

func TestReadDeliverAllocs(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses parallel tests (it counts the whole process).
	// One for the bytes, one for Deliver and its wrapper, and with headers
	// one for their keys and two for the Header slices.
	tests := []struct {
		d    *Deliver
		want float64
	}{
		{&Deliver{DeliveryId: 1, Key: []byte("k"), Value: []byte("value")}, 2},
		{benchDeliver().GetDeliver(), 5},
	}
	for _, tc := range tests {
		one := encodeFrames(t, DeliverFrame(tc.d))
		src := bytes.NewReader(one)
		r := NewReader(src, 0)
		var f Frame
		var err error
		got := testing.AllocsPerRun(100, func() {
			src.Reset(one)
			err = r.ReadFrame(&f)
		})
		if err != nil || !proto.Equal(f.GetDeliver(), tc.d) {
			t.Fatalf("ReadFrame: %v, %v", &f, err)
		}
		if got > tc.want {
			t.Errorf("%d headers: %v allocations per Deliver, want at most %v", len(tc.d.Headers), got, tc.want)
		}
	}
}

func TestWriteDeliverReadFrameStream(t *testing.T) {
	t.Parallel()
	// Many Delivers and other frames, mixed, in one buffer.
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	var want []*Frame
	for i := range 20 {
		for _, tc := range deliverCases() {
			if i%2 == 0 {
				if err := w.WriteDeliver(tc.d); err != nil {
					t.Fatal(err)
				}
			} else if err := w.WriteFrame(DeliverFrame(tc.d)); err != nil {
				t.Fatal(err)
			}
			want = append(want, DeliverFrame(tc.d))
		}
		if err := w.WriteFrame(PingFrame(uint64(i))); err != nil {
			t.Fatal(err)
		}
		want = append(want, PingFrame(uint64(i)))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&out, 0)
	var f Frame
	for i, wf := range want {
		if err := r.ReadFrame(&f); err != nil || !proto.Equal(&f, wf) {
			t.Fatalf("frame %d: %v, %v; want %v", i, &f, err, wf)
		}
	}
	if err := r.ReadFrame(&f); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

// TestDeliverKeyPresence: a record without a key (nil) and one with an
// empty key are told apart on the wire, by WriteDeliver, WriteBatch,
// ReadFrame and ReadBatch alike, as protobuf's own code does (Deliver.key
// has presence).
func TestDeliverKeyPresence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		key  []byte
		wire []byte // the key field's bytes in the Deliver
	}{
		{"no key", nil, nil},
		{"empty key", []byte{}, []byte{tagKey, 0}},
		{"a key", []byte("k"), []byte{tagKey, 1, 'k'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Deliver{DeliveryId: 7, Key: tc.key, Value: []byte("v")}
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(DeliverFrame(d))
			if err != nil {
				t.Fatal(err)
			}
			body := append([]byte{tagDeliveryID, 7}, tc.wire...)
			body = append(body, tagValue, 1, 'v')
			if wantBody := append([]byte{tagFrameDeliver, byte(len(body))}, body...); !bytes.Equal(want, wantBody) {
				t.Fatalf("protobuf writes %x, want %x", want, wantBody)
			}
			var buf bytes.Buffer
			w := NewWriter(&buf, 0)
			if err := w.WriteDeliver(d); err != nil {
				t.Fatal(err)
			}
			if _, err := w.WriteDeliverBatch([]*Deliver{d}, 0); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := buf.Bytes()[HeaderSize : HeaderSize+len(want)]; !bytes.Equal(got, want) {
				t.Fatalf("WriteDeliver wrote %x, want %x", got, want)
			}
			wantBatch, err := proto.MarshalOptions{Deterministic: true}.Marshal(DeliverBatchFrame([]*Deliver{d}))
			if err != nil {
				t.Fatal(err)
			}
			if got := buf.Bytes()[2*HeaderSize+len(want):]; !bytes.Equal(got, wantBatch) {
				t.Fatalf("WriteDeliverBatch wrote %x, want %x", got, wantBatch)
			}
			r := NewReader(bytes.NewReader(buf.Bytes()), 0)
			var f Frame
			if err := r.ReadFrame(&f); err != nil {
				t.Fatal(err)
			}
			if got := f.GetDeliver().GetKey(); (got == nil) != (tc.key == nil) || !bytes.Equal(got, tc.key) {
				t.Errorf("ReadFrame: key %#v, want %#v", got, tc.key)
			}
			var b Batch
			if _, err := r.ReadBatch(&f, &b); err != nil || len(b.Deliveries) != 1 {
				t.Fatalf("ReadBatch: %v, %d deliveries", err, len(b.Deliveries))
			}
			if got := b.Deliveries[0].Key; (got == nil) != (tc.key == nil) || !bytes.Equal(got, tc.key) {
				t.Errorf("ReadBatch: key %#v, want %#v", got, tc.key)
			}
		})
	}
}

func TestDeliverSchema(t *testing.T) {
	t.Parallel()
	// deliver.go encodes and decodes Deliver and Header by hand: a field
	// added to either, or changed, must be added there too.
	want := map[protoreflect.FullName][]string{
		"fanout.v1.Frame": {"deliver 4 message"}, // the only Frame field deliver.go knows
		"fanout.v1.Deliver": {"delivery_id 1 uint64", "partition 2 int32", "offset 3 int64", "key 4 bytes with presence",
			"value 5 bytes", "headers 6 message repeated", "timestamp_ms 7 int64", "attempt 8 uint32"},
		"fanout.v1.Header": {"key 1 string", "value 2 bytes"},
	}
	for _, m := range []protoreflect.MessageDescriptor{
		(&Deliver{}).ProtoReflect().Descriptor(), (&Header{}).ProtoReflect().Descriptor(),
	} {
		var got []string
		fs := m.Fields()
		for i := range fs.Len() {
			f := fs.Get(i)
			s := fmt.Sprintf("%s %d %s", f.Name(), f.Number(), f.Kind())
			if f.IsList() {
				s += " repeated"
			}
			switch {
			case f.IsPacked():
				s += " packed"
			case f.HasPresence() && f.Kind() != protoreflect.MessageKind: // proto3 optional: a synthetic oneof
				s += " with presence"
			}
			got = append(got, s)
		}
		if fmt.Sprint(got) != fmt.Sprint(want[m.FullName()]) {
			t.Errorf("%s fields are %q; deliver.go handles %q", m.FullName(), got, want[m.FullName()])
		}
	}
	f := (&Frame{}).ProtoReflect().Descriptor().Fields().ByName("deliver")
	got := fmt.Sprintf("%s %d %s", f.Name(), f.Number(), f.Kind())
	if got != want["fanout.v1.Frame"][0] {
		t.Errorf("Frame field %q; deliver.go handles %q", got, want["fanout.v1.Frame"][0])
	}
}
