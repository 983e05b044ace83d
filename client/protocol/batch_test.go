package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"testing"
	"testing/iotest"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshalBatch returns the frame of ds as proto.Marshal encodes it, length
// prefix included.
func marshalBatch(tb testing.TB, ds []*Deliver) ([]byte, error) {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(DeliverBatchFrame(ds))
	if err != nil {
		return nil, err
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...), nil
}

// writeBatch returns the bytes of one WriteDeliverBatch of ds and how many
// deliveries it took.
func writeBatch(tb testing.TB, ds []*Deliver, max, budget int) ([]byte, int, error) {
	tb.Helper()
	var out []byte
	var outN int
	var outErr error
	for _, vector := range []bool{false, true} {
		var n int
		got, err := writeWith(tb, vector, max, func(w *Writer) error {
			var err error
			n, err = w.WriteDeliverBatch(ds, budget)
			if err == nil && n == 0 && w.Buffered() != 0 {
				tb.Fatalf("WriteDeliverBatch took none of %d but buffered %d bytes", len(ds), w.Buffered())
			}
			return err
		})
		if !vector {
			out, outN, outErr = got, n, err
			continue
		}
		if n != outN {
			tb.Fatalf("a vector Writer took %d deliveries, a copying one %d", n, outN)
		}
		sameVector(tb, out, outErr, got, err)
	}
	return out, outN, outErr
}

// batchCases are the deliveries of deliverCases that proto.Marshal takes, in
// one batch, plus smaller batches.
func batchCases(tb testing.TB) map[string][]*Deliver {
	var all []*Deliver
	cases := map[string][]*Deliver{}
	for _, tc := range deliverCases() {
		if _, err := marshalDeliver(tb, tc.d); err != nil {
			continue
		}
		all = append(all, tc.d)
		cases["one "+tc.name] = []*Deliver{tc.d}
	}
	cases["every case"] = all
	cases["same twice"] = []*Deliver{all[1], all[1]}
	return cases
}

func TestWriteDeliverBatchMatchesMarshal(t *testing.T) {
	t.Parallel()
	for name, ds := range batchCases(t) {
		t.Run(name, func(t *testing.T) {
			want, err := marshalBatch(t, ds)
			if err != nil {
				t.Fatal(err)
			}
			got, n, err := writeBatch(t, ds, 0, 0)
			if err != nil || n != len(ds) {
				t.Fatalf("WriteDeliverBatch took %d of %d: %v", n, len(ds), err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("WriteDeliverBatch wrote\n%x\nproto.Marshal gives\n%x", got, want)
			}
			var f Frame
			if err := NewReader(bytes.NewReader(got), 0).ReadFrame(&f); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&f, DeliverBatchFrame(ds)) {
				t.Fatalf("ReadFrame gives %v", &f)
			}
			checkReadBatch(t, got)
		})
	}
}

func TestWriteDeliverBatchBudget(t *testing.T) {
	t.Parallel()
	ds := make([]*Deliver, 10)
	for i := range ds {
		ds[i] = &Deliver{DeliveryId: uint64(1000 + i), Partition: 1, Offset: int64(i), Value: bytes.Repeat([]byte{'v'}, 100*i), Attempt: 1}
	}
	size := func(n int) int {
		b, err := marshalBatch(t, ds[:n])
		if err != nil {
			t.Fatal(err)
		}
		return len(b) - HeaderSize
	}
	for n := 1; n <= len(ds); n++ {
		// Exactly at the frame size of n deliveries, n go; one byte less, n-1.
		for _, limit := range []struct{ max, budget int }{{0, size(n)}, {size(n), 0}, {size(n), size(n) + 100}, {size(n) + 100, size(n)}} {
			got, took, err := writeBatch(t, ds, limit.max, limit.budget)
			if err != nil || took != n {
				t.Fatalf("max %d, budget %d: took %d (%v), want %d", limit.max, limit.budget, took, err, n)
			}
			if want, _ := marshalBatch(t, ds[:n]); !bytes.Equal(got, want) {
				t.Fatalf("max %d, budget %d: wrote other bytes than proto.Marshal of the first %d", limit.max, limit.budget, n)
			}
		}
		if n > 1 {
			if _, took, err := writeBatch(t, ds, 0, size(n)-1); err != nil || took != n-1 {
				t.Fatalf("budget %d: took %d (%v), want %d", size(n)-1, took, err, n-1)
			}
		}
	}
	// Not even the first fits: nothing is written; it may fit as a Deliver.
	first, _ := marshalBatch(t, ds[:1])
	single, _ := marshalDeliver(t, ds[0])
	if len(single) >= len(first) {
		t.Fatalf("a Deliver frame of %d bytes is not smaller than a batch of it (%d)", len(single), len(first))
	}
	_, took, err := writeBatch(t, ds, 0, len(first)-HeaderSize-1)
	if took != 0 || !isTooLarge(uint64(len(first)-HeaderSize), len(first)-HeaderSize-1)(err) {
		t.Fatalf("budget below the first: took %d, %v; want *FrameTooLargeError", took, err)
	}
	if _, took, err := writeBatch(t, nil, 0, 0); took != 0 || err != nil {
		t.Fatalf("no deliveries: took %d, %v", took, err)
	}
}

