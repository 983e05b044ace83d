package server

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// BenchmarkDeliverPump measures one delivery of a 1 KiB message from
// ClientSink.Send through the pump and a loopback socket to a client that
// decodes it (protocol.Reader.ReadBatch, as the Go client does): in Deliver
// frames, and in DeliverBatch frames for a client with CAPABILITY_BATCH. The
// dispatcher's side is modelled by one Send per batch of a fresh slice (so
// allocs/op include 1/batch for that slice), and the next batch is sent
// when the client has the previous one, as credit would allow.
func BenchmarkDeliverPump(b *testing.B) {
	for _, frames := range []string{"deliver", "batch"} {
		for _, batch := range []int{1, 64, 256} {
			b.Run(fmt.Sprintf("frames=%s/batch=%d", frames, batch), func(b *testing.B) { benchPump(b, batch, frames == "batch") })
		}
	}
}

func benchPump(b *testing.B, batch int, batchFrames bool) {
	s := startServer(b, func(c *Config) { c.MaxInFlight = 1024 })
	c := dial(b, s)
	h := &protocol.Hello{ClientId: "bench", ProtocolVersion: protocol.Version}
	if batchFrames {
		h.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	}
	id := c.hello(h).GetSessionId()
	sink := s.b.sink(b, id)
	msg := &dispatch.Message{
		Partition: 3,
		Offset:    123456,
		Key:       []byte("order-42"),
		Value:     make([]byte, 1024),
		Headers:   []dispatch.Header{{Key: "trace-id", Value: []byte("0af7651916cd43dd8448eb211c80319c")}},
		Timestamp: time.UnixMilli(1764672000000),
	}

	var want atomic.Int64
	done := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		_ = c.nc.SetReadDeadline(time.Time{})
		r := protocol.NewReaderSize(c.nc, 0, 256<<10)
		var f protocol.Frame
		var got protocol.Batch
		var n int64
		for {
			ok, err := r.ReadBatch(&f, &got)
			if err != nil {
				readErr <- err
				return
			}
			if !ok {
				continue // a Ping
			}
			n += int64(len(got.Deliveries))
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
