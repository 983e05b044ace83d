package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The console's document of a daemon leading alone, with two clients that
// acked what they got: its node, the partition's offsets and owner, both
// clients with their acks, and rates sampled while it served; the same
// document at /api/status.
func TestDaemonStatus(t *testing.T) {
	t.Parallel()
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
	if st.Mode != "leader" || st.Members[0].Mode != "leader" || st.Node.Mode != "leader" || st.Assignment != nil {
		t.Errorf("mode %q, member's %q, node's %q, assignment %+v: want leader mode", st.Mode, st.Members[0].Mode, st.Node.Mode, st.Assignment)
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

// The console's reading of the whole topic in spread mode is shared: within
// maxAge every request gets the last read (its error too), after it the
// next request reads again; a read cut short by its request's end is not
// kept for the others.
func TestClusterViewSharesReads(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	reads := 0
	var fail error
	var during func() // called within the read
	v := newClusterView(func(ctx context.Context) (clusterRead, error) {
		reads++
		if during != nil {
			during()
		}
		if err := ctx.Err(); err != nil {
			return clusterRead{}, err
		}
		return clusterRead{highWatermarks: map[int32]int64{0: int64(reads)}}, fail
	}, 2*time.Second)
	v.now = func() time.Time { return now }
	ctx := context.Background()

	get := func(wantHW int64, wantErr bool) {
		t.Helper()
		r, err := v.get(ctx)
		if (err != nil) != wantErr || (err == nil && r.highWatermarks[0] != wantHW) {
			t.Fatalf("get: %v, %v; want high watermark %d, error %v", r.highWatermarks, err, wantHW, wantErr)
		}
	}
	get(1, false)
	now = now.Add(1999 * time.Millisecond)
	get(1, false) // shared
	if reads != 1 {
		t.Fatalf("%d reads within maxAge, want 1", reads)
	}
	now = now.Add(time.Millisecond)
	get(2, false) // read again

	fail = errors.New("zk: connection closed")
	now = now.Add(2 * time.Second)
	get(0, true)
	get(0, true) // the failure is shared too: no read per request while ZooKeeper is away
	if reads != 3 {
		t.Fatalf("%d reads, want 3", reads)
	}

	fail = nil
	now = now.Add(2 * time.Second)
	cancelled, cancel := context.WithCancel(ctx)
	during = cancel // the request ends while its read runs
	if _, err := v.get(cancelled); err == nil {
		t.Fatal("a request cancelled during its read got a read")
	}
	during = nil
	get(5, false) // the cancelled one's outcome (read 4) was not kept
	if _, err := v.get(cancelled); err == nil || reads != 5 {
		t.Fatalf("an ended request: %v after %d reads, want an error and no read", err, reads)
	}
}

// In spread mode a member's document shows every partition of the topic
// from the shared read, each with the owner its live record names; when the
// read fails, the partitions the member serves, and why the rest is missing.
func TestSpreadPartitions(t *testing.T) {
	m := &spreadMode{d: &Daemon{opts: Options{NodeID: "m-a", Assignment: AssignmentSpread}}}
	snap := metrics.Snapshot{Serving: true, HighWaterMarks: map[int32]int64{0: 10}}
	snap.Stats.Committed = map[int32]int64{0: 4}
	newStatus := func() *status.Status { return &status.Status{Node: &status.Node{NodeID: "m-a"}} }

	st := newStatus()
	m.partitions(context.Background(), st, snap)
	if len(st.Partitions) != 0 || st.Node.Partial != "" {
		t.Fatalf("before the member joins the cluster: %+v, partial %q", st.Partitions, st.Node.Partial)
	}

	read := clusterRead{
		committed:      map[int32]int64{0: 5, 1: 7},
		highWatermarks: map[int32]int64{0: 10, 1: 7, 2: 3},
		holdings: authority.Holdings{Holders: map[int32]status.Holder{
			0: {Node: "m-a", Live: true},
			1: {Node: "m-b", Live: true},
			2: {Node: "m-c"}, // its session is gone
		}},
	}
	var fail error
	m.view.Store(newClusterView(func(context.Context) (clusterRead, error) { return read, fail }, 0))
	st = newStatus()
	m.partitions(context.Background(), st, snap)
	type part struct {
		p         int32
		committed int64 // -1: none
		hw        int64
		owner     string
	}
	var got []part
	for _, p := range st.Partitions {
		c := int64(-1)
		if p.Committed != nil {
			c = *p.Committed
		}
		got = append(got, part{p.Partition, c, p.HighWatermark, p.Owner})
	}
	want := []part{{0, 5, 10, "m-a"}, {1, 7, 7, "m-b"}, {2, -1, 3, ""}}
	if !slices.Equal(got, want) || st.TotalLag != 5 || st.Node.Partial != "" {
		t.Errorf("partitions %v (total lag %d, partial %q), want %v and lag 5", got, st.TotalLag, st.Node.Partial, want)
	}

	fail = errors.New("zk: connection closed")
	st = newStatus()
	m.partitions(context.Background(), st, snap)
	if len(st.Partitions) != 1 || st.Partitions[0].Owner != "m-a" || *st.Partitions[0].Committed != 4 ||
		!strings.Contains(st.Node.Partial, "zk: connection closed") {
		t.Errorf("read failed: partitions %+v, partial %q; want the member's own and why", st.Partitions, st.Node.Partial)
	}
}

// Weights and roles in the document: while a worker gives a weight other
// than the default, every worker shows its weight; an observer is listed
// with its role and no weight; with default weights alone none is shown.
func TestDaemonStatusWeightsAndObservers(t *testing.T) {
	t.Parallel()
	d, _, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) { o.MetricsListen = "127.0.0.1:0" })
	dialAs := func(cfg client.Config) *client.Client {
		t.Helper()
		cfg.Addrs = []string{d.Addr().String()}
		c, err := client.Dial(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	byName := func(n int) map[string]status.Client {
		t.Helper()
		var st *status.Status
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d clients in the document", n), func() bool {
			st = d.Status(context.Background())
			return len(st.Clients) == n
		})
		out := map[string]status.Client{}
		for _, c := range st.Clients {
			out[c.Name] = c
		}
		return out
	}

	dialAs(client.Config{ClientID: "stable"})
	dialAs(client.Config{ClientID: "watcher", Observe: true})
	got := byName(2)
	if c := got["stable"]; c.Role != status.ClientRoleWorker || c.Weight != nil {
		t.Errorf("stable alone at the default weight: %+v, want a worker without weight", c)
	}
	if c := got["watcher"]; c.Role != status.ClientRoleObserver || c.Weight != nil || c.MaxInFlight != 0 {
		t.Errorf("watcher %+v, want an observer without weight or credit", c)
	}

	dialAs(client.Config{ClientID: "canary", Weight: 5})
	got = byName(3)
	for name, want := range map[string]uint32{"stable": protocol.DefaultWeight, "canary": 5} {
		if c := got[name]; c.Role != status.ClientRoleWorker || c.Weight == nil || *c.Weight != want {
			t.Errorf("%s with a canary beside it: %+v, want a worker of weight %d", name, c, want)
		}
	}
	if c := got["watcher"]; c.Role != status.ClientRoleObserver || c.Weight != nil {
		t.Errorf("watcher %+v, want an observer without weight", c)
	}
}

// A client that proved who it is (here a named token) is named by that
// identity in the status document the console shows.
func TestDaemonStatusNamesClientIdentity(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("billing:tok-billing-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, _, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.MetricsListen, o.AuthTokensFile = "127.0.0.1:0", tokens
	})
	c, err := client.Dial(context.Background(), client.Config{Addrs: []string{d.Addr().String()}, ClientID: "w",
		AuthToken: "tok-billing-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var st *status.Status
	testutil.WaitFor(t, 10*time.Second, "the client in the document", func() bool {
		st = d.Status(context.Background())
		return len(st.Clients) == 1
	})
	if got := st.Clients[0].Identity; got != "token billing" {
		t.Errorf("identity %q, want %q", got, "token billing")
	}
}
