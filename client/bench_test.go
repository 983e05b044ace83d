package client

import (
	"fmt"
	"testing"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// BenchmarkAck measures acks per second from the Ack call through the
// writer to a daemon that counts the acked ids.
func BenchmarkAck(b *testing.B) {
	d := startFake(b)
	c, fc, _ := connectTo(b, d, Config{})
	fc.deliver(b, 1, "x")
	sess := receive(b, c).sess
	counted := fc.countAcks(b.N)
	msgs := make([]Message, b.N)
	for i := range msgs {
		msgs[i].DeliveryID = uint64(i)
		msgs[i].sess = sess
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range msgs {
		if err := msgs[i].Ack(); err != nil {
			b.Fatal(err)
		}
	}
	if n := <-counted; n != b.N {
		b.Fatalf("daemon counted %d acks, want %d", n, b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acks/s")
}

// BenchmarkReceive measures messages per second from the daemon's frames
// through the session's reader to an ack, with the daemon reading the acks:
// the single-session path end to end. frames=deliver is one Deliver frame
// per message, acked by id (a daemon without CAPABILITY_BATCH); the others
// are DeliverBatch frames of 64 messages, acked by ranges, received one by
// one on Messages or as Batches with one Batch.Ack each.
func BenchmarkReceive(b *testing.B) {
	for _, mode := range []string{"frames=deliver", "frames=batch/api=messages", "frames=batch/api=batches"} {
		for _, size := range []int{100, 1024} {
			b.Run(fmt.Sprintf("%s/value=%d", mode, size), func(b *testing.B) { benchReceive(b, mode, size) })
		}
	}
}

func benchReceive(b *testing.B, mode string, size int) {
	const perFrame = 64
	batches := mode == "frames=batch/api=batches"
	d := startFake(b)
	cfg := Config{MaxInFlight: 1000, Batches: batches, Addrs: []string{d.addr()}}
	ch := dialAsync(b, cfg)
	fc := d.accept(b)
	fc.expectHello(b)
	w := testWelcome()
	if mode != "frames=deliver" {
		w.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	}
	fc.send(b, protocol.WelcomeFrame(w))
	c := connected(b, ch)
	counted := fc.countAcks(b.N)
	value := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		ds := make([]*protocol.Deliver, perFrame)
		for i := range ds {
			ds[i] = &protocol.Deliver{Partition: 1, Value: value, Attempt: 1}
		}
		for i := 0; i < b.N; i += perFrame {
			n := min(perFrame, b.N-i)
			for j, d := range ds[:n] {
				d.DeliveryId, d.Offset = uint64(i+j+1), int64(i+j)
			}
			if mode == "frames=deliver" {
				for _, d := range ds[:n] {
					if err := fc.w.WriteDeliver(d); err != nil {
						return
					}
				}
			} else if _, err := fc.w.WriteDeliverBatch(ds[:n], 0); err != nil {
				return
			}
			_ = fc.w.Flush()
		}
	}()
	if batches {
		for got := 0; got < b.N; {
			batch := <-c.Batches()
			got += len(batch.Messages)
			if err := batch.Ack(); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		for range b.N {
			m := <-c.Messages()
			if err := m.Ack(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if n := <-counted; n != b.N {
		b.Fatalf("daemon counted %d acks, want %d", n, b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
