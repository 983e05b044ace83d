//go:build integration

package integration

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// chromium runs Debian's headless Chromium with args, plus the flags that
// make it work here as root and keep it off the network, and returns what it
// printed. A missing chromium fails the test: bin/deps installs it.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): bin/deps installs Debian's chromium package", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(),
	}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %q: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// renderDOM loads pageURL in Chromium, lets its scripts run for budget of
// virtual time, and returns the DOM they left.
func renderDOM(t *testing.T, pageURL string, budget time.Duration) *html.Node {
	t.Helper()
	out := chromium(t, "--window-size=1280,1200", fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds()),
		"--dump-dom", pageURL)
	doc, err := html.Parse(strings.NewReader(out))
	if err != nil {
		t.Fatalf("parse the DOM of %s: %v", pageURL, err)
	}
	return doc
}

// screenshot saves pageURL as rendered in a window of width x height to
// path and returns the picture.
func screenshot(t *testing.T, pageURL, path string, width, height int) image.Image {
	t.Helper()
	chromium(t, fmt.Sprintf("--window-size=%d,%d", width, height), "--virtual-time-budget=8000",
		"--screenshot="+path, pageURL)
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Fatalf("screenshot %s is %dx%d, want %dx%d", path, b.Dx(), b.Dy(), width, height)
	}
	colors := map[uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 3 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 3 {
			r, g, b, _ := img.At(x, y).RGBA()
			colors[r>>8<<16|g>>8<<8|b>>8] = true
		}
	}
	if len(colors) < 20 {
		t.Fatalf("screenshot %s has %d colors: a blank page?", path, len(colors))
	}
	return img
}

// The DOM, queried as the tests need it.

func attr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}
	return "", false
}

func hasClass(n *html.Node, class string) bool {
	v, _ := attr(n, "class")
	for _, c := range strings.Fields(v) {
		if c == class {
			return true
		}
	}
	return false
}

// findAll returns the element nodes under n (n included) for which match
// is true, in document order.
func findAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && match(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func byID(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	found := findAll(doc, func(n *html.Node) bool { v, _ := attr(n, "id"); return v == id })
	if len(found) != 1 {
		t.Fatalf("%d elements with id %q in the rendered page", len(found), id)
	}
	return found[0]
}

// cell returns the td of class class in row.
func cell(t *testing.T, row *html.Node, class string) *html.Node {
	t.Helper()
	found := findAll(row, func(n *html.Node) bool { return n.Data == "td" && hasClass(n, class) })
	if len(found) != 1 {
		t.Fatalf("%d cells of class %q in a row of %q", len(found), class, text(row))
	}
	return found[0]
}

// rows returns the tbody rows of table id that carry attribute key.
func rows(t *testing.T, doc *html.Node, table, key string) []*html.Node {
	t.Helper()
	return findAll(byID(t, doc, table), func(n *html.Node) bool { _, ok := attr(n, key); return n.Data == "tr" && ok })
}

// text returns the text under n, as a person reads it.
func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(b.String())
}

func hidden(n *html.Node) bool { _, ok := attr(n, "hidden"); return ok }

// number reads a number the page formatted with thousands separators.
func number(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return v
}

// consoleStatus reads the daemon's /api/status, with token when not empty.
func consoleStatus(t *testing.T, base, token string) *status.Status {
	t.Helper()
	auth := ""
	if token != "" {
		auth = "Bearer " + token
	}
	code, body, _ := testutil.HTTPGet(t, base+"/api/status", auth)
	var st status.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK {
		t.Fatalf("GET /api/status: %d, %v", code, err)
	}
	return &st
}

// consoleAck acks every message c receives until the test ends, counting
// them in acked.
func consoleAck(t *testing.T, c *client.Client, acked *atomic.Int64) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for {
			select {
			case m, ok := <-c.Messages():
				if !ok {
					return
				}
				if m.Ack() == nil {
					acked.Add(1)
				}
			case <-ctx.Done():
				return
			}
		}
	}()
}

