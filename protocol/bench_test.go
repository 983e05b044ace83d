package protocol

import (
	"bytes"
	"io"
	"testing"
)

func benchDeliver() *Frame {
	return DeliverFrame(&Deliver{
		DeliveryId:  1 << 40,
		Partition:   7,
		Offset:      123456789,
		Key:         []byte("order-42"),
		Value:       bytes.Repeat([]byte{'x'}, 1024),
		Headers:     []*Header{{Key: "trace-id", Value: []byte("0af7651916cd43dd8448eb211c80319c")}},
		TimestampMs: 1764672000000,
		Attempt:     1,
	})
}

func benchAck64() *Frame {
	ids := make([]uint64, 64)
	for i := range ids {
		ids[i] = 1<<40 + uint64(i)
	}
	return AckFrame(ids)
}

func benchWrite(b *testing.B, f *Frame) {
	w := NewWriter(io.Discard, 0)
	n := encodedSize(b, f)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := w.WriteFrame(f); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
}

// benchRead decodes frames from a stream of 1024 copies of f, rewinding the
// stream when it runs out.
func benchRead(b *testing.B, f *Frame) {
	const frames = 1024
	var stream bytes.Buffer
	w := NewWriter(&stream, 0)
	for range frames {
		if err := w.WriteFrame(f); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	src := bytes.NewReader(stream.Bytes())
	r := NewReader(src, 0)
	var got Frame
	b.SetBytes(int64(stream.Len() / frames))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for range b.N {
		if i == frames {
			src.Reset(stream.Bytes())
			i = 0
		}
		if err := r.ReadFrame(&got); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkWriteDeliver measures WriteDeliver, the daemon's path for
// Deliver frames; BenchmarkWriteFrameDeliver the generic one for comparison.
func BenchmarkWriteDeliver(b *testing.B) {
	d := benchDeliver().GetDeliver()
	w := NewWriter(io.Discard, 0)
	b.SetBytes(int64(encodedSize(b, DeliverFrame(d))))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := w.WriteDeliver(d); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkWriteFrameDeliver(b *testing.B) { benchWrite(b, benchDeliver()) }
func BenchmarkReadDeliver(b *testing.B)       { benchRead(b, benchDeliver()) }
func BenchmarkWriteAck64(b *testing.B)        { benchWrite(b, benchAck64()) }
func BenchmarkReadAck64(b *testing.B)         { benchRead(b, benchAck64()) }
