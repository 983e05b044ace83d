package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("follower: no leader known\n"))
			return
		}
		_, _ = w.Write([]byte("leader: serving\n"))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	for _, tc := range []struct {
		name  string
		ready bool
		args  []string
		env   string
		code  int
		out   string // in stdout or stderr
	}{
		{"ready, port only", true, []string{"--metrics-listen", ":" + port}, "", 0, "leader: serving"},
		{"ready, unspecified host", true, []string{"--metrics-listen", "0.0.0.0:" + port}, "", 0, "leader: serving"},
		{"ready, from the daemon's variable", true, nil, ":" + port, 0, "leader: serving"},
		{"not ready", false, []string{"--metrics-listen", ":" + port}, "", 1, "not ready (503 Service Unavailable): follower: no leader known"},
		{"nobody listens", true, []string{"--metrics-listen", "127.0.0.1:1"}, "", 1, "not ready:"},
		{"metrics disabled", true, []string{"--metrics-listen", ""}, "", 2, "--metrics-listen is empty"},
		{"bad address", true, []string{"--metrics-listen", "nonsense"}, "", 2, "--metrics-listen \"nonsense\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready = tc.ready
			t.Setenv("FANOUT_METRICS_LISTEN", tc.env)
			var stdout, stderr strings.Builder
			code := run(context.Background(), append([]string{"fanout", "healthcheck"}, tc.args...), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; stdout %q, stderr %q", code, tc.code, stdout.String(), stderr.String())
			}
			if got := stdout.String() + stderr.String(); !strings.Contains(got, tc.out) {
				t.Fatalf("output %q does not contain %q", got, tc.out)
			}
		})
	}
}