// TestConsoleInChromium runs a daemon with a metrics token against the real
// Kafka and ZooKeeper, with two clients acking a flow of messages (one of
// its own weight) and an observer, and loads its console in headless
// Chromium: without the token it asks for it and shows nothing; with it, it
// shows the leader, both workers with their weights (a name that is markup
// shown as text), the observer, every partition with the offsets the daemon
// reports, and charts with data. It saves screenshots under the test's
// output (go test -artifacts), the desktop one while messages flow, and
// checks the page at a phone's width.
func TestConsoleInChromium(t *testing.T) {
	t.Parallel()
	const partitions, n = 3, 600 // about 12 s of flow, for the charts
	topic := shortName(t, "orders")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.ID = shortName(t, "billing")
	opts.NodeID = "console-node-a"
	opts.MetricsListen = "127.0.0.1:0"
	opts.MetricsToken = uniqueName(t, "token")
	d := startDaemon(t, opts)
	base := "http://" + d.MetricsAddr().String()

	// Two workers, the second at half the default weight, and an observer.
	names, weights := []string{"console-worker-1", "console-worker-<b>2</b>"}, []int{0, 50}
	var acked atomic.Int64
	for i, name := range names {
		consoleAck(t, dial(t, client.Config{ClientID: name, MaxInFlight: 20, Weight: weights[i]}, d.addr), &acked)
	}
	observer := dial(t, client.Config{ClientID: "console-zz-observer", Observe: true}, d.addr)
	go func() {
		for range observer.Messages() { // copies: nothing to ack
		}
	}()
	produced := procProducePaced(t, topic, n, partitions, 15, 300*time.Millisecond)

	// While the flow goes on: both clients ack, and the sampler sees it
	// (three samples, so that the charts draw lines).
	var st *status.Status
	testutil.WaitFor(t, 90*time.Second, "both clients acking and three sampled ack rates", func() bool {
		st = consoleStatus(t, base, opts.MetricsToken)
		perClient := 0
		for _, c := range st.Clients {
			if c.Acked > 0 && c.AcksPerSecond > 0 {
				perClient++
			}
		}
		sampled := 0
		for _, p := range st.Rates.Points {
			if p.Acked > 0 {
				sampled++
			}
		}
		return perClient == 2 && sampled >= 3
	})
	// The desktop screenshot while messages flow (docs/metrics.md shows it).
	page := base + "/#token=" + url.QueryEscape(opts.MetricsToken)
	dir := t.ArtifactDir()
	screenshot(t, page, filepath.Join(dir, "console.png"), 1280, 860)
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}
	testutil.WaitFor(t, 90*time.Second, "every message acked and committed", func() bool {
		st = consoleStatus(t, base, opts.MetricsToken)
		if acked.Load() < n || len(st.Partitions) != partitions {
			return false
		}
		for _, p := range st.Partitions {
			if p.Committed == nil || *p.Committed != n/partitions || p.HighWatermark != n/partitions {
				return false
			}
		}
		return true
	})

	// Without the token the page asks for it and shows no data.
	doc := renderDOM(t, base+"/", 5*time.Second)
	if hidden(byID(t, doc, "token-form")) || !hidden(byID(t, doc, "overview")) {
		t.Fatal("without the token: the token form is hidden or the overview is shown")
	}
	for _, name := range append(names, "console-node-a") {
		if strings.Contains(text(doc), name) {
			t.Fatalf("without the token the page shows %q", name)
		}
	}

	// With the token, handed over in the fragment.
	doc = renderDOM(t, page, 10*time.Second)
	if !hidden(byID(t, doc, "token-form")) || hidden(byID(t, doc, "overview")) {
		t.Fatal("with the token: the token form is shown or the overview hidden")
	}
	if got := text(byID(t, doc, "leader")); got != "console-node-a" {
		t.Errorf("leader %q, want console-node-a", got)
	}
	if got, sub := text(byID(t, doc, "title")), text(byID(t, doc, "subtitle")); got != topic || sub != "service "+opts.ID+" · node console-node-a" {
		t.Errorf("title %q, subtitle %q", got, sub)
	}
	if got := text(byID(t, doc, "deliveries")); got != "flowing" || hidden(byID(t, doc, "pause-button")) || !hidden(byID(t, doc, "actions-note")) {
		t.Errorf("deliveries %q, the pause button hidden %v, the note of a daemon without a token shown %v",
			got, hidden(byID(t, doc, "pause-button")), !hidden(byID(t, doc, "actions-note")))
	}
	members := rows(t, doc, "members", "data-node")
	if len(members) != 1 || text(cell(t, members[0], "node")) != "console-node-a" || !hasClass(members[0], "leader") {
		t.Errorf("members: %d rows, want console-node-a marked as leader", len(members))
	}

	want := map[string]status.Client{}
	for _, c := range st.Clients {
		want[c.Name] = c
	}
	clientRows := rows(t, doc, "clients", "data-client")
	if len(clientRows) != 3 {
		t.Fatalf("%d client rows, want 2 workers and the observer", len(clientRows))
	}
	if hasClass(byID(t, doc, "clients"), "no-weight") {
		t.Error("the weight column is hidden while a worker has a weight of its own")
	}
	obs := clientRows[2]
	if got := [4]string{text(cell(t, obs, "name")), text(cell(t, obs, "role")), text(cell(t, obs, "weight")), text(cell(t, obs, "in-flight"))}; got != [4]string{"console-zz-observer", "observer", "–", "–"} {
		t.Errorf("observer row: name, role, weight, in flight %q", got)
	}
	for i, row := range clientRows[:2] {
		nameCell := cell(t, row, "name")
		name := text(nameCell)
		if name != names[i] {
			t.Errorf("client %d: name %q, want %q", i, name, names[i])
		}
		if kids := findAll(nameCell, func(n *html.Node) bool { return n != nameCell }); len(kids) != 0 {
			t.Errorf("client name %q became markup: <%s>", name, kids[0].Data)
		}
		c := want[name]
		if got := number(t, text(cell(t, row, "acked"))); got != int64(c.Acked) || got == 0 {
			t.Errorf("client %q: acked %d on the page, %d in /api/status", name, got, c.Acked)
		}
		if got := text(cell(t, row, "addr")); got != c.Addr || !strings.HasPrefix(got, "127.0.0.1:") {
			t.Errorf("client %q: address %q on the page, %q in /api/status", name, got, c.Addr)
		}
		if got := text(cell(t, row, "role")); got != "worker" {
			t.Errorf("client %q: role %q", name, got)
		}
		if got, want := text(cell(t, row, "weight")), strconv.Itoa(cmp.Or(weights[i], protocol.DefaultWeight)); got != want {
			t.Errorf("client %q: weight %q, want %s", name, got, want)
		}
		for _, col := range []string{"nacked", "timed-out", "redelivered", "dead-lettered"} {
			if got := text(cell(t, row, col)); got != "0" {
				t.Errorf("client %q: %s %q, want 0", name, col, got)
			}
		}
		if b := findAll(cell(t, row, "act"), func(n *html.Node) bool { return n.Data == "button" }); len(b) != 1 || text(b[0]) != "Drain" {
			t.Errorf("client %q: no drain button", name)
		}
	}
	if acked, total := number(t, text(cell(t, clientRows[0], "acked")))+number(t, text(cell(t, clientRows[1], "acked"))), int64(n); acked < total {
		t.Errorf("the clients' acks add up to %d, want at least %d", acked, total)
	}

	partRows := rows(t, doc, "partitions", "data-partition")
	if len(partRows) != partitions {
		t.Fatalf("%d partition rows, want %d", len(partRows), partitions)
	}
	for i, row := range partRows {
		p := st.Partitions[i]
		if got := text(cell(t, row, "partition")); got != strconv.Itoa(int(p.Partition)) {
			t.Errorf("row %d: partition %q, want %d", i, got, p.Partition)
		}
		if got := number(t, text(cell(t, row, "committed"))); got != *p.Committed {
			t.Errorf("partition %d: committed %d on the page, %d in /api/status", p.Partition, got, *p.Committed)
		}
		if got := number(t, text(cell(t, row, "high-watermark"))); got != p.HighWatermark {
			t.Errorf("partition %d: high watermark %d on the page, %d in /api/status", p.Partition, got, p.HighWatermark)
		}
		if got := text(cell(t, row, "lag")); got != "0" {
			t.Errorf("partition %d: lag %q, want 0", p.Partition, got)
		}
		if got := text(cell(t, row, "owner")); got != "console-node-a" {
			t.Errorf("partition %d: owner %q", p.Partition, got)
		}
		if got := text(cell(t, row, "state")); got != "–" {
			t.Errorf("partition %d: state %q, want –", p.Partition, got)
		}
	}

	charts := findAll(doc, func(n *html.Node) bool { return n.Data == "svg" && hasClass(n, "chart") })
	if len(charts) != 4 {
		t.Fatalf("%d charts, want 4", len(charts))
	}
	scale, _ := attr(charts[0], "data-top")
	for _, c := range charts {
		if top, _ := attr(c, "data-top"); top != scale || top == "" {
			t.Errorf("chart scales %q and %q: they share one", scale, top)
		}
		series, _ := attr(c, "data-series")
		pts, _ := attr(c, "data-points")
		line := findAll(c, func(n *html.Node) bool { return n.Data == "polyline" })
		if len(line) != 1 {
			t.Fatalf("chart %s: %d lines", series, len(line))
		}
		coords, _ := attr(line[0], "points")
		if np, _ := strconv.Atoi(pts); np < 2 || len(strings.Fields(coords)) != np {
			t.Errorf("chart %s: %s points, line %q", series, pts, coords)
		}
		if series == "acked" {
			if peak, _ := attr(c, "data-max"); peak == "" || peak == "0" {
				t.Errorf("acked chart: peak %q, want the acks of the flow", peak)
			}
		}
	}

	screenshot(t, page, filepath.Join(dir, "console-phone.png"), 390, 1800)
	t.Logf("screenshots in %s (kept with go test -artifacts)", dir)

	// At a phone's width nothing is wider than the viewport: the page in a
	// 390 px frame of a page on the same origin, which measures it.
	wide := consoleNarrow(t, base, opts.MetricsToken, 390)
	if wide != "" {
		t.Errorf("at 390 px: %s", wide)
	}
}