func TestWriteDeliverBatchInvalidUTF8(t *testing.T) {
	t.Parallel()
	ds := []*Deliver{{DeliveryId: 1}, {DeliveryId: 2, Headers: []*Header{{Key: "bad \xff"}}}}
	if _, err := marshalBatch(t, ds); err == nil {
		t.Fatal("proto.Marshal accepted invalid UTF-8")
	}
	if _, took, err := writeBatch(t, ds, 0, 0); err == nil || took != 0 {
		t.Fatalf("WriteDeliverBatch took %d, %v; want an error and nothing written", took, err)
	}
}

// readBatch reads one frame of stream with ReadBatch.
func readBatch(t *testing.T, stream []byte) (*Batch, *Frame, bool, error) {
	t.Helper()
	var b Batch
	var f Frame
	ok, err := NewReader(bytes.NewReader(stream), 0).ReadBatch(&f, &b)
	return &b, &f, ok, err
}

// checkReadBatch checks that ReadBatch of stream, one frame, gives exactly
// the deliveries proto.Unmarshal decodes, nil bytes where it has nil.
func checkReadBatch(t *testing.T, stream []byte) {
	t.Helper()
	b, f, ok, err := readBatch(t, stream)
	var want Frame
	if uerr := proto.Unmarshal(stream[HeaderSize:], &want); uerr != nil {
		t.Fatalf("proto.Unmarshal: %v", uerr)
	}
	if err != nil || !ok {
		t.Fatalf("ReadBatch: %v, %v (frame %v)", ok, err, f)
	}
	checkDeliveries(t, b, &want)
}

// checkDeliveries compares b with the deliveries of want, a Deliver or
// DeliverBatch frame.
func checkDeliveries(t *testing.T, b *Batch, want *Frame) {
	t.Helper()
	ds := want.GetDeliverBatch().GetDeliveries()
	if d := want.GetDeliver(); d != nil {
		ds = []*Deliver{d}
	}
	if len(b.Deliveries) != len(ds) {
		t.Fatalf("%d deliveries, proto.Unmarshal gives %d", len(b.Deliveries), len(ds))
	}
	same := func(what string, a, b []byte) {
		if !bytes.Equal(a, b) || (a == nil) != (b == nil) {
			t.Fatalf("%s: %q (nil %v), proto.Unmarshal gives %q (nil %v)", what, a, a == nil, b, b == nil)
		}
	}
	for i, w := range ds {
		g := b.Deliveries[i]
		if g.ID != w.DeliveryId || g.Partition != w.Partition || g.Offset != w.Offset || g.TimestampMs != w.TimestampMs || g.Attempt != w.Attempt {
			t.Fatalf("delivery %d: %+v, proto.Unmarshal gives %v", i, g, w)
		}
		same(fmt.Sprintf("delivery %d key", i), g.Key, w.Key)
		same(fmt.Sprintf("delivery %d value", i), g.Value, w.Value)
		if len(g.Headers) != len(w.Headers) || (g.Headers == nil) != (w.Headers == nil) {
			t.Fatalf("delivery %d: headers %v, proto.Unmarshal gives %v", i, g.Headers, w.Headers)
		}
		for j, h := range w.Headers {
			if g.Headers[j].Key != h.Key {
				t.Fatalf("delivery %d header %d key %q, want %q", i, j, g.Headers[j].Key, h.Key)
			}
			same(fmt.Sprintf("delivery %d header %d value", i, j), g.Headers[j].Value, h.Value)
		}
	}
}

