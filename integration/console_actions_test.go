//go:build integration

package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// shortName returns prefix-<random hex>: a name unique to the run that
// reads well in a screenshot.
func shortName(t testing.TB, prefix string) string {
	t.Helper()
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + "-" + hex.EncodeToString(b[:])
}

// holder is a client that takes deliveries and acks none, driven through
// the protocol package: it answers the daemon's Pings and keeps every other
// frame, until the daemon closes its connection.
type holder struct {
	session uint64
	frames  chan *protocol.Frame // closed when the connection ends
}

// holdDeliveries connects a holder named name that takes up to max
// deliveries.
func holdDeliveries(t *testing.T, addr, name string, max uint32) *holder {
	t.Helper()
	c := semDialRaw(t, addr, 0)
	c.mustSend(protocol.HelloFrame(&protocol.Hello{ClientId: name, ProtocolVersion: protocol.Version, MaxInFlight: max}))
	f, err := c.read(30 * time.Second)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("holder %s: %v, %v; want a Welcome", name, f, err)
	}
	h := &holder{session: f.GetWelcome().GetSessionId(), frames: make(chan *protocol.Frame, 1024)}
	go func() {
		defer close(h.frames)
		for {
			f, err := c.read(10 * time.Minute)
			if err != nil {
				return
			}
			if p := f.GetPing(); p != nil {
				if c.send(protocol.PongFrame(p.GetNonce())) != nil {
					return
				}
				continue
			}
			h.frames <- f
		}
	}()
	return h
}

// next returns the holder's next frame, failing the test after timeout.
func (h *holder) next(t *testing.T, timeout time.Duration) (*protocol.Frame, bool) {
	t.Helper()
	select {
	case f, ok := <-h.frames:
		return f, ok
	case <-time.After(timeout):
		t.Fatalf("holder: no frame within %v", timeout)
		return nil, false
	}
}

// consoleClickHarness is a page that shows the console in a frame, clicks
// the element the selector names once it is shown and enabled, and writes
// into #result what the console answered (#action-result) once it has.
const consoleClickHarness = `<!doctype html>
<html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe id="f" src="/#token=%s" style="width:1280px;height:900px;border:0"></iframe>
<pre id="result">pending</pre>
<script>
const target = %s;
let clicked = false;
function step() {
  const doc = document.getElementById('f').contentDocument;
  const b = doc && doc.querySelector(target);
  if (!clicked) {
    if (!b || b.hidden || b.disabled) return setTimeout(step, 100);
    b.click();
    clicked = true;
  }
  const r = doc.getElementById('action-result');
  if (r.hidden || r.textContent.endsWith('…')) return setTimeout(step, 100);
  document.getElementById('result').textContent = JSON.stringify({text: r.textContent, failed: r.className === 'error'});
}
step();
</script>
</body></html>`

// consoleClick loads the console of the daemon at base with token in
// Chromium, through a proxy that serves the clicking page on the console's
// origin, clicks the element selector names and returns what the console
// said of the action.
func consoleClick(t *testing.T, base, token, selector string) string {
	t.Helper()
	sel, _ := json.Marshal(selector)
	doc := renderOnConsoleOrigin(t, base, fmt.Sprintf(consoleClickHarness, url.QueryEscape(token), sel), 15*time.Second)
	var got struct {
		Text   string `json:"text"`
		Failed bool   `json:"failed"`
	}
	res := text(byID(t, doc, "result"))
	if err := json.Unmarshal([]byte(res), &got); err != nil {
		t.Fatalf("clicking %s: the page says %q: the console did not answer", selector, res)
	}
	if got.Failed {
		t.Fatalf("clicking %s: the console says %q", selector, got.Text)
	}
	t.Logf("clicked %s: %s", selector, got.Text)
	return got.Text
}

// warningKinds returns the kinds of the warnings the page shows.
func warningKinds(t *testing.T, doc *html.Node) []string {
	t.Helper()
	list := byID(t, doc, "warnings")
	if hidden(list) {
		return nil
	}
	var out []string
	for _, li := range findAll(list, func(n *html.Node) bool { return n.Data == "li" }) {
		k, _ := attr(li, "data-warning")
		out = append(out, k)
	}
	return out
}