// consoleHarness is a page that shows the console in a frame width pixels
// wide and writes into #result what in it is wider than the frame.
const consoleHarness = `<!doctype html>
<html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe id="f" src="/#token=%s" style="width:%dpx;height:844px;border:0"></iframe>
<pre id="result">pending</pre>
<script>
function check() {
  const doc = document.getElementById('f').contentDocument;
  if (!doc || !doc.querySelector('#clients tr[data-client]') || !doc.querySelector('svg.chart polyline[points]')) {
    return setTimeout(check, 200);
  }
  const vw = doc.documentElement.clientWidth;
  const wide = [];
  for (const e of doc.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && (r.right > vw + 0.5 || r.left < -0.5)) {
      wide.push(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
    }
  }
  document.getElementById('result').textContent = JSON.stringify({
    viewport: vw, scrollWidth: doc.documentElement.scrollWidth, wide: wide,
  });
}
check();
</script>
</body></html>`

// renderOnConsoleOrigin renders page, a harness that works on the console
// in a frame, served by a proxy on the console's origin (base) so that it
// may reach into the frame, for budget of virtual time, and returns its DOM.
func renderOnConsoleOrigin(t *testing.T, base, page string, budget time.Duration) *html.Node {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /harness.html", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, page)
	})
	mux.Handle("/", httputil.NewSingleHostReverseProxy(target))
	proxy := httptest.NewServer(mux)
	defer proxy.Close()
	return renderDOM(t, proxy.URL+"/harness.html", budget)
}

