package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

func TestHandlerMetricsToken(t *testing.T) {
	const token = "metrics-t0ken-never-logged"
	h := Handler(HandlerConfig{
		Collector: NewCollector(func(context.Context) Snapshot { return leaderSnapshot() }),
		Snapshot:  func(context.Context) Snapshot { return leaderSnapshot() },
		Token:     token,
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path, auth string) (int, string, http.Header) {
		t.Helper()
		return testutil.HTTPGet(t, srv.URL+path, auth)
	}
	tests := []struct {
		name, path, auth string
		wantCode         int
		contains         string
	}{
		{"metrics without a token", "/metrics", "", 401, "bearer token"},
		{"metrics with a wrong token", "/metrics", "Bearer nope", 401, ""},
		{"metrics with the token as basic auth", "/metrics", "Basic " + token, 401, ""},
		{"metrics with a token that only starts like it", "/metrics", "Bearer " + token[:10], 401, ""},
		{"metrics with the token", "/metrics", "Bearer " + token, 200, "fanout_messages_acked_total 7\n"},
		{"scheme in lower case", "/metrics", "bearer " + token, 200, "fanout_messages_acked_total 7\n"},
		{"healthz stays open", "/healthz", "", 200, "ok\n"},
		{"readyz stays open", "/readyz", "", 200, "leader: serving\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, hdr := get(tt.path, tt.auth)
			if code != tt.wantCode || !strings.Contains(body, tt.contains) {
				t.Fatalf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.wantCode, tt.contains)
			}
			if code == 401 {
				if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("401 without a Bearer challenge: %q", hdr.Get("WWW-Authenticate"))
				}
				if strings.Contains(body, token) {
					t.Errorf("401 body shows the token: %q", body)
				}
			}
		})
	}
}
