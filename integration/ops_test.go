//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// scrape fetches url (a Prometheus text exposition) and returns each
// sample by its series, e.g. `fanout_consumer_lag{partition="0"}`.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	code, body, _ := testutil.HTTPGet(t, url, "")
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("%s: bad sample line %q", url, line)
		}
		out[line[:i]] = v
	}
	return out
}

// buildFanout builds cmd/fanout into a temporary directory.
func buildFanout(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fanout")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nanoservice/core-fanout/cmd/fanout")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/fanout: %v\n%s", err, out)
	}
	return bin
}

// statusJSON mirrors the JSON document of fanout status --json.
type statusJSON struct {
	Leader *struct {
		Node  string `json:"node"`
		Epoch uint64 `json:"epoch"`
	} `json:"leader"`
	Members []struct {
		NodeID string `json:"node_id"`
		Role   string `json:"role"`
	} `json:"members"`
	Partitions []struct {
		Partition     int32  `json:"partition"`
		Committed     *int64 `json:"committed"`
		HighWatermark int64  `json:"high_watermark"`
		Lag           *int64 `json:"lag"`
	} `json:"partitions"`
	TotalLag int64 `json:"total_lag"`
}

// TestOpsMetricsHealthAndStatus runs a daemon with metrics, consumes and
// acks everything produced, and checks /metrics, /healthz, /readyz and
// fanout status against what was done.
func TestOpsMetricsHealthAndStatus(t *testing.T) {
	t.Parallel()
	const partitions, n = 3, 30
	topic := uniqueName(t, "ops")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.NodeID = "ops-node-a"
	opts.MetricsListen = "127.0.0.1:0"
	d := startDaemon(t, opts)
	base := "http://" + d.MetricsAddr().String()

	c := dial(t, client.Config{}, d.addr)
	produceSeq(t, topic, "ops", n, partitions)
	for range n {
		m := recv(t, c, 30*time.Second)
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}

	want := map[string]float64{
		"fanout_messages_acked_total":    n,
		"fanout_messages_consumed_total": n,
		"fanout_leader":                  1,
		"fanout_clients_connected":       1,
		"fanout_messages_in_flight":      0,
	}
	for p := range partitions {
		want[fmt.Sprintf(`fanout_consumer_lag{partition="%d"}`, p)] = 0
		want[fmt.Sprintf(`fanout_committed_offset{partition="%d"}`, p)] = n / partitions
		want[fmt.Sprintf(`fanout_high_watermark{partition="%d"}`, p)] = n / partitions
	}
	var got map[string]float64
	mismatch := func() string {
		for series, v := range want {
			if g, ok := got[series]; !ok || g != v {
				return fmt.Sprintf("%s = %v (present %v), want %v", series, g, ok, v)
			}
		}
		return ""
	}
	deadline := time.Now().Add(30 * time.Second)
	for got = scrape(t, base+"/metrics"); mismatch() != ""; got = scrape(t, base+"/metrics") {
		if time.Now().After(deadline) {
			t.Fatalf("metrics after acking %d messages: %s", n, mismatch())
		}
		time.Sleep(100 * time.Millisecond) // polling an HTTP endpoint, as waitFor does
	}
	for _, series := range []string{"fanout_leader_epoch", "fanout_cluster_members", "fanout_commit_duration_seconds_count"} {
		if got[series] < 1 {
			t.Errorf("%s = %v, want >= 1", series, got[series])
		}
	}
	if got["fanout_commit_failures_total"] != 0 {
		t.Errorf("fanout_commit_failures_total = %v, want 0", got["fanout_commit_failures_total"])
	}

	for _, tt := range []struct {
		path, body string
	}{
		{"/healthz", "ok\n"},
		{"/readyz", "leader: serving\n"},
	} {
		if code, body, _ := testutil.HTTPGet(t, base+tt.path, ""); code != http.StatusOK || body != tt.body {
			t.Errorf("GET %s = %d %q, want 200 %q", tt.path, code, body, tt.body)
		}
	}

	bin := buildFanout(t)
	args := []string{"status", "--id", opts.ID, "--topic", topic,
		"--kafka", strings.Join(kafkaAddrs(t), ","), "--zookeeper", strings.Join(zkAddrs(t), ",")}
	out, err := exec.Command(bin, append(args, "--json")...).Output()
	if err != nil {
		t.Fatalf("fanout status --json: %v", err)
	}
	var st statusJSON
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("fanout status --json printed %q: %v", out, err)
	}
	if st.Leader == nil || st.Leader.Node != opts.NodeID || st.Leader.Epoch < 1 {
		t.Errorf("status leader = %+v, want node %s", st.Leader, opts.NodeID)
	}
	if len(st.Members) != 1 || st.Members[0].NodeID != opts.NodeID || st.Members[0].Role != "leader" {
		t.Errorf("status members = %+v, want %s as leader", st.Members, opts.NodeID)
	}
	if len(st.Partitions) != partitions || st.TotalLag != 0 {
		t.Fatalf("status partitions = %+v, total lag %d; want %d partitions, lag 0", st.Partitions, st.TotalLag, partitions)
	}
	for _, p := range st.Partitions {
		if p.Committed == nil || *p.Committed != p.HighWatermark || p.HighWatermark != n/partitions || p.Lag == nil || *p.Lag != 0 {
			t.Errorf("status partition %d: committed %v, high watermark %d, lag %v; want %d, %d, 0",
				p.Partition, p.Committed, p.HighWatermark, p.Lag, n/partitions, n/partitions)
		}
	}

	text, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("fanout status: %v\n%s", err, text)
	}
	t.Logf("fanout status:\n%s", text)
	for _, line := range []string{"leader   " + opts.NodeID + " (epoch ", "lag      0\n"} {
		if !strings.Contains(string(text), line) {
			t.Errorf("fanout status lacks %q", line)
		}
	}
}

// TestStatusUnreachable checks that fanout status fails with exit code 1
// and names the server it cannot reach.
func TestStatusUnreachable(t *testing.T) {
	t.Parallel()
	bin := buildFanout(t)
	for _, tt := range []struct {
		name, kafka, zk, want string
	}{
		{"kafka", "127.0.0.1:1", strings.Join(zkAddrs(t), ","), "kafka unreachable at 127.0.0.1:1"},
		{"zookeeper", strings.Join(kafkaAddrs(t), ","), "127.0.0.1:1", "zookeeper unreachable at 127.0.0.1:1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, "status", "--id", "svc", "--topic", "t", "--kafka", tt.kafka, "--zookeeper", tt.zk, "--timeout", "2s")
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), tt.want) {
				t.Errorf("fanout status = %v, output %q; want exit 1 and %q", err, out, tt.want)
			}
		})
	}
}