// consoleNarrow loads the console in a frame width pixels wide (Chromium's
// headless window is at least 500 px wide) through a proxy that serves the
// measuring page on the console's origin, and returns what overflows, or "".
func consoleNarrow(t *testing.T, base, token string, width int) string {
	t.Helper()
	doc := renderOnConsoleOrigin(t, base, fmt.Sprintf(consoleHarness, url.QueryEscape(token), width), 10*time.Second)
	var got struct {
		Viewport    int      `json:"viewport"`
		ScrollWidth int      `json:"scrollWidth"`
		Wide        []string `json:"wide"`
	}
	res := text(byID(t, doc, "result"))
	if err := json.Unmarshal([]byte(res), &got); err != nil {
		t.Fatalf("the measuring page says %q: the console did not render in the frame", res)
	}
	if got.Viewport != width {
		t.Fatalf("the frame's viewport is %d px, want %d", got.Viewport, width)
	}
	t.Logf("at %d px: document %d px wide, %d elements wider", width, got.ScrollWidth, len(got.Wide))
	if got.ScrollWidth > width || len(got.Wide) > 0 {
		return fmt.Sprintf("the document is %d px wide; elements past the edge: %v", got.ScrollWidth, got.Wide)
	}
	return ""
}

// TestConsoleFollower: a follower's console shows the cluster as its
// election knows it (the leader, both members) and says where the
// partitions and clients are served, showing none of its own.
func TestConsoleFollower(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "console")
	createTopic(t, topic, 2)
	leaderOpts := daemonOptions(t, topic)
	leaderOpts.NodeID = "console-node-b" // the highest live node id leads
	leader := startDaemon(t, leaderOpts)

	opts := leaderOpts
	opts.NodeID = "console-node-a"
	opts.Listen = "127.0.0.1:0"
	opts.MetricsListen = "127.0.0.1:0"
	d, err := fanout.New(opts)
	if err != nil {
		t.Fatalf("fanout.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("follower did not stop within 60s")
		}
	})
	select {
	case <-d.Listening():
	case err := <-done:
		t.Fatalf("follower stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("follower not listening within 30s")
	}
	base := "http://" + d.MetricsAddr().String()

	// The fast election of the tests (leader timeout 1 s) may move on a
	// loaded machine: wait for a document, then a page, of the settled state.
	var st *status.Status
	testutil.WaitFor(t, 60*time.Second, "the follower knows the leader and both members, ready", func() bool {
		st = consoleStatus(t, base, "")
		nd := st.Node
		return st.Leader != nil && st.Leader.Node == "console-node-b" && len(st.Members) == 2 &&
			nd.Role == "follower" && !nd.Serving && nd.Ready
	})
	if nd := st.Node; nd.NodeID != "console-node-a" {
		t.Errorf("node %+v, want console-node-a", nd)
	}
	if st.Leader.Addr != leader.addr || len(st.Partitions) != 0 || len(st.Clients) != 0 {
		t.Errorf("leader %+v (want address %s), %d partitions, %d clients", st.Leader, leader.addr, len(st.Partitions), len(st.Clients))
	}

	testutil.WaitFor(t, 90*time.Second, "the follower's page: its role, the leader named with its address, both members, no partition", func() bool {
		doc := renderDOM(t, base+"/", 5*time.Second)
		var problems []string
		if got := text(byID(t, doc, "node-role")); got != "follower" {
			problems = append(problems, fmt.Sprintf("role badge %q, want follower", got))
		}
		if got := text(byID(t, doc, "leader")); got != "console-node-b" {
			problems = append(problems, fmt.Sprintf("leader %q, want console-node-b", got))
		}
		note := byID(t, doc, "follower-note")
		if hidden(note) || !strings.Contains(text(note), "console-node-b") || !strings.Contains(text(note), leader.addr) {
			problems = append(problems, fmt.Sprintf("follower note %q (hidden %v), want it to name the leader and its address", text(note), hidden(note)))
		}
		if n := len(rows(t, doc, "members", "data-node")); n != 2 {
			problems = append(problems, fmt.Sprintf("%d member rows, want 2", n))
		}
		if n := len(rows(t, doc, "partitions", "data-partition")); n != 0 {
			problems = append(problems, fmt.Sprintf("%d partition rows on a follower", n))
		}
		if len(problems) > 0 {
			t.Logf("the follower's page: %s", strings.Join(problems, "; "))
		}
		return len(problems) == 0
	})
}