func TestReadBatchAliasesItsBuffer(t *testing.T) {
	t.Parallel()
	ds := []*Deliver{
		{DeliveryId: 1, Key: []byte("k1"), Value: []byte("v1"), Headers: []*Header{{Key: "trace", Value: []byte("t1")}}},
		{DeliveryId: 2, Value: []byte("v2"), Headers: []*Header{{Key: "trace", Value: []byte("t2")}, {Key: "other"}}},
	}
	stream, _, err := writeBatch(t, ds, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	stream = append(stream, encodeFrames(t, PingFrame(7), DeliverFrame(&Deliver{DeliveryId: 3, Value: []byte("v3")}))...)
	r := NewReader(bytes.NewReader(stream), 0)
	var b Batch
	var f Frame
	if ok, err := r.ReadBatch(&f, &b); !ok || err != nil {
		t.Fatalf("ReadBatch: %v, %v", ok, err)
	}
	first := b.Deliveries
	buf := b.Buf
	within := func(v []byte) bool {
		return len(v) > 0 && &v[0] == &buf[bytes.Index(buf, v)] && cap(v) == len(v)
	}
	if !within(first[0].Key) || !within(first[0].Value) || !within(first[1].Value) || !within(first[1].Headers[0].Value) {
		t.Fatal("bytes do not alias the frame's buffer, capped at their length")
	}
	if first[0].Headers[0].Key != "trace" || first[1].Headers[1].Key != "other" || first[1].Headers[1].Value != nil {
		t.Fatalf("headers %+v, %+v", first[0].Headers, first[1].Headers)
	}
	value := first[1].Value
	// The next frame, not a delivery, goes to f; b is left alone.
	if ok, err := r.ReadBatch(&f, &b); ok || err != nil || f.GetPing().GetNonce() != 7 {
		t.Fatalf("ReadBatch of a ping: %v, %v, %v", ok, err, &f)
	}
	// A Deliver frame is a batch of one, in a buffer of its own.
	if ok, err := r.ReadBatch(&f, &b); !ok || err != nil || len(b.Deliveries) != 1 || b.Deliveries[0].ID != 3 {
		t.Fatalf("ReadBatch of a Deliver: %v, %v, %+v", ok, err, b.Deliveries)
	}
	if &b.Buf[0] == &buf[0] || string(value) != "v2" {
		t.Fatalf("the next frame reused the buffer of the previous one (value now %q)", value)
	}
	if ok, err := r.ReadBatch(&f, &b); ok || err != io.EOF {
		t.Fatalf("at the end: %v, %v", ok, err)
	}
}

func TestReadBatchSharesHeaderKeys(t *testing.T) {
	t.Parallel()
	var ds []*Deliver
	for i := range 3 {
		ds = append(ds, &Deliver{DeliveryId: uint64(i), Headers: []*Header{{Key: "trace-id", Value: []byte{byte(i)}}, {Key: fmt.Sprint("k", i)}}})
	}
	stream, _, _ := writeBatch(t, ds, 0, 0)
	b, _, ok, err := readBatch(t, stream)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	key := func(i, j int) *byte { return unsafe.StringData(b.Deliveries[i].Headers[j].Key) }
	if key(0, 0) != key(1, 0) || key(1, 0) != key(2, 0) {
		t.Error("equal header keys of consecutive deliveries are separate strings")
	}
	if b.Deliveries[2].Headers[1].Key != "k2" {
		t.Errorf("key %q", b.Deliveries[2].Headers[1].Key)
	}
}

// rawBatchCases are frame bodies ReadBatch decodes by hand (fast) or leaves
// to proto.Unmarshal, and what the result is: deliveries or not.
func rawBatchCases() []struct {
	name       string
	body       []byte
	fast       bool
	deliveries bool
} {
	batch := func(ds ...[]byte) []byte {
		var inner []byte
		for _, d := range ds {
			inner = append(inner, tagBatchDelivery)
			inner = protowire.AppendVarint(inner, uint64(len(d)))
			inner = append(inner, d...)
		}
		return append(protowire.AppendVarint([]byte{tagFrameDeliverBatch}, uint64(len(inner))), inner...)
	}
	fields := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	every := fields(varintField(tagDeliveryID, 1), varintField(tagPartition, 2), varintField(tagOffset, 3),
		bytesField(tagKey, "k"), bytesField(tagValue, "v"), bytesField(tagHeader, string(bytesField(tagHeaderKey, "hk"))),
		varintField(tagTimestamp, 4), varintField(tagAttempt, 5))
	// A batch with an unknown field of its own after its delivery.
	inner := append(bytesField(tagBatchDelivery, string(every)), 0x10, 0x01)
	unknown := append(protowire.AppendVarint([]byte{tagFrameDeliverBatch}, uint64(len(inner))), inner...)
	cases := []struct {
		name       string
		body       []byte
		fast       bool
		deliveries bool
	}{
		{"empty batch", batch(), true, true},
		{"one empty delivery", batch(nil), true, true},
		{"every field twice", batch(every, every), true, true},
		{"last scalar wins", batch(fields(varintField(tagDeliveryID, 1), varintField(tagDeliveryID, 2))), true, true},
		{"empty value after value is nil", batch(fields(bytesField(tagValue, "v"), bytesField(tagValue, ""))), true, true},
		{"non-minimal lengths", append([]byte{tagFrameDeliverBatch, 0x85, 0x00, tagBatchDelivery, 0x82, 0x00}, varintField(tagAttempt, 1)...), true, true},

		{"unknown field in a delivery", batch(every, varintField(9<<3, 1)), false, true},
		{"unknown field in the batch", unknown, false, true},
		{"delivery of the wrong wire type", []byte{tagFrameDeliverBatch, 0x02, 0x08, 0x01}, false, true},
		{"two batches merge", append(batch(every), batch(every)...), false, true},
		{"batch then ping", append(batch(every), 0x42, 0x00), false, false},
		{"ping then batch", append([]byte{0x42, 0x00}, batch(every)...), false, true},
		{"deliver then batch", append(deliverBody(), batch(every)...), false, true},
		{"truncated delivery", []byte{tagFrameDeliverBatch, 0x03, tagBatchDelivery, 0x05, 0x08}, false, false},
		{"invalid UTF-8 header key", batch(bytesField(tagHeader, string(bytesField(tagHeaderKey, "\xff")))), false, false},
	}
	for _, tc := range rawDeliverCases() {
		var f Frame
		deliveries := proto.Unmarshal(tc.body, &f) == nil && f.GetDeliver() != nil
		cases = append(cases, struct {
			name       string
			body       []byte
			fast       bool
			deliveries bool
		}{"deliver: " + tc.name, tc.body, tc.fast, deliveries})
	}
	return cases
}

func TestReadBatchRaw(t *testing.T) {
	t.Parallel()
	for _, tc := range rawBatchCases() {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			if fast := decodeDeliveries(tc.body, &b); fast != tc.fast {
				t.Fatalf("hand-written decoder took it: %v, want %v", fast, tc.fast)
			}
			stream := append(rawFrame(uint32(len(tc.body)), tc.body), encodeFrames(t, PingFrame(1))...)
			r := NewReader(bytes.NewReader(stream), 0)
			var f Frame
			ok, err := r.ReadBatch(&f, &b)
			var want Frame
			wantErr := proto.Unmarshal(tc.body, &want)
			if wantErr == nil && want.Body == nil {
				wantErr = errors.New("no body")
			}
			if (err != nil) != (wantErr != nil) || (err != nil && !errors.Is(err, ErrBadFrame)) {
				t.Fatalf("ReadBatch: %v; proto.Unmarshal: %v", err, wantErr)
			}
			if ok != tc.deliveries {
				t.Fatalf("ReadBatch says deliveries %v, want %v (frame %v)", ok, tc.deliveries, &f)
			}
			switch {
			case ok:
				checkDeliveries(t, &b, &want)
				if tc.fast != (b.Buf != nil) {
					t.Fatalf("Buf set %v, want %v", b.Buf != nil, tc.fast)
				}
			case err == nil:
				checkSameAsUnmarshal(t, tc.body, &f)
			}
			// The stream is in step.
			if ok, err := r.ReadBatch(&f, &b); ok || err != nil || f.GetPing().GetNonce() != 1 {
				t.Fatalf("next frame: %v, %v, %v", ok, err, &f)
			}
		})
	}
}

