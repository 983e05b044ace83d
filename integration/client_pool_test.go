//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The Go client's worker pool (Consume) and graceful stop (Shutdown)
// against real daemons, in leader mode and in spread mode: every message is
// processed once; Shutdown, with a handler running on every partition and
// messages waiting behind them, nacks those waiting, lets the handlers
// finish and their acks reach the daemons, which commit them; the nacked
// ones come to the next client.
func TestClientConsumeShutdown(t *testing.T) {
	t.Parallel()
	t.Run("leader", func(t *testing.T) { testClientConsumeShutdown(t, false) })
	t.Run("spread", func(t *testing.T) { testClientConsumeShutdown(t, true) })
}

func testClientConsumeShutdown(t *testing.T, spread bool) {
	const partitions, n = 4, 200
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	var c *clCluster
	if spread {
		c = spNewCluster(t, topic, 2)
	} else {
		c = clNewCluster(t, topic, 2)
	}
	c.startAll()
	addrs := []string{c.nodes[0].addr, c.nodes[1].addr}
	if spread {
		spWaitOwned(t, spZK(t), c, c.nodes, partitions, 60*time.Second)
		addrs = addrs[:1] // the client follows the member list from one
	} else {
		clWaitLeader(t, c.nodes, 60*time.Second)
	}
	cfg := clClientConfig("pool", &clHook{})
	cfg.MaxInFlight = 16
	cl := dial(t, cfg, addrs...)
	if spread {
		testutil.WaitFor(t, 30*time.Second, "a session with each member", func() bool { return len(cl.Members()) == 2 })
	}

	var mu sync.Mutex
	seen := map[string]int{}
	running := 0
	release := make(chan struct{})
	consumed := make(chan error, 1)
	go func() {
		consumed <- cl.Consume(context.Background(), partitions, func(ctx context.Context, m *client.Message) error {
			v := string(m.Value)
			mu.Lock()
			seen[v]++
			mu.Unlock()
			if !strings.HasPrefix(v, "slow-") {
				return nil
			}
			mu.Lock()
			running++
			mu.Unlock()
			// Touched meanwhile: the daemons' ack timeout is 3 s.
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
					_ = m.Touch()
				}
			}
		})
	}()
	produceSeq(t, topic, "m", n, partitions)
	testutil.WaitFor(t, 60*time.Second, fmt.Sprintf("the %d messages processed", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	})

	// A handler running on every partition, a message waiting behind each.
	produceSeq(t, topic, "slow", partitions, partitions)
	produceSeq(t, topic, "after", partitions, partitions)
	testutil.WaitFor(t, 30*time.Second, "a slow handler per partition and the rest waiting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return running == partitions && len(cl.Messages()) == partitions
	})
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		shut <- cl.Shutdown(ctx)
	}()
	testutil.WaitFor(t, 30*time.Second, "Shutdown to nack the waiting messages", func() bool { return len(cl.Messages()) == 0 })
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with handlers running", err)
	default:
	}
	close(release)
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown = %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if err := <-consumed; err != nil {
		t.Errorf("Consume = %v after Shutdown", err)
	}
	want := int64(n/partitions + 1) // the m messages and the slow one; "after" was nacked
	testutil.WaitFor(t, 30*time.Second, "the slow messages' offsets committed", func() bool {
		offs := c.offsets()
		for p := range int32(partitions) {
			if offs[p] < want {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for v, k := range seen {
		if k != 1 || strings.HasPrefix(v, "after-") {
			t.Errorf("%s processed %d times", v, k)
		}
	}
	mu.Unlock()

	// The nacked messages come to the next client.
	next := dial(t, clClientConfig("next", &clHook{}), addrs...)
	got := map[string]bool{}
	for len(got) < partitions {
		m := recv(t, next, 30*time.Second)
		if !strings.HasPrefix(string(m.Value), "after-") {
			t.Fatalf("the next client got %s, want only the nacked after-*", m.Value)
		}
		got[string(m.Value)] = true
		_ = m.Ack()
	}
}