// TestConsoleShowsWeightWhenPresent: the weight column is shown only when
// the document gives weights (the daemon gives them while it shares by
// weight, TestDaemonStatusWeightsAndObservers); the page is served with
// documents that have them and that do not.
func TestConsoleShowsWeightWhenPresent(t *testing.T) {
	t.Parallel()
	weight := uint32(5)
	at := time.Now()
	doc := func(withWeight bool) *status.Status {
		st := &status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
			Node: &status.Node{NodeID: "n", Role: "leader", Ready: true, Serving: true, Clients: 2, Time: at},
			Clients: []status.Client{
				{ID: 1, Name: "stable", Addr: "127.0.0.1:1", Role: status.ClientRoleWorker, ConnectedAt: at},
				{ID: 2, Name: "canary", Addr: "127.0.0.1:2", Role: status.ClientRoleWorker, ConnectedAt: at},
			},
			Rates: &status.Rates{IntervalSeconds: 2},
		}
		if withWeight {
			st.Clients[1].Weight = &weight
		}
		return st
	}
	for _, withWeight := range []bool{true, false} {
		srv := httptest.NewServer(console.Handler(console.Config{
			Status: func(context.Context) *status.Status { return doc(withWeight) },
		}))
		page := renderDOM(t, srv.URL+"/", 3*time.Second)
		srv.Close()
		table := byID(t, page, "clients")
		clientRows := rows(t, page, "clients", "data-client")
		if len(clientRows) != 2 {
			t.Fatalf("%d client rows, want 2", len(clientRows))
		}
		if hasClass(table, "no-weight") == withWeight {
			t.Errorf("weights in the document %v: the table's classes are %q", withWeight, attrOf(table, "class"))
		}
		if withWeight {
			if got := text(cell(t, clientRows[1], "weight")); got != "5" { // the page keeps the document's order
				t.Errorf("canary's weight %q, want 5", got)
			}
			if got := text(cell(t, clientRows[0], "weight")); got != "–" {
				t.Errorf("a client without a weight shows %q", got)
			}
		}
	}
}

func attrOf(n *html.Node, key string) string { v, _ := attr(n, key); return v }

// TestConsoleSpread: two daemons in spread mode against the real Kafka and
// ZooKeeper, one Go client acking what both deliver. Each member's
// /api/status and its page in Chromium show the mode, the assignment (each
// member with its partitions, all owned, and their lag), no handoff, and
// every partition with its offsets and the member that owns it; a member's
// page lists the client's session with it, and fits a phone's width.
func TestConsoleSpread(t *testing.T) {
	t.Parallel()
	const partitions, n = 4, 200
	topic := shortName(t, "orders")
	createTopic(t, topic, partitions)
	opts := daemonOptions(t, topic)
	opts.ID = shortName(t, "billing")
	opts.Assignment = fanout.AssignmentSpread
	opts.ZooKeeperSessionTimeout = 4 * time.Second
	opts.HandoffTimeout = 3 * time.Second
	opts.MetricsListen = "127.0.0.1:0"
	var members []*testDaemon
	for _, id := range []string{"console-spread-a", "console-spread-b"} {
		o := opts
		o.NodeID = id
		members = append(members, startDaemon(t, o))
	}

	var acked atomic.Int64
	consoleAck(t, dial(t, client.Config{ClientID: "console-spread-worker", MaxInFlight: 20},
		members[0].addr, members[1].addr), &acked)
	produceSeq(t, topic, "spread", n, partitions)

	// Each member's document: the assignment in force, owned as assigned,
	// every message committed.
	docs := make([]*status.Status, len(members))
	for i, m := range members {
		base := "http://" + m.MetricsAddr().String()
		testutil.WaitFor(t, 90*time.Second, m.opts.NodeID+"'s document: both members own what they are assigned, all committed", func() bool {
			st := consoleStatus(t, base, "")
			docs[i] = st
			if st.Mode != "spread" || st.Assignment == nil || len(st.Assignment.Members) != 2 || len(st.Handoffs) != 0 ||
				len(st.Partitions) != partitions || acked.Load() < n {
				return false
			}
			for _, am := range st.Assignment.Members {
				if len(am.Partitions) != partitions/2 || !slices.Equal(am.Owned, am.Partitions) || am.Lag != 0 {
					return false
				}
			}
			for _, p := range st.Partitions {
				if p.Committed == nil || *p.Committed != n/partitions || p.Owner == "" {
					return false
				}
			}
			return len(st.Clients) == 1
		})
	}
	a := docs[0]
	owner := map[int32]string{}
	for _, am := range a.Assignment.Members {
		for _, p := range am.Partitions {
			owner[p] = am.NodeID
		}
	}
	for _, p := range a.Partitions {
		if p.Owner != owner[p.Partition] {
			t.Errorf("partition %d: owner %q, assigned to %q", p.Partition, p.Owner, owner[p.Partition])
		}
	}
	if nd := a.Node; nd.Mode != "spread" || !nd.Serving || !nd.Ready || nd.Partial != "" {
		t.Errorf("node %+v, want a ready spread member serving, with the whole topic", nd)
	}
	for _, m := range a.Members {
		if m.Mode != "spread" {
			t.Errorf("member %s: mode %q", m.NodeID, m.Mode)
		}
	}

	// The page of the first member.
	page := "http://" + members[0].MetricsAddr().String() + "/"
	doc := renderDOM(t, page, 8*time.Second)
	if got := text(byID(t, doc, "mode")); got != "spread" {
		t.Errorf("mode %q on the page", got)
	}
	if hidden(byID(t, doc, "spread")) {
		t.Fatal("the assignment is hidden in spread mode")
	}
	if got, want := text(byID(t, doc, "assignment-generation")), fmt.Sprintf("generation %d, epoch %d", a.Assignment.Generation, a.Assignment.Epoch); got != want {
		t.Errorf("assignment caption %q, want %q", got, want)
	}
	assigned := rows(t, doc, "assignment", "data-member")
	if len(assigned) != 2 {
		t.Fatalf("%d assignment rows, want 2", len(assigned))
	}
	for i, row := range assigned {
		am := a.Assignment.Members[i]
		want := fmt.Sprintf("%d-%d", am.Partitions[0], am.Partitions[1])
		if am.Partitions[1] != am.Partitions[0]+1 {
			want = fmt.Sprintf("%d, %d", am.Partitions[0], am.Partitions[1])
		}
		if got := text(cell(t, row, "node")); got != am.NodeID {
			t.Errorf("assignment row %d: member %q, want %q", i, got, am.NodeID)
		}
		if got := text(cell(t, row, "partitions")); got != want {
			t.Errorf("%s: partitions %q, want %q", am.NodeID, got, want)
		}
		if got := text(cell(t, row, "owned")); got != want {
			t.Errorf("%s: owned %q, want %q", am.NodeID, got, want)
		}
		if got := text(cell(t, row, "lag")); got != "0" {
			t.Errorf("%s: lag %q", am.NodeID, got)
		}
	}
	if rs := rows(t, doc, "handoffs", "data-handoff"); len(rs) != 0 {
		t.Errorf("%d handoff rows, want none", len(rs))
	}
	partRows := rows(t, doc, "partitions", "data-partition")
	if len(partRows) != partitions {
		t.Fatalf("%d partition rows, want %d", len(partRows), partitions)
	}
	for i, row := range partRows {
		p := a.Partitions[i]
		if got := text(cell(t, row, "owner")); got != owner[p.Partition] {
			t.Errorf("partition %d: owner %q on the page, assigned to %q", p.Partition, got, owner[p.Partition])
		}
		if got := number(t, text(cell(t, row, "committed"))); got != n/partitions {
			t.Errorf("partition %d: committed %d on the page", p.Partition, got)
		}
	}
	for _, row := range rows(t, doc, "members", "data-node") {
		if got := text(cell(t, row, "mode")); got != "spread" {
			t.Errorf("member %s: mode %q on the page", text(cell(t, row, "node")), got)
		}
	}
	clientRows := rows(t, doc, "clients", "data-client")
	if len(clientRows) != 1 || text(cell(t, clientRows[0], "name")) != "console-spread-worker" {
		t.Errorf("%d client rows, want the worker's session with this member", len(clientRows))
	}
	if note := byID(t, doc, "follower-note"); !hidden(note) {
		t.Errorf("a serving spread member shows the note %q", text(note))
	}
	// Its daemon has no metrics token: the page says it takes no action and
	// offers none, and an action is refused.
	if note := byID(t, doc, "actions-note"); hidden(note) || !strings.Contains(text(note), "--metrics-token-file") ||
		!hidden(byID(t, doc, "pause-button")) || !hidden(byID(t, doc, "resume-button")) || !hasClass(byID(t, doc, "clients"), "no-actions") {
		t.Errorf("a daemon without a token: the note %q (hidden %v), buttons offered", text(note), hidden(note))
	}
	resp, err := http.Post("http://"+members[0].MetricsAddr().String()+"/api/pause", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /api/pause on a daemon without a token: %d, want 403", resp.StatusCode)
	}
	screenshot(t, page, filepath.Join(t.ArtifactDir(), "console-spread.png"), 1280, 1120)
	if wide := consoleNarrow(t, "http://"+members[0].MetricsAddr().String(), "", 390); wide != "" {
		t.Errorf("at 390 px: %s", wide)
	}
}