func TestReadBatchLimitsAndErrors(t *testing.T) {
	t.Parallel()
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) { testReadBatchLimitsAndErrors(t, rd.make) })
	}
}

func testReadBatchLimitsAndErrors(t *testing.T, NewReader func(io.Reader, int) *Reader) {
	ds := []*Deliver{{DeliveryId: 1, Value: bytes.Repeat([]byte{'v'}, 1000)}}
	stream, _, _ := writeBatch(t, ds, 0, 0)
	size := len(stream) - HeaderSize
	var b Batch
	var f Frame
	_, err := NewReader(bytes.NewReader(stream), size-1).ReadBatch(&f, &b)
	if !isTooLarge(uint64(size), size-1)(err) {
		t.Fatalf("above the maximum: %v", err)
	}
	for cut := 1; cut < len(stream); cut += 97 {
		_, err := NewReader(bytes.NewReader(stream[:cut]), 0).ReadBatch(&f, &b)
		if want := io.ErrUnexpectedEOF; cut < HeaderSize && cut > 0 || cut >= HeaderSize {
			if err != want {
				t.Fatalf("cut at %d: %v, want %v", cut, err, want)
			}
		}
	}
	if _, err := NewReader(bytes.NewReader(nil), 0).ReadBatch(&f, &b); err != io.EOF {
		t.Fatalf("empty stream: %v", err)
	}
	// An empty frame is bad, and the stream in step.
	r := NewReader(bytes.NewReader(append(rawFrame(0, nil), stream...)), 0)
	if _, err := r.ReadBatch(&f, &b); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("empty frame: %v", err)
	}
	if ok, err := r.ReadBatch(&f, &b); !ok || err != nil {
		t.Fatalf("after the empty frame: %v, %v", ok, err)
	}
	// One byte at a time.
	r = NewReader(iotest.OneByteReader(bytes.NewReader(stream)), 0)
	if ok, err := r.ReadBatch(&f, &b); !ok || err != nil || len(b.Deliveries[0].Value) != 1000 {
		t.Fatalf("one byte at a time: %v, %v", ok, err)
	}
	// A large frame (larger than a slab too) grows as it arrives.
	big := []*Deliver{{Value: make([]byte, max(ownedAhead, slabSize)+1000)}}
	stream, _, _ = writeBatch(t, big, math.MaxUint32, 0)
	r = NewReader(bytes.NewReader(stream), math.MaxUint32)
	if ok, err := r.ReadBatch(&f, &b); !ok || err != nil || len(b.Deliveries[0].Value) != max(ownedAhead, slabSize)+1000 {
		t.Fatalf("large frame: %v, %v", ok, err)
	}
}

