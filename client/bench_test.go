package client

import (
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/protocol"
)

// BenchmarkAck measures acks per second from the Ack call through the
// writer to a daemon that counts the acked ids.
func BenchmarkAck(b *testing.B) {
	d := startFake(b)
	c, fc, _ := connectTo(b, d, Config{})
	fc.deliver(b, 1, "x")
	sess := receive(b, c).sess
	counted := make(chan int, 1)
	go func() {
		n := 0
		for n < b.N {
			f, err := fc.read(time.Minute)
			if err != nil {
				break
			}
			n += len(f.GetAck().GetDeliveryIds())
		}
		counted <- n
	}()
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

// BenchmarkReceive measures messages per second from the daemon's Deliver
// frames through the session's reader and Messages to an Ack, with the
// daemon reading the acks: the single-session path end to end.
func BenchmarkReceive(b *testing.B) {
	d := startFake(b)
	c, fc, _ := connectTo(b, d, Config{MaxInFlight: 1000})
	counted := make(chan int, 1)
	go func() {
		n := 0
		for n < b.N {
			f, err := fc.read(time.Minute)
			if err != nil {
				break
			}
			n += len(f.GetAck().GetDeliveryIds())
		}
		counted <- n
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
	for range b.N {
		m := <-c.Messages()
		if err := m.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	if n := <-counted; n != b.N {
		b.Fatalf("daemon counted %d acks, want %d", n, b.N)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