// TestConsoleRendersHandoffs: a spread member's page during a handoff, from
// a served document: the handoffs listed with where each partition stands,
// a member that does not yet own all it is assigned marked behind, and the
// note when the member could read only its own partitions.
func TestConsoleRendersHandoffs(t *testing.T) {
	t.Parallel()
	at := time.Now()
	st := &status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t", Mode: "spread",
		Leader: &status.Leader{Node: "m-b", Addr: "127.0.0.1:2", Epoch: 3},
		Node: &status.Node{NodeID: "m-a", Mode: "spread", Role: "follower", Serving: true, Time: at,
			Partial: "the partitions' offsets and owners: zk: connection closed"},
		Rates: &status.Rates{IntervalSeconds: 2},
	}
	st.AddPartition(0, 10, nil, "m-a")
	st.Assignment = &status.Assignment{Epoch: 3, Generation: 7, Members: []status.AssignedMember{
		{NodeID: "m-a", Addr: "127.0.0.1:1", Partitions: []int32{0, 1, 2, 5}, Owned: []int32{0}, Lag: 12},
		{NodeID: "m-b", Addr: "127.0.0.1:2", Partitions: []int32{3, 4}, Owned: []int32{3, 4}},
	}}
	st.Handoffs = []status.Handoff{
		{Partition: 1, From: "m-b", To: "m-a", State: "held by m-b: handing over"},
		{Partition: 2, To: "m-a", State: "released: waiting for m-a"},
	}
	srv := httptest.NewServer(console.Handler(console.Config{Status: func(context.Context) *status.Status { return st }}))
	defer srv.Close()
	doc := renderDOM(t, srv.URL+"/", 3*time.Second)

	if got := text(byID(t, doc, "assignment-generation")); got != "generation 7, epoch 3" {
		t.Errorf("assignment caption %q", got)
	}
	assigned := rows(t, doc, "assignment", "data-member")
	if len(assigned) != 2 {
		t.Fatalf("%d assignment rows, want 2", len(assigned))
	}
	if got := text(cell(t, assigned[0], "partitions")); got != "0-2, 5" {
		t.Errorf("m-a's partitions %q, want 0-2, 5", got)
	}
	if owned := cell(t, assigned[0], "owned"); text(owned) != "0" || !hasClass(owned, "behind") {
		t.Errorf("m-a's owned %q (class %q), want 0 marked behind", text(owned), attrOf(owned, "class"))
	}
	if owned := cell(t, assigned[1], "owned"); text(owned) != "3-4" || hasClass(owned, "behind") {
		t.Errorf("m-b's owned %q (class %q), want 3-4, not behind", text(owned), attrOf(owned, "class"))
	}
	if !hasClass(assigned[1], "leader") {
		t.Error("the leader's row of the assignment is not marked")
	}
	handoffs := rows(t, doc, "handoffs", "data-handoff")
	if len(handoffs) != 2 {
		t.Fatalf("%d handoff rows, want 2", len(handoffs))
	}
	for i, want := range [][3]string{{"m-b", "m-a", "held by m-b: handing over"}, {"–", "m-a", "released: waiting for m-a"}} {
		got := [3]string{text(cell(t, handoffs[i], "from")), text(cell(t, handoffs[i], "to")), text(cell(t, handoffs[i], "state"))}
		if got != want {
			t.Errorf("handoff %d: %q, want %q", i, got, want)
		}
	}
	if note := byID(t, doc, "follower-note"); hidden(note) || !strings.Contains(text(note), "zk: connection closed") {
		t.Errorf("note %q (hidden %v), want why only this member's partitions are shown", text(note), hidden(note))
	}
}

