//go:build integration

package integration

import (
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// Every partition is consumed and every message reaches the client.
func TestDaemonConsumesEveryPartition(t *testing.T) {
	t.Parallel()
	const partitions, n = 8, 400
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	want := produceSeq(t, topic, "m", n, partitions)

	d := startDaemon(t, daemonOptions(t, topic))
	c := dial(t, client.Config{MaxInFlight: 64}, d.addr)
	seen := map[string]bool{}
	parts := map[int32]int{}
	for len(seen) < n {
		m := recv(t, c, 30*time.Second)
		seen[string(m.Value)] = true
		parts[m.Partition]++
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	for _, v := range want {
		if !seen[v] {
			t.Fatalf("message %q never delivered", v)
		}
	}
	if len(parts) != partitions {
		t.Fatalf("messages came from %d partitions, want %d: %v", len(parts), partitions, parts)
	}
	testutil.WaitFor(t, 10*time.Second, "offsets committed to the end of every partition", func() bool {
		offs := zkOffsets(t, d.opts.ID, topic)
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
}
