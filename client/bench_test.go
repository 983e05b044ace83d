package client

import (
	"testing"
	"time"
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