// TestConsoleShowsWhyNotReady: a node that is not ready says so in red with
// the reason, above everything else; each member's row shows its offset
// store and its readiness (no and why in red; – for a member whose
// heartbeats do not say). A ready node shows no such line.
func TestConsoleShowsWhyNotReady(t *testing.T) {
	t.Parallel()
	at := time.Now()
	yes, no := true, false
	const reason = "leader: no partition of topic t consumed: 0 of 2 open (the log says why)"
	doc := func(ready bool) *status.Status {
		st := &status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t", Mode: "leader", OffsetStore: "kafka",
			Leader: &status.Leader{Node: "b", Addr: "127.0.0.1:2", Epoch: 3},
			Node:   &status.Node{NodeID: "b", Mode: "leader", Role: "leader", Ready: ready, Reason: "leader: serving", Serving: true, Time: at},
			Members: []status.Member{
				{NodeID: "a", Addr: "127.0.0.1:1", Role: "follower", Epoch: 3, LastSeen: at, Mode: "leader", OffsetStore: "kafka",
					Ready: &yes, Reason: "follower: leader b (epoch 3)"},
				{NodeID: "b", Addr: "127.0.0.1:2", Role: "leader", Epoch: 3, LastSeen: at, Mode: "leader", OffsetStore: "kafka",
					Ready: &ready, Reason: "leader: serving"},
				{NodeID: "c", Addr: "127.0.0.1:3", Role: "follower", Epoch: 3, LastSeen: at, Mode: "leader"},
			},
			Rates: &status.Rates{IntervalSeconds: 2},
		}
		if !ready {
			st.Node.Reason, st.Members[1].Reason, st.Members[1].Ready = reason, reason, &no
		}
		return st
	}
	for _, ready := range []bool{false, true} {
		srv := httptest.NewServer(console.Handler(console.Config{Status: func(context.Context) *status.Status { return doc(ready) }}))
		page := renderDOM(t, srv.URL+"/", 3*time.Second)
		srv.Close()
		banner := byID(t, page, "not-ready")
		if ready {
			if !hidden(banner) {
				t.Errorf("a ready node shows %q", text(banner))
			}
			continue
		}
		if hidden(banner) || text(banner) != "Not ready: "+reason+"." || !hasClass(banner, "error") {
			t.Errorf("not ready: the line %q (hidden %v, class %q), want it in red with the reason", text(banner), hidden(banner), attrOf(banner, "class"))
		}
		if r := byID(t, page, "ready"); text(r) != "no" || !hasClass(r, "bad") {
			t.Errorf("Ready %q (class %q), want no in red", text(r), attrOf(r, "class"))
		}
		members := rows(t, page, "members", "data-node")
		if len(members) != 3 {
			t.Fatalf("%d member rows, want 3", len(members))
		}
		for i, want := range [][3]string{{"kafka", "yes", "ok"}, {"kafka", "no: " + reason, "bad"}, {"–", "–", ""}} {
			store, r := cell(t, members[i], "store"), cell(t, members[i], "ready")
			if text(store) != want[0] || text(r) != want[1] || want[2] != "" && !hasClass(r, want[2]) {
				t.Errorf("member %d: store %q, ready %q (class %q); want %q", i, text(store), text(r), attrOf(r, "class"), want)
			}
		}
	}
}

