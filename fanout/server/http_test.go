package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestHTTPRequestOnClientPort: a browser or curl on the client port gets a
// short HTTP 400 that names the console's port, and the daemon logs one
// line saying what happened, not a frame error.
func TestHTTPRequestOnClientPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		console func() string
		body    string
	}{
		{"with a console", func() string { return "[::]:9100" }, "For /metrics, /healthz, /readyz and the web console, they are on port 9100 (--metrics-listen).\n"},
		{"without one", nil, "For /metrics, /healthz, /readyz and the web console, this daemon serves them nowhere (--metrics-listen is empty).\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, func(c *Config) { c.ConsoleAddr = tc.console })
			hc := &http.Client{Timeout: testTimeout}
			resp, err := hc.Get("http://" + s.Addr().String() + "/")
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read the answer: %v", err)
			}
			want := "This is a fanout client port: it speaks fanout's own protocol, not HTTP.\n" + tc.body
			if resp.StatusCode != http.StatusBadRequest || string(body) != want {
				t.Fatalf("answer %d %q, want 400 %q", resp.StatusCode, body, want)
			}
			// The close is logged before the answer is written.
			var lines []string
			for _, e := range s.logs.AllEntries() {
				if e.Level <= logrus.InfoLevel && e.Message != "listening for clients" {
					lines = append(lines, fmt.Sprintf("%s %v", e.Message, e.Data["error"]))
				}
			}
			if len(lines) != 1 || !strings.Contains(lines[0], "an HTTP request (GET), not a fanout client") ||
				strings.Contains(lines[0], "frame") {
				t.Fatalf("logged %q, want one line about an HTTP request", lines)
			}
		})
	}
}
