package protocol

import (
	"bytes"
	"io"
	"net"
	"testing"
	"unsafe"
)

// A vector Writer refers to the payloads of VectorMin bytes or more rather
// than copying them, copies the smaller ones, and hands everything to the
// connection in one call per Flush.
func TestVectorWriterRefersToPayloads(t *testing.T) {
	t.Parallel()
	large, small := bytes.Repeat([]byte{'L'}, VectorMin), bytes.Repeat([]byte{'s'}, VectorMin-1)
	hv := bytes.Repeat([]byte{'h'}, 2*VectorMin)
	ds := []*Deliver{
		{DeliveryId: 1, Value: large, Key: small, Headers: []*Header{{Key: "trace", Value: hv}}},
		{DeliveryId: 2, Value: small},
	}
	var pw piecesWriter
	w := NewVectorWriter(&pw, 0)
	if n, err := w.WriteDeliverBatch(ds, 0); n != 2 || err != nil {
		t.Fatalf("WriteDeliverBatch = %d, %v", n, err)
	}
	if err := w.WriteDeliver(ds[0]); err != nil {
		t.Fatal(err)
	}
	if pw.calls != 0 {
		t.Fatalf("%d writes before Flush", pw.calls)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if pw.calls != 1 {
		t.Fatalf("%d calls of WriteBuffers for one Flush, want 1", pw.calls)
	}
	refs := map[*byte]int{}
	for _, p := range pw.pieces {
		refs[unsafe.SliceData(p)]++
	}
	if refs[unsafe.SliceData(large)] != 2 || refs[unsafe.SliceData(hv)] != 2 {
		t.Errorf("the large value and header value were copied (referred to %d and %d times, want 2 each)",
			refs[unsafe.SliceData(large)], refs[unsafe.SliceData(hv)])
	}
	if refs[unsafe.SliceData(small)] != 0 {
		t.Errorf("a payload below VectorMin was referred to, not copied")
	}
	want, _ := marshalBatch(t, ds)
	d0, _ := marshalDeliver(t, ds[0])
	if got := bytes.Join(pw.pieces, nil); !bytes.Equal(got, append(want, d0...)) {
		t.Fatalf("wrote %x, want %x", got, append(want, d0...))
	}
}

// A vector Writer writes what is pending once it reaches vectorFlushAt,
// without waiting for Flush.
func TestVectorWriterFlushesALargeBatchInParts(t *testing.T) {
	t.Parallel()
	var pw piecesWriter
	w := NewVectorWriter(&pw, 0)
	d := &Deliver{DeliveryId: 1, Value: make([]byte, 64<<10)}
	for range 2 * vectorFlushAt / len(d.Value) {
		if err := w.WriteDeliver(d); err != nil {
			t.Fatal(err)
		}
	}
	if pw.calls == 0 {
		t.Fatalf("nothing written with %d bytes pending", w.Buffered())
	}
}

// Over TCP a vector Writer's Flush goes through net.Buffers (writev), and
// the peer reads the frames it wrote.
func TestVectorWriterOverTCP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ds := benchBatch(300, 1000)
	w := NewVectorWriter(c, 0)
	if n, err := w.WriteDeliverBatch(ds, 0); n != len(ds) || err != nil {
		t.Fatalf("WriteDeliverBatch = %d, %v", n, err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	want, _ := marshalBatch(t, ds)
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, want the %d of the frame", len(b), len(want))
	}
}