// docWarnings returns the kinds of the warnings of a status document.
func docWarnings(st *status.Status) []string {
	var out []string
	for _, w := range st.Node.Warnings {
		out = append(out, w.Kind)
	}
	return out
}

// TestConsoleActions runs a daemon with a metrics token against the real
// Kafka and ZooKeeper and acts on it from its console in headless Chromium:
// the warning of messages waiting without a client appears; the pause
// button stops the deliveries (messages produced meanwhile wait) and the
// resume button lets them flow; a client holding a message makes its
// partition held, which the page warns of; the drain button sends that
// client Goodbye, closes its connection and gives its message to the other
// client, and the warning goes. An action without the token is refused.
// The screenshot docs/console/console-actions.png is taken with the
// warning and the actions shown.
func TestConsoleActions(t *testing.T) {
	t.Parallel()
	topic := shortName(t, "orders")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	opts.ID = shortName(t, "billing")
	opts.NodeID = "console-node-a"
	opts.MetricsListen = "127.0.0.1:0"
	opts.MetricsToken = uniqueName(t, "token")
	opts.MaxOutstanding = 20
	opts.AckTimeout = 5 * time.Minute // the holder's message waits for the drain, not for a timeout
	d := startDaemon(t, opts)
	base := "http://" + d.MetricsAddr().String()
	page := base + "/#token=" + url.QueryEscape(opts.MetricsToken)
	token := opts.MetricsToken

	// Messages wait, and no client is connected.
	produceSeq(t, topic, "wait", 10, 1)
	testutil.WaitFor(t, 60*time.Second, "the no-clients warning in the document", func() bool {
		return slices.Contains(docWarnings(consoleStatus(t, base, token)), "no-clients")
	})
	doc := renderDOM(t, page, 8*time.Second)
	if got := warningKinds(t, doc); !slices.Contains(got, "no-clients") {
		t.Fatalf("the page warns of %q, want no-clients", got)
	}
	if got := text(byID(t, doc, "title")); got != topic {
		t.Errorf("title %q, want the topic %q", got, topic)
	}
	if got := text(byID(t, doc, "subtitle")); got != "service "+opts.ID+" · node console-node-a" {
		t.Errorf("subtitle %q", got)
	}

	var acked atomic.Int64
	worker := dial(t, client.Config{ClientID: "console-worker", MaxInFlight: 50}, d.addr)
	consoleAck(t, worker, &acked)
	testutil.WaitFor(t, 60*time.Second, "the worker acks the 10 waiting", func() bool { return acked.Load() == 10 })

	// An action without the token is refused, and changes nothing.
	req, _ := http.NewRequest(http.MethodPost, base+"/api/pause", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST /api/pause without the token: %d, want 401", resp.StatusCode)
	}
	if st := consoleStatus(t, base, token); st.Pause != nil || st.Node.DeliveryPaused {
		t.Fatalf("paused by a request without the token: %+v", st.Pause)
	}

	// Pause from the page: what is produced meanwhile waits.
	if got := consoleClick(t, base, token, "#pause-button"); !strings.HasPrefix(got, "Deliveries paused (version 1)") {
		t.Fatalf("the console says %q after the pause button", got)
	}
	st := consoleStatus(t, base, token)
	if p := st.Pause; p == nil || !p.Paused || p.Node != "console-node-a" || !strings.HasPrefix(p.By, "127.0.0.1:") || !st.Node.DeliveryPaused {
		t.Fatalf("after the pause: pause %+v, node paused %v", p, st.Node.DeliveryPaused)
	}
	if a := st.Node.Actions; len(a) != 1 || a[0].Kind != "pause" {
		t.Errorf("the node's actions %+v, want the pause", a)
	}
	delivered := d.stats(t).Delivered
	produceSeq(t, topic, "paused", 10, 1)
	testutil.WaitFor(t, 60*time.Second, "the 10 produced while paused in the high watermark", func() bool {
		st := consoleStatus(t, base, token)
		return len(st.Partitions) == 1 && st.Partitions[0].HighWatermark == 20
	})
	time.Sleep(3 * time.Second) // an absence of deliveries: give them time to happen
	if s := d.stats(t); s.Delivered != delivered || acked.Load() != 10 || !s.DeliveryPaused {
		t.Fatalf("while paused: delivered %d (was %d), acked %d; want nothing handed out", s.Delivered, delivered, acked.Load())
	}
	doc = renderDOM(t, page, 8*time.Second)
	if got := text(byID(t, doc, "deliveries")); got != "paused" {
		t.Errorf("the Deliveries card says %q while paused", got)
	}
	if !hidden(byID(t, doc, "pause-button")) || hidden(byID(t, doc, "resume-button")) {
		t.Error("while paused the page offers the pause button, or not the resume one")
	}

	// Resume from the page: they flow.
	if got := consoleClick(t, base, token, "#resume-button"); !strings.HasPrefix(got, "Deliveries resumed (version 2)") {
		t.Fatalf("the console says %q after the resume button", got)
	}
	testutil.WaitFor(t, 60*time.Second, "the 10 produced while paused acked after the resume", func() bool { return acked.Load() == 20 })

	// A client that holds a message and acks nothing (of the next two,
	// round-robin gives it one): behind it the partition holds more than
	// --max-outstanding offsets, and is held.
	h := holdDeliveries(t, d.addr, "console-holder", 1)
	testutil.WaitFor(t, 60*time.Second, "the holder joined", func() bool { return len(consoleStatus(t, base, token).Clients) == 2 })
	produceSeq(t, topic, "held", 2, 1)
	if f, _ := h.next(t, 60*time.Second); f.GetDeliver() == nil {
		t.Fatalf("holder: %v, want its delivery", f)
	}
	produceSeq(t, topic, "behind", 40, 1)
	testutil.WaitFor(t, 60*time.Second, "the partition held behind the holder's message, the warning in the document", func() bool {
		st := consoleStatus(t, base, token)
		return acked.Load() == 61 && len(st.Partitions) == 1 && st.Partitions[0].Held &&
			slices.Contains(docWarnings(st), "partitions-held")
	})
	doc = renderDOM(t, page, 8*time.Second)
	if got := warningKinds(t, doc); !slices.Contains(got, "partitions-held") {
		t.Fatalf("the page warns of %q, want partitions-held", got)
	}
	parts := rows(t, doc, "partitions", "data-partition")
	if len(parts) != 1 || text(cell(t, parts[0], "state")) != "held" {
		t.Fatalf("partition rows %d, state %q; want held", len(parts), text(cell(t, parts[0], "state")))
	}
	screenshot(t, page, filepath.Join(t.ArtifactDir(), "console-actions.png"), 1280, 1000)

	// Drain the holder from the page: Goodbye, then its connection closes
	// and its message goes to the worker.
	clicked := consoleClick(t, base, token, fmt.Sprintf(`button.drain[data-drain="%d"]`, h.session))
	if !strings.HasPrefix(clicked, "Draining console-holder") {
		t.Fatalf("the console says %q after the drain button", clicked)
	}
	gotGoodbye := false
	for {
		f, ok := h.next(t, 60*time.Second)
		if !ok {
			break // the daemon closed the connection
		}
		if g := f.GetGoodbye(); g != nil {
			gotGoodbye = strings.HasPrefix(g.GetReason(), "drained by 127.0.0.1:")
		}
	}
	if !gotGoodbye {
		t.Fatal("the holder's connection closed without a Goodbye naming who drained it")
	}
	testutil.WaitFor(t, 60*time.Second, "the held message acked by the worker, the partition no longer held", func() bool {
		st := consoleStatus(t, base, token)
		return acked.Load() == 62 && len(st.Clients) == 1 && len(st.Partitions) == 1 && !st.Partitions[0].Held &&
			*st.Partitions[0].Committed == 62 && !slices.Contains(docWarnings(st), "partitions-held")
	})
	st = consoleStatus(t, base, token)
	acts := st.Node.Actions
	if len(acts) != 3 || acts[2].Kind != "drain-client" || acts[2].Target != fmt.Sprintf("session %d", h.session) || acts[2].Result != "1 sessions" {
		t.Errorf("the node's actions %+v, want pause, resume and the drain", acts)
	}
	if c := st.Clients[0]; c.Name != "console-worker" || c.Acked != 62 || c.Nacked != 0 || c.TimedOut != 0 || c.Redelivered != 0 {
		t.Errorf("the worker %+v, want 62 acked and nothing else", c)
	}
	doc = renderDOM(t, page, 8*time.Second)
	if got := warningKinds(t, doc); len(got) != 0 {
		t.Errorf("the page still warns of %q", got)
	}
	recent := findAll(byID(t, doc, "recent-actions"), func(n *html.Node) bool { return n.Data == "li" })
	if len(recent) != 3 || !strings.Contains(text(recent[0]), "drain-client session") {
		t.Errorf("recent actions on the page: %d, first %q", len(recent), text(recent[0]))
	}
}

