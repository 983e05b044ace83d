package console

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// testStatus is a serving leader with one client whose name is markup.
func testStatus() *status.Status {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	st := &status.Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
		Leader:  &status.Leader{Node: "node-a", Addr: "h:1", Epoch: 3},
		Members: []status.Member{{NodeID: "node-a", Addr: "h:1", Role: "leader", Epoch: 3, LastSeen: at}},
		Node:    &status.Node{NodeID: "node-a", Role: "leader", Ready: true, Serving: true, Clients: 1, Time: at},
		Clients: []status.Client{{ID: 4, Name: "<script>x</script>", Addr: "127.0.0.1:5000", Role: status.ClientRoleWorker,
			InFlight: 1, MaxInFlight: 8, Acked: 12, AcksPerSecond: 2.5, ConnectedAt: at}},
		Rates: &status.Rates{IntervalSeconds: 2, Points: []status.RatePoint{{Time: at, Acked: 2.5}}},
	}
	st.AddPartition(0, 20, ptr(12), "node-a")
	return st
}

func ptr(v int64) *int64 { return &v }

// get returns the status, body and header of GET path on h, with auth as the
// Authorization header when not empty.
func get(t *testing.T, h http.Handler, path, auth string) (int, string, http.Header) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	return testutil.HTTPGet(t, srv.URL+path, auth)
}

// /api/status is the document as status.Encode writes it, made for each
// request with a deadline.
func TestStatusEndpoint(t *testing.T) {
	calls := 0
	h := Handler(Config{Status: func(ctx context.Context) *status.Status {
		calls++
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > StatusTimeout {
			t.Errorf("Status called without a deadline of at most %v", StatusTimeout)
		}
		return testStatus()
	}})
	code, body, hdr := get(t, h, "/api/status", "")
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" || hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET /api/status = %d, %q, %q", code, hdr.Get("Content-Type"), hdr.Get("Cache-Control"))
	}
	var want strings.Builder
	if err := status.Encode(&want, testStatus()); err != nil {
		t.Fatal(err)
	}
	if body != want.String() {
		t.Errorf("body:\n%s\nwant:\n%s", body, want.String())
	}
	var back status.Status
	if err := json.Unmarshal([]byte(body), &back); err != nil || back.Clients[0].Name != "<script>x</script>" {
		t.Errorf("decoded %+v, %v", back.Clients, err)
	}
	get(t, h, "/api/status", "")
	if calls != 2 {
		t.Errorf("Status called %d times for 2 requests", calls)
	}
}

// The page and its assets, with headers that keep anything but them out.
func TestPageAndAssets(t *testing.T) {
	h := Handler(Config{Status: func(context.Context) *status.Status { return testStatus() }})
	tests := []struct {
		path, contentType, contains string
	}{
		{"/", "text/html; charset=utf-8", `<script src="assets/console.js" defer></script>`},
		{"/assets/console.js", "text/javascript; charset=utf-8", "api/status"},
		{"/assets/console.css", "text/css; charset=utf-8", "@media (max-width: 640px)"},
		{"/assets/icon.svg", "image/svg+xml", "<svg"},
	}
	for _, tt := range tests {
		code, body, hdr := get(t, h, tt.path, "")
		if code != 200 || hdr.Get("Content-Type") != tt.contentType || !strings.Contains(body, tt.contains) {
			t.Errorf("GET %s = %d %q, want 200 %q containing %q", tt.path, code, hdr.Get("Content-Type"), tt.contentType, tt.contains)
		}
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tt.path, csp)
		}
		if hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s without nosniff", tt.path)
		}
	}
	for _, path := range []string{"/nope", "/assets/", "/assets/nope.js", "/api/nope"} {
		if code, _, _ := get(t, h, path, ""); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, code)
		}
	}
}

// No CDN: the embedded files name no other origin (the SVG namespace is a
// name, not a load), and the page loads only its own assets.
func TestAssetsAreSelfContained(t *testing.T) {
	url := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(assets, path)
		if err != nil {
			return err
		}
		for _, m := range url.FindAllString(string(b), -1) {
			if m != "http://www.w3.org" {
				t.Errorf("%s names another origin: %s", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := fs.ReadFile(assets, "assets/index.html")
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(string(page), -1) {
		if !strings.HasPrefix(m[1], "assets/") {
			t.Errorf("index.html loads %q, not one of its assets", m[1])
		}
	}
}

// On the metrics listener: the document needs the metrics token like
// /metrics; the page, which holds no data, does not.
func TestStatusNeedsTheMetricsToken(t *testing.T) {
	const token = "console-t0ken"
	snap := func(context.Context) metrics.Snapshot { return metrics.Snapshot{} }
	h := metrics.Handler(metrics.HandlerConfig{
		Collector: metrics.NewCollector(snap), Snapshot: snap, Token: token,
		Console: Handler(Config{Status: func(context.Context) *status.Status { return testStatus() }}),
	})
	tests := []struct {
		path, auth string
		want       int
	}{
		{"/api/status", "", 401},
		{"/api/status", "Bearer wrong", 401},
		{"/api/status", "Bearer " + token, 200},
		{"/", "", 200},
		{"/assets/console.js", "", 200},
		{"/metrics", "", 401},
		{"/healthz", "", 200},
	}
	for _, tt := range tests {
		code, body, _ := get(t, h, tt.path, tt.auth)
		if code != tt.want {
			t.Errorf("GET %s (%q) = %d, want %d", tt.path, tt.auth, code, tt.want)
		}
		if code == 401 && (strings.Contains(body, "127.0.0.1:5000") || strings.Contains(body, token)) {
			t.Errorf("GET %s: 401 body shows data: %q", tt.path, body)
		}
		if code == 200 && tt.path == "/api/status" && !strings.Contains(body, `"addr": "127.0.0.1:5000"`) {
			t.Errorf("GET %s with the token: %q", tt.path, body)
		}
	}
	// Without a token everything is open, as /metrics is.
	open := metrics.Handler(metrics.HandlerConfig{
		Collector: metrics.NewCollector(snap), Snapshot: snap,
		Console: Handler(Config{Status: func(context.Context) *status.Status { return testStatus() }}),
	})
	if code, _, _ := get(t, open, "/api/status", ""); code != 200 {
		t.Errorf("GET /api/status without a configured token = %d, want 200", code)
	}
}