func TestReadBatchLeavesIDLimitsToOtherFrames(t *testing.T) {
	t.Parallel()
	stream := encodeFrames(t, AckFrame([]uint64{1, 2, 3}))
	r := NewReader(bytes.NewReader(stream), 0)
	r.SetMaxIDs(2)
	var tooMany *TooManyIDsError
	if _, err := r.ReadBatch(new(Frame), new(Batch)); !errors.As(err, &tooMany) {
		t.Fatalf("ReadBatch of an Ack of 3 ids, at most 2: %v", err)
	}
}

func TestReadBatchAllocs(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses parallel tests (it counts the whole process).
	// The frame's buffer and the first delivery's header key, and nothing
	// per delivery once the Batch's slices have grown.
	ds := make([]*Deliver, 100)
	for i := range ds {
		ds[i] = benchDeliver().GetDeliver()
	}
	stream, _, _ := writeBatch(t, ds, 0, 0)
	src := bytes.NewReader(stream)
	r := NewReader(src, 0)
	var b Batch
	var f Frame
	var ok bool
	var err error
	got := testing.AllocsPerRun(50, func() {
		src.Reset(stream)
		ok, err = r.ReadBatch(&f, &b)
	})
	if !ok || err != nil || len(b.Deliveries) != 100 {
		t.Fatalf("ReadBatch: %v, %v", ok, err)
	}
	if got > 2 {
		t.Errorf("%v allocations per batch of 100, want 2", got)
	}
}

func TestDeliverBatchSchema(t *testing.T) {
	t.Parallel()
	// batch.go encodes and decodes DeliverBatch by hand.
	fs := (&DeliverBatch{}).ProtoReflect().Descriptor().Fields()
	if fs.Len() != 1 || fs.Get(0).Number() != 1 || fs.Get(0).Kind() != protoreflect.MessageKind || !fs.Get(0).IsList() ||
		fs.Get(0).Message().FullName() != "fanout.v1.Deliver" {
		t.Errorf("DeliverBatch's fields changed; batch.go handles only deliveries = 1, repeated Deliver")
	}
	f := (&Frame{}).ProtoReflect().Descriptor().Fields().ByName("deliver_batch")
	if f == nil || f.Number() != 13 || f.Kind() != protoreflect.MessageKind {
		t.Errorf("Frame.deliver_batch changed; batch.go handles field 13")
	}
}
