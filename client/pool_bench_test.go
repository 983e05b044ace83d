package client

import (
	"context"
	"fmt"
	"testing"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// BenchmarkConsume is BenchmarkReceive through Consume: messages per second
// from the daemon's Deliver frames through Messages and a worker pool whose
// handler returns nil at once, to the acks the daemon reads. It measures
// what the pool adds to the plain loop over Messages.
func BenchmarkConsume(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			d := startFake(b)
			c, fc, _ := connectTo(b, d, Config{MaxInFlight: 1000})
			counted := fc.countAcks(b.N)
			ctx, cancel := context.WithCancel(context.Background())
			consumed := make(chan error, 1)
			go func() {
				consumed <- c.Consume(ctx, workers, func(context.Context, *Message) error { return nil })
			}()
			value := make([]byte, 100)
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				d := &protocol.Deliver{Partition: 1, Value: value, Attempt: 1}
				for i := range b.N {
					d.DeliveryId, d.Offset = uint64(i+1), int64(i)
					if err := fc.w.WriteDeliver(d); err != nil {
						return
					}
					if i%64 == 63 {
						_ = fc.w.Flush()
					}
				}
				_ = fc.w.Flush()
			}()
			if n := <-counted; n != b.N {
				b.Fatalf("daemon counted %d acks, want %d", n, b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			cancel()
			if err := <-consumed; err != nil {
				b.Fatal(err)
			}
		})
	}
}
