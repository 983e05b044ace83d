//go:build integration

package integration

// What one client can make the daemon hold, end to end against the real
// Kafka and ZooKeeper: connections that never say hello, and a client that
// floods Pings and never reads.

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/dispatch"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// boundsHeap returns HeapAlloc after a collection.
func boundsHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// boundsHeapPeak samples HeapAlloc until the returned function is called,
// which returns the highest value seen.
func boundsHeapPeak() func() uint64 {
	done, peak := make(chan struct{}), make(chan uint64, 1)
	go func() {
		var ms runtime.MemStats
		var top uint64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			top = max(top, ms.HeapAlloc)
			select {
			case <-done:
				peak <- top
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-peak }
}

// boundsConsume receives and acks n messages on c.
func boundsConsume(t *testing.T, c *client.Client, n int) {
	t.Helper()
	for range n {
		m := recv(t, c, 30*time.Second)
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
}

// 5,000 connections that never say hello: the daemon keeps at most
// --max-handshakes of them (the longest waiting are closed), its heap stays
// under a bound derived from that flag, and a real client connecting
// meanwhile receives and acks everything.
func TestBoundsSilentConnectionsDoNotStopAClient(t *testing.T) {
	// Not parallel: it measures the heap of the whole process.
	const partitions, n, silent = 2, 200, 5000
	topic := uniqueName(t, "bounds-silent")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.MetricsListen = "127.0.0.1:0"
	d := startDaemon(t, opts)
	metrics := "http://" + d.MetricsAddr().String() + "/metrics"
	base := boundsHeap()

	conns := make([]net.Conn, silent)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < silent; i += 8 {
				nc, err := net.DialTimeout("tcp", d.addr, 10*time.Second)
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
				conns[i] = nc
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, nc := range conns {
			if nc != nil {
				_ = nc.Close()
			}
		}
	})
	select {
	case err := <-errs:
		t.Fatalf("dial: %v", err)
	default:
	}

	evicted := `fanout_client_connections_closed_total{reason="handshake evicted"}`
	var got map[string]float64
	testutil.WaitFor(t, 30*time.Second, "the silent connections beyond --max-handshakes evicted", func() bool {
		got = scrape(t, metrics)
		return got[evicted] >= silent-fanout.DefaultMaxHandshakes
	})
	if w := got["fanout_client_handshakes_waiting"]; w > fanout.DefaultMaxHandshakes {
		t.Errorf("%v connections waiting for hello, more than --max-handshakes %d", w, fanout.DefaultMaxHandshakes)
	}
	// The bound: a connection waiting for its hello holds its conn, a 4 KiB
	// read-ahead buffer and no write buffer, about 9 KiB of heap with the
	// runtime's and logrus's share (12 KiB here), and at most --max-handshakes
	// of them wait. Each of the 5,000 counts up to 4 KiB more: the test's
	// client socket, and an evicted connection's final Error and linger for
	// half a second. 16 MiB of margin. Before the limit, each of the 5,000
	// held a 32 KiB read and a 64 KiB write buffer: about 480 MiB.
	const bound = fanout.DefaultMaxHandshakes*(12<<10) + silent*(4<<10) + 16<<20
	growth := int64(boundsHeap()) - int64(base)
	t.Logf("%d silent connections: heap %d MiB above the baseline (bound %d MiB), %v evicted",
		silent, growth>>20, bound>>20, got[evicted])
	if growth > bound {
		t.Errorf("heap grew by %d MiB with %d silent connections, bound %d MiB", growth>>20, silent, bound>>20)
	}

	// A real client, connecting now, receives and acks everything.
	c := dial(t, client.Config{MaxInFlight: 32}, d.addr)
	produceSeq(t, topic, "silent", n, partitions)
	boundsConsume(t, c, n)
	semWaitOffsets(t, d, semEnd(n, partitions))
}

// A client that floods Pings and never reads is dropped as a slow consumer
// once its unread Pongs pass --max-outbox-bytes; the daemon's heap stays
// under a bound derived from that flag, and a client consuming at the same
// time is not disturbed.
func TestBoundsPingFloodEndToEnd(t *testing.T) {
	// Not parallel: it measures the heap of the whole process.
	const n = 400
	topic := uniqueName(t, "bounds-ping")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	opts.MetricsListen = "127.0.0.1:0"
	d := startDaemon(t, opts)
	metrics := "http://" + d.MetricsAddr().String() + "/metrics"

	c := dial(t, client.Config{MaxInFlight: 16}, d.addr)
	produceSeq(t, topic, "before", n/2, 1)
	boundsConsume(t, c, n/2)

	flood := semDialRaw(t, d.addr, 4<<10)
	flood.hello(1)
	var pings bytes.Buffer
	pw := protocol.NewWriter(&pings, 0)
	for i := uint64(1); pings.Len()+pw.Buffered() < 64<<10; i++ {
		_ = pw.WriteFrame(protocol.PingFrame(i))
	}
	_ = pw.Flush()
	chunk := pings.Bytes()

	// Produced now, consumed during the flood.
	produceSeq(t, topic, "during", n/2, 1)
	base := boundsHeap()
	stop := boundsHeapPeak()
	consumed := make(chan error, 1)
	go func() {
		for i := range n / 2 {
			select {
			case m, ok := <-c.Messages():
				if !ok {
					consumed <- fmt.Errorf("client stopped after %d messages: %v", i, c.Err())
					return
				}
				if err := m.Ack(); err != nil {
					consumed <- fmt.Errorf("ack: %w", err)
					return
				}
			case <-time.After(60 * time.Second):
				consumed <- fmt.Errorf("%d of %d messages in 60 s", i, n/2)
				return
			}
		}
		consumed <- nil
	}()
	written := 0
	for written < 16<<20 {
		_ = flood.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		k, err := flood.nc.Write(chunk)
		written += k
		if err != nil {
			break // the daemon closed the connection
		}
	}
	peak := stop()
	// The bound: the flooder's outbox and the batch its pump writes hold at
	// most --max-outbox-bytes of entries each, and their slices as much again;
	// its buffers 96 KiB; the garbage of decoded Pings between collections is
	// at most the GC's goal above the live heap (GOGC=100: the live heap at
	// the baseline, at least 4 MiB); 16 MiB of margin for the consuming
	// client, Kafka fetches and sampling lag. Without the bound the Pongs of
	// 16 MiB of Pings take over 100 MiB.
	bound := int64(4*fanout.DefaultMaxOutboxBytes+96<<10) + max(int64(base), 4<<20) + 16<<20
	growth := int64(peak) - int64(base)
	t.Logf("flood of %d KiB of Pings: heap peak %d MiB above a live heap of %d MiB (bound %d MiB)",
		written>>10, growth>>20, base>>20, bound>>20)
	if growth > bound {
		t.Errorf("heap grew by %d MiB during the flood, bound %d MiB", growth>>20, bound>>20)
	}

	testutil.WaitFor(t, 30*time.Second, "the flooder closed as a slow consumer", func() bool {
		return scrape(t, metrics)[`fanout_client_connections_closed_total{reason="slow consumer"}`] == 1
	})
	if err := <-consumed; err != nil {
		t.Fatalf("the consuming client, during the flood: %v", err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("consuming client stopped: %v", err)
	}
	s := semWaitStats(t, d, 10*time.Second, "only the consumer left joined", func(s dispatch.Stats) bool { return s.Clients == 1 })
	// The flooder held one delivery (its credit), redelivered when it was
	// dropped; nothing timed out at the consumer.
	if s.Redelivered[dispatch.RedeliverTimeout] != 0 || s.Redelivered[dispatch.RedeliverDisconnect] > 1 {
		t.Errorf("redeliveries %v: want none but the flooder's one delivery", s.Redelivered)
	}
	semWaitOffsets(t, d, map[int32]int64{0: n})
}