// TestPauseOutlivesTheLeader: two daemons with a metrics token, and a
// worker. fanout pause, asked of the follower, pauses the leader's
// deliveries; fanout status shows who paused them; the leader stops and
// the follower takes over paused; fanout resume lets everything flow, and
// nothing is lost.
func TestPauseOutlivesTheLeader(t *testing.T) {
	t.Parallel()
	bin := buildFanout(t)
	topic := uniqueName(t, "pause")
	createTopic(t, topic, 2)
	opts := daemonOptions(t, topic)
	opts.MetricsListen = "127.0.0.1:0"
	opts.MetricsToken = uniqueName(t, "token")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(opts.MetricsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lo := opts
	lo.NodeID = "pause-node-b" // the highest live node id leads
	leader := startDaemon(t, lo)
	fo := opts
	fo.NodeID = "pause-node-a"
	follower := runDaemon(t, fo)
	followerMetrics := follower.MetricsAddr().String()
	testutil.WaitFor(t, 60*time.Second, "the follower knows the leader", func() bool {
		st := consoleStatus(t, "http://"+followerMetrics, opts.MetricsToken)
		return st.Leader != nil && st.Leader.Node == "pause-node-b" && len(st.Members) == 2
	})

	var acked atomic.Int64
	worker := dial(t, client.Config{ClientID: "pause-worker", MaxInFlight: 20}, leader.addr, follower.addr)
	consoleAck(t, worker, &acked)
	produceSeq(t, topic, "before", 10, 2)
	testutil.WaitFor(t, 60*time.Second, "10 acked", func() bool { return acked.Load() == 10 })

	tool := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "FANOUT_METRICS_TOKEN=", "FANOUT_METRICS_TOKEN_FILE=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fanout %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := tool("pause", "--metrics-addr", followerMetrics, "--metrics-token-file", tokenFile, "--by", "ci")
	if !strings.Contains(out, "deliveries paused by ci from 127.0.0.1:") || !strings.Contains(out, "every member has it: pause-node-a, pause-node-b") {
		t.Fatalf("fanout pause: %s", out)
	}
	testutil.WaitFor(t, 30*time.Second, "the leader's dispatcher paused", func() bool { return leader.stats(t).DeliveryPaused })
	produceSeq(t, topic, "during", 10, 2)
	time.Sleep(3 * time.Second) // an absence of deliveries: give them time to happen
	if n := acked.Load(); n != 10 {
		t.Fatalf("%d acked while paused, want the 10 from before", n)
	}

	var st struct {
		Pause *status.Pause `json:"pause"`
	}
	js := tool("status", "--json", "--id", opts.ID, "--topic", topic, "--kafka", strings.Join(opts.Kafka, ","),
		"--zookeeper", strings.Join(opts.ZooKeeper, ","))
	if err := json.Unmarshal([]byte(js), &st); err != nil || st.Pause == nil || !st.Pause.Paused || st.Pause.Node != "pause-node-a" ||
		!strings.HasPrefix(st.Pause.By, "ci from ") {
		t.Fatalf("fanout status --json: pause %+v (%v)\n%s", st.Pause, err, js)
	}

	// The leader stops; the follower takes over, paused.
	if err := leader.stop(t); err != nil {
		t.Fatalf("leader stopped with %v", err)
	}
	follower.waitServing(t)
	testutil.WaitFor(t, 60*time.Second, "the new leader serving the worker, paused", func() bool {
		s, ok := follower.Stats(t.Context())
		return ok && s.DeliveryPaused && s.Clients == 1
	})
	time.Sleep(3 * time.Second) // an absence of deliveries: give them time to happen
	if n := acked.Load(); n != 10 {
		t.Fatalf("%d acked after the failover while paused, want 10", n)
	}

	out = tool("resume", "--metrics-addr", followerMetrics, "--metrics-token-file", tokenFile, "--by", "ci")
	if !strings.Contains(out, "deliveries resumed by ci") || !strings.Contains(out, "every member has it: pause-node-a") {
		t.Fatalf("fanout resume: %s", out)
	}
	testutil.WaitFor(t, 60*time.Second, "all 20 acked and committed after the resume", func() bool {
		st := consoleStatus(t, "http://"+followerMetrics, opts.MetricsToken)
		committed := int64(0)
		for _, p := range st.Partitions {
			if p.Committed != nil {
				committed += *p.Committed
			}
		}
		return acked.Load() >= 20 && committed == 20
	})
}

// postAction posts an action to the daemon whose metrics listener is at
// addr, with token, and fails the test unless it is taken.
func postAction(t *testing.T, addr, token, path, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d", path, resp.StatusCode)
	}
}

