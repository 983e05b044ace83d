package server

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkHandshakingConnection measures what a connection that never
// sends its Hello holds in the daemon: its heap (the connection, its
// 4 KiB read-ahead, the waiting list's entry) and its two goroutines'
// stacks, per connection, over batches of 1000 silent connections. The
// dialled side's heap is counted too (a few hundred bytes); the kernel's
// socket buffers are not. Run it with
// go test -run '^$' -bench HandshakingConnection -benchtime 3x ./fanout/server/
func BenchmarkHandshakingConnection(b *testing.B) {
	const n = 1000
	s := startServer(b, func(c *Config) { c.MaxHandshakes = 2 * n; c.HelloTimeout = time.Minute })
	var heap, stack int64
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		conns := make([]net.Conn, n)
		for j := range conns {
			c, err := net.Dial("tcp", s.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conns[j] = c
		}
		for s.Stats().Handshaking < n {
			time.Sleep(5 * time.Millisecond)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap += int64(after.HeapAlloc) - int64(before.HeapAlloc)
		stack += int64(after.StackInuse) - int64(before.StackInuse)
		for _, c := range conns {
			_ = c.Close()
		}
		for s.Stats().Handshaking > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	b.ReportMetric(float64(heap)/float64(b.N*n), "heap-B/conn")
	b.ReportMetric(float64(stack)/float64(b.N*n), "stack-B/conn")
	b.ReportMetric(0, "ns/op")
}
