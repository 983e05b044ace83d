package protocol

import (
	"bytes"
	"fmt"
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

// benchBatch returns n copies of benchDeliver's message with value size
// bytes and consecutive ids.
func benchBatch(n, size int) []*Deliver {
	ds := make([]*Deliver, n)
	for i := range ds {
		d := benchDeliver().GetDeliver()
		d.DeliveryId += uint64(i)
		d.Offset += int64(i)
		d.Value = d.Value[:size]
		ds[i] = d
	}
	return ds
}

// batchSizes are the message sizes and counts of the batch benchmarks:
// 100 B and 1 KiB values, 250 per frame (about a 256 KiB frame of 1 KiB).
var batchSizes = []struct{ n, size int }{{250, 100}, {250, 1024}}

// BenchmarkWriteDeliverBatch measures WriteDeliverBatch, the daemon's path
// for batch clients; ns/msg is per delivery, beside BenchmarkWriteDeliver.
func BenchmarkWriteDeliverBatch(b *testing.B) {
	for _, bs := range batchSizes {
		b.Run(fmt.Sprintf("n=%d/value=%d", bs.n, bs.size), func(b *testing.B) {
			ds := benchBatch(bs.n, bs.size)
			w := NewWriter(io.Discard, 0)
			b.SetBytes(int64(encodedSize(b, DeliverBatchFrame(ds))))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if n, err := w.WriteDeliverBatch(ds, 0); err != nil || n != len(ds) {
					b.Fatal(n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ds)), "ns/msg")
		})
	}
}

// BenchmarkReadBatch measures ReadBatch, the Go client's decoding of a
// DeliverBatch: one buffer per frame, no allocation per message.
func BenchmarkReadBatch(b *testing.B) {
	for _, rd := range readers {
		for _, bs := range batchSizes {
			b.Run(fmt.Sprintf("reader=%s/n=%d/value=%d", rd.name, bs.n, bs.size), func(b *testing.B) {
				ds := benchBatch(bs.n, bs.size)
				var stream bytes.Buffer
				w := NewWriter(&stream, 0)
				if _, err := w.WriteDeliverBatch(ds, 0); err != nil {
					b.Fatal(err)
				}
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
				src := bytes.NewReader(stream.Bytes())
				r := rd.make(src, 0)
				var f Frame
				var batch Batch
				b.SetBytes(int64(stream.Len()))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					src.Reset(stream.Bytes())
					if ok, err := r.ReadBatch(&f, &batch); !ok || err != nil {
						b.Fatal(ok, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ds)), "ns/msg")
			})
		}
	}
}

// benchAckRanges is an Ack of 1000 ids in 4 ranges, as a client acks 4
// batches at once.
func benchAckRanges() *Frame {
	ranges := make([]uint64, 0, 8)
	for i := range 4 {
		ranges = append(ranges, 1<<40+uint64(i)*1000, 250)
	}
	return &Frame{Body: &Frame_Ack{Ack: &Ack{Ranges: ranges}}}
}

func BenchmarkWriteAckRanges(b *testing.B) { benchWrite(b, benchAckRanges()) }
func BenchmarkReadAckRanges(b *testing.B)  { benchRead(b, benchAckRanges()) }