// TestConsoleTitleSaysEachThingOnce: the title is the topic; the service and
// the node follow when they say something the title has not said.
func TestConsoleTitleSaysEachThingOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id, topic, node string
		sub, tab        string
	}{
		{"billing", "orders", "node-a", "service billing · node node-a", "orders · node-a — fanout console"},
		{"jobs", "jobs", "node-a", "node node-a", "jobs · node-a — fanout console"},
		{"svc", "jobs", "svc", "service svc", "jobs · svc — fanout console"},
		{"jobs", "jobs", "jobs", "", "jobs — fanout console"},
	} {
		st := &status.Status{ID: tc.id, Topic: tc.topic, HeartbeatTopic: "fanout_" + tc.id + "_" + tc.topic,
			Node: &status.Node{NodeID: tc.node, Role: "leader", Ready: true, Serving: true, Time: time.Now()}, Rates: &status.Rates{IntervalSeconds: 2}}
		srv := httptest.NewServer(console.Handler(console.Config{Status: func(context.Context) *status.Status { return st }}))
		doc := renderDOM(t, srv.URL+"/", 3*time.Second)
		srv.Close()
		title := findAll(doc, func(n *html.Node) bool { return n.Data == "title" })
		if got, sub := text(byID(t, doc, "title")), text(byID(t, doc, "subtitle")); got != tc.topic || sub != tc.sub || len(title) != 1 || text(title[0]) != tc.tab {
			t.Errorf("%+v: title %q, subtitle %q, tab %q", tc, got, sub, text(title[0]))
		}
	}
}

// TestConsoleShowsEveryWarningAndCount renders, in Chromium, a document
// with every kind of warning and trouble the console shows: each advisory
// is a line of the warnings banner (a pause is said by the actions, the
// reasons the node is unready by the not-ready line); each partition's
// state says held, stalled and its dead letters pending; each client's
// outcomes are its own.
func TestConsoleShowsEveryWarningAndCount(t *testing.T) {
	t.Parallel()
	at := time.Now()
	const unready = "leader: topic t not found in Kafka"
	committed, lag := int64(7), int64(5)
	advisories := []status.Warning{
		{Kind: "commits-failing", Message: "offset commits failing for 2s (3 failures so far)"},
		{Kind: "dead-letters-failing", Message: "producing to dead-letter topic t.dlq failing for 1s (1 messages waiting)"},
		{Kind: "partitions-held", Message: "partitions 0 held: more than --max-outstanding offsets behind an unacked message"},
		{Kind: "partitions-stalled", Message: "partitions 1 stalled: committed offset unchanged for 5m0s"},
		{Kind: "no-clients", Message: "no clients connected while messages wait (lag 5, 0 fetched)"},
	}
	st := &status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t", Mode: "leader",
		Node: &status.Node{NodeID: "a", Mode: "leader", Role: "leader", Ready: false, Reason: unready, Serving: true, Time: at,
			Warnings: append([]status.Warning{{Kind: "topic-missing", Message: "topic t not found in Kafka", Unready: true},
				{Kind: "delivery-paused", Message: "deliveries paused by ops"}}, advisories...)},
		Partitions: []status.Partition{
			{Partition: 0, Committed: &committed, HighWatermark: 12, Lag: &lag, Owner: "a", Held: true, DeadLettersPending: 2},
			{Partition: 1, Committed: &committed, HighWatermark: 7, Lag: new(int64), Owner: "a", Stalled: true},
			{Partition: 2, Committed: &committed, HighWatermark: 7, Lag: new(int64), Owner: "a"},
		},
		Clients: []status.Client{{ID: 1, Name: "w1", Addr: "127.0.0.1:5", Role: "worker", InFlight: 1, MaxInFlight: 10,
			Acked: 1001, Nacked: 4, TimedOut: 3, Redelivered: 7, DeadLettered: 2, ConnectedAt: at}},
		Rates: &status.Rates{IntervalSeconds: 2},
	}
	srv := httptest.NewServer(console.Handler(console.Config{Status: func(context.Context) *status.Status { return st }}))
	doc := renderDOM(t, srv.URL+"/", 3*time.Second)
	srv.Close()

	if got := text(byID(t, doc, "not-ready")); got != "Not ready: "+unready+"." {
		t.Errorf("not-ready line %q", got)
	}
	list := byID(t, doc, "warnings")
	items := findAll(list, func(n *html.Node) bool { return n.Data == "li" })
	if hidden(list) || len(items) != len(advisories) {
		t.Fatalf("the banner (hidden %v) has %d lines, want the %d advisories", hidden(list), len(items), len(advisories))
	}
	for i, w := range advisories {
		if k, _ := attr(items[i], "data-warning"); k != w.Kind || text(items[i]) != w.Message+"." {
			t.Errorf("banner line %d: %s %q, want %s %q", i, k, text(items[i]), w.Kind, w.Message+".")
		}
	}
	parts := rows(t, doc, "partitions", "data-partition")
	if len(parts) != 3 {
		t.Fatalf("%d partition rows, want 3", len(parts))
	}
	for i, want := range []string{"held, 2 dead letters pending", "stalled", "–"} {
		if got := text(cell(t, parts[i], "state")); got != want {
			t.Errorf("partition %d: state %q, want %q", i, got, want)
		}
	}
	clients := rows(t, doc, "clients", "data-client")
	if len(clients) != 1 {
		t.Fatalf("%d client rows, want 1", len(clients))
	}
	for col, want := range map[string]string{"acked": "1,001", "nacked": "4", "timed-out": "3", "redelivered": "7", "dead-lettered": "2"} {
		if got := text(cell(t, clients[0], col)); got != want {
			t.Errorf("client %s %q, want %q", col, got, want)
		}
	}
}
