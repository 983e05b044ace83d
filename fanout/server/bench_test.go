package server

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// BenchmarkDeliverPump measures one delivery of a 1 KiB message from
// ClientSink.Send through the pump and a loopback socket to a client that
// discards it. The dispatcher's side is modelled by one Send per batch of a
// fresh slice (so allocs/op include 1/batch for that slice), and the next
// batch is sent when the client has the previous one, as credit would allow.
func BenchmarkDeliverPump(b *testing.B) {
	for _, batch := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchPump(b, batch) })
	}
}

func benchPump(b *testing.B, batch int) {
	s := startServer(b, func(c *Config) { c.MaxInFlight = 1024 })
	c, id := connect(b, s)
	sink := s.b.sink(b, id)
	msg := &dispatch.Message{
		Partition: 3,
		Offset:    123456,
		Key:       []byte("order-42"),
		Value:     make([]byte, 1024),
		Headers:   []dispatch.Header{{Key: "trace-id", Value: []byte("0af7651916cd43dd8448eb211c80319c")}},
		Timestamp: time.UnixMilli(1764672000000),
	}

	// The client reads only the length prefixes and skips the bodies.
	var want atomic.Int64
	done := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		_ = c.nc.SetReadDeadline(time.Time{})
		r := bufio.NewReaderSize(c.nc, 256<<10)
		var hdr [4]byte
		var n int64
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				readErr <- err
				return
			}
			if _, err := r.Discard(int(binary.BigEndian.Uint32(hdr[:]))); err != nil {
				readErr <- err
				return
			}
			n++
			if n == want.Load() {
				done <- struct{}{}
			}
		}
	}()

	b.SetBytes(int64(len(msg.Value)))
	b.ReportAllocs()
	timeout := time.NewTimer(testTimeout)
	defer timeout.Stop()
	b.ResetTimer()
	var next uint64
	for sent := 0; sent < b.N; {
		n := min(batch, b.N-sent)
		ds := make([]dispatch.Delivery, n)
		for i := range ds {
			next++
			ds[i] = dispatch.Delivery{ID: next, Attempt: 1, Msg: msg}
		}
		sent += n
		want.Store(int64(sent))
		sink.Send(ds)
		timeout.Reset(testTimeout)
		select {
		case <-done:
		case err := <-readErr:
			b.Fatalf("client read: %v", err)
		case <-timeout.C:
			b.Fatalf("timed out after %d of %d deliveries", sent-n, b.N)
		}
	}
	b.StopTimer()
}

// BenchmarkDeliverFrameSize measures dispatch.Config.FrameSize, called once
// per message as it enters the dispatcher.
func BenchmarkDeliverFrameSize(b *testing.B) {
	msg := &dispatch.Message{
		Partition: 3, Offset: 123456, Key: []byte("order-42"), Value: make([]byte, 1024),
		Headers: []dispatch.Header{{Key: "trace-id", Value: []byte("0af7651916cd43dd8448eb211c80319c")}},
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n += DeliverFrameSize(msg)
	}
	_ = n
}
