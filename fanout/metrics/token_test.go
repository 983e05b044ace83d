package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// post is POST path on srv with auth as the Authorization header when not
// empty; it returns the status and the body.
func post(t *testing.T, srv *httptest.Server, path, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"by":"ops"}`))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Actions take the metrics token; without a token configured every action
// is refused, and reading stays as it was.
func TestHandlerActionsNeedTheToken(t *testing.T) {
	const token = "metrics-t0ken-never-logged"
	var acted atomic.Int32
	actions := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		acted.Add(1)
		_, _ = io.WriteString(w, "done")
	})
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "page") })
	for _, tc := range []struct {
		name, token, auth string
		code              int
		contains          string
	}{
		{"no token configured", "", "", http.StatusForbidden, "--metrics-token-file"},
		{"no token configured, one presented", "", "Bearer anything", http.StatusForbidden, "this daemon has none"},
		{"without the token", token, "", http.StatusUnauthorized, "bearer token"},
		{"with a wrong token", token, "Bearer nope", http.StatusUnauthorized, ""},
		{"with the token", token, "Bearer " + token, http.StatusOK, "done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := acted.Load()
			srv := httptest.NewServer(Handler(HandlerConfig{
				Collector: NewCollector(func(context.Context) Snapshot { return leaderSnapshot() }),
				Snapshot:  func(context.Context) Snapshot { return leaderSnapshot() },
				Token:     tc.token, Console: page, Actions: actions,
			}))
			defer srv.Close()
			code, body := post(t, srv, "/api/pause", tc.auth)
			if code != tc.code || !strings.Contains(body, tc.contains) {
				t.Fatalf("POST /api/pause = %d %q, want %d containing %q", code, body, tc.code, tc.contains)
			}
			if did := acted.Load() - before; (code == http.StatusOK) != (did == 1) {
				t.Fatalf("answered %d and acted %d times", code, did)
			}
			if code, body, _ := testutil.HTTPGet(t, srv.URL+"/", ""); code != http.StatusOK || body != "page" {
				t.Errorf("GET / = %d %q: the page is open whatever the actions", code, body)
			}
		})
	}
}
