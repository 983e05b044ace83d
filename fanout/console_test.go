package fanout

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The console's document of a daemon leading alone, with two clients that
// acked what they got: its node, the partition's offsets and owner, both
// clients with their acks, and rates sampled while it served; the same
// document at /api/status.
func TestDaemonStatus(t *testing.T) {
	d, brokers, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.NodeID = "solo-node"
		o.MetricsListen = "127.0.0.1:0"
	})
	var clients []*client.Client
	for _, name := range []string{"beta", "alpha"} {
		c, err := client.Dial(context.Background(), client.Config{Addrs: []string{d.Addr().String()}, ClientID: name, MaxInFlight: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	testutil.WaitFor(t, 10*time.Second, "both clients joined", func() bool {
		return len(d.Status(context.Background()).Clients) == 2
	})
	const n = 6
	for range n {
		produceTo(t, brokers, "job")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for got := 0; got < n; got++ {
		var m *client.Message
		select {
		case m = <-clients[0].Messages():
		case m = <-clients[1].Messages():
		case <-ctx.Done():
			t.Fatalf("%d of %d messages within 30s", got, n)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}

	var st *status.Status
	testutil.WaitFor(t, 15*time.Second, "every ack counted, the offset committed and a rate sampled", func() bool {
		st = d.Status(context.Background())
		var acked uint64
		for _, c := range st.Clients {
			acked += c.Acked
		}
		sampled := false
		for _, p := range st.Rates.Points {
			sampled = sampled || p.Acked > 0
		}
		return acked == n && len(st.Partitions) == 1 && st.Partitions[0].Committed != nil &&
			*st.Partitions[0].Committed == n && sampled
	})
	if nd := st.Node; nd.NodeID != "solo-node" || nd.Role != "leader" || !nd.Serving || !nd.Ready || nd.Clients != 2 || nd.InFlight != 0 {
		t.Errorf("node %+v", nd)
	}
	if st.Leader == nil || st.Leader.Node != "solo-node" || len(st.Members) != 1 || st.Members[0].NodeID != "solo-node" {
		t.Errorf("leader %+v, members %+v", st.Leader, st.Members)
	}
	if p := st.Partitions[0]; p.Partition != 0 || p.HighWatermark != n || *p.Lag != 0 || p.Owner != "solo-node" || st.TotalLag != 0 {
		t.Errorf("partition %+v, total lag %d", p, st.TotalLag)
	}
	if st.Clients[0].Name != "alpha" || st.Clients[1].Name != "beta" {
		t.Errorf("clients %+v, want alpha then beta", st.Clients)
	}
	for _, c := range st.Clients {
		if !strings.HasPrefix(c.Addr, "127.0.0.1:") || c.Role != status.ClientRoleWorker || c.MaxInFlight != 1 ||
			c.Acked == 0 || c.ConnectedAt.IsZero() || c.Weight != nil {
			t.Errorf("client %+v", c)
		}
	}
	if st.Rates.IntervalSeconds != 2 {
		t.Errorf("rate interval %v s", st.Rates.IntervalSeconds)
	}

	resp, err := http.Get("http://" + d.MetricsAddr().String() + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got status.Status
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/status: %d, %v", resp.StatusCode, err)
	}
	if got.Node == nil || got.Node.NodeID != "solo-node" || len(got.Clients) != 2 || len(got.Partitions) != 1 {
		t.Errorf("/api/status: node %+v, %d clients, %d partitions", got.Node, len(got.Clients), len(got.Partitions))
	}
}