// TestPauseSpread: two spread members and a worker with a session on each.
// A pause asked of one member stops the deliveries of both; a resume asked
// of the other lets everything through, nothing lost.
func TestPauseSpread(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "pause")
	opts := daemonOptions(t, topic)
	opts.ZooKeeperSessionTimeout = 4 * time.Second
	testPauseSpread(t, opts)
}

// TestPauseSpreadKafka is TestPauseSpread on the Kafka store: the members
// share the partitions through the group, without a leader; the pause
// travels in their heartbeats all the same.
func TestPauseSpreadKafka(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "pause")
	opts := ksDaemonOptions(t, topic)
	opts.KafkaSessionTimeout = skSessionTimeout
	testPauseSpread(t, opts)
}

// testPauseSpread runs TestPauseSpread with opts (its topic not created
// yet) on the store they name.
func testPauseSpread(t *testing.T, opts fanout.Options) {
	const partitions = 4
	topic := opts.Topic
	createTopic(t, topic, partitions)
	opts.Assignment = fanout.AssignmentSpread
	opts.HandoffTimeout = 3 * time.Second
	opts.MetricsListen = "127.0.0.1:0"
	opts.MetricsToken = uniqueName(t, "token")
	var members []*testDaemon
	for _, id := range []string{"pause-spread-a", "pause-spread-b"} {
		o := opts
		o.NodeID = id
		members = append(members, startDaemon(t, o))
	}
	var acked atomic.Int64
	consoleAck(t, dial(t, client.Config{ClientID: "pause-spread-worker", MaxInFlight: 20}, members[0].addr, members[1].addr), &acked)
	testutil.WaitFor(t, 90*time.Second, "each member serving two partitions and the worker", func() bool {
		for _, m := range members {
			s, ok := m.Stats(t.Context())
			if !ok || s.Clients != 1 || len(m.Ownership().Owned) != partitions/2 {
				return false
			}
		}
		return true
	})
	produceSeq(t, topic, "before", 20, partitions)
	testutil.WaitFor(t, 60*time.Second, "20 acked", func() bool { return acked.Load() >= 20 })

	postAction(t, members[0].MetricsAddr().String(), opts.MetricsToken, "/api/pause", `{"by":"ci"}`)
	testutil.WaitFor(t, 30*time.Second, "both members' dispatchers paused", func() bool {
		for _, m := range members {
			if s, ok := m.Stats(t.Context()); !ok || !s.DeliveryPaused {
				return false
			}
		}
		return true
	})
	before := acked.Load()
	produceSeq(t, topic, "during", 20, partitions)
	time.Sleep(3 * time.Second) // an absence of deliveries: give them time to happen
	if n := acked.Load(); n != before {
		t.Fatalf("%d acked while paused, want %d", n, before)
	}
	st := consoleStatus(t, "http://"+members[1].MetricsAddr().String(), opts.MetricsToken)
	if st.Pause == nil || !st.Pause.Paused || st.Pause.Node != "pause-spread-a" || !strings.HasPrefix(st.Pause.By, "ci from ") {
		t.Fatalf("the other member's pause: %+v", st.Pause)
	}

	postAction(t, members[1].MetricsAddr().String(), opts.MetricsToken, "/api/resume", `{"by":"ci"}`)
	testutil.WaitFor(t, 60*time.Second, "all 40 acked and committed", func() bool {
		st := consoleStatus(t, "http://"+members[1].MetricsAddr().String(), opts.MetricsToken)
		committed := int64(0)
		for _, p := range st.Partitions {
			if p.Committed != nil {
				committed += *p.Committed
			}
		}
		return acked.Load() >= 40 && committed == 40
	})
}
