package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

// fakeActions records what the handler asks of the daemon.
type fakeActions struct {
	paused    []bool
	by        []string
	drainID   uint64
	drainName string
	clients   []status.Client
	err       error
}

func (f *fakeActions) config() ActionsConfig {
	return ActionsConfig{
		Pause: func(ctx context.Context, paused bool, by string) (*status.Pause, error) {
			if _, ok := ctx.Deadline(); !ok {
				return nil, errors.New("no deadline")
			}
			if f.err != nil {
				return nil, f.err
			}
			f.paused, f.by = append(f.paused, paused), append(f.by, by)
			return &status.Pause{Paused: paused, Version: uint64(len(f.paused)), Node: "a", By: by}, nil
		},
		DrainClient: func(_ context.Context, id uint64, name, by string) ([]status.Client, error) {
			if f.err != nil {
				return nil, f.err
			}
			f.drainID, f.drainName, f.by = id, name, append(f.by, by)
			return f.clients, nil
		},
	}
}

// do sends body to path on h, from remote 10.1.2.3:4444.
func do(h http.Handler, path, body string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.RemoteAddr = "10.1.2.3:4444"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// Pause and resume ask the daemon, saying who asked: the name given and
// the request's address, or the address alone.
func TestActionsPauseAndResume(t *testing.T) {
	t.Parallel()
	f := &fakeActions{}
	h := Actions(f.config())
	code, body := do(h, "/api/pause", `{"by":"alice@ops-1"}`)
	var ans PauseAnswer
	if err := json.Unmarshal([]byte(body), &ans); code != http.StatusOK || err != nil || ans.Pause == nil || !ans.Pause.Paused {
		t.Fatalf("pause: %d %q (%v)", code, body, err)
	}
	if code, body := do(h, "/api/resume", ""); code != http.StatusOK || !strings.Contains(body, `"paused":false`) {
		t.Fatalf("resume: %d %q", code, body)
	}
	want := []string{"alice@ops-1 from 10.1.2.3:4444", "10.1.2.3:4444"}
	if fmt.Sprint(f.paused) != "[true false]" || fmt.Sprint(f.by) != fmt.Sprint(want) {
		t.Fatalf("asked %v by %q, want [true false] by %q", f.paused, f.by, want)
	}
	if code, body := do(h, "/api/pause", `{"by":`); code != http.StatusBadRequest {
		t.Errorf("a broken body: %d %q", code, body)
	}
	if code, _ := do(h, "/api/pause", `{"by":"`+strings.Repeat("x", maxActionBody)+`"}`); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over %d bytes: %d", maxActionBody, code)
	}
	req := httptest.NewRequest(http.MethodGet, "/api/pause", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /api/pause = %d, want 405", rec.Code)
	}
}

// Drain-client names a client by name or session; no such client is 404,
// a daemon that cannot act now 503.
func TestActionsDrainClient(t *testing.T) {
	t.Parallel()
	f := &fakeActions{clients: []status.Client{{ID: 7, Name: "w1", InFlight: 2, Draining: true, ConnectedAt: time.Now()}}}
	h := Actions(f.config())
	code, body := do(h, "/api/drain-client", `{"name":"w1","by":"ops"}`)
	var ans DrainAnswer
	if err := json.Unmarshal([]byte(body), &ans); code != http.StatusOK || err != nil || len(ans.Drained) != 1 || ans.Drained[0].ID != 7 {
		t.Fatalf("drain: %d %q (%v)", code, body, err)
	}
	if f.drainName != "w1" || f.drainID != 0 || f.by[0] != "ops from 10.1.2.3:4444" {
		t.Fatalf("asked to drain %d %q by %q", f.drainID, f.drainName, f.by)
	}
	if code, _ := do(h, "/api/drain-client", `{"id":7}`); code != http.StatusOK || f.drainID != 7 {
		t.Fatalf("drain by session: %d, asked %d", code, f.drainID)
	}
	if code, body := do(h, "/api/drain-client", `{}`); code != http.StatusBadRequest || !strings.Contains(body, "needs the client") {
		t.Errorf("drain of nobody: %d %q", code, body)
	}
	f.clients = nil
	if code, body := do(h, "/api/drain-client", `{"name":"ghost"}`); code != http.StatusNotFound || !strings.Contains(body, `"ghost"`) {
		t.Errorf("drain of no such client: %d %q", code, body)
	}
	f.err = fmt.Errorf("%w: this daemon serves no clients", ErrUnavailable)
	if code, body := do(h, "/api/drain-client", `{"name":"w1"}`); code != http.StatusServiceUnavailable || !strings.Contains(body, "serves no clients") {
		t.Errorf("drain on a daemon that serves none: %d %q", code, body)
	}
	if code, _ := do(h, "/api/pause", ""); code != http.StatusServiceUnavailable {
		t.Errorf("pause on a daemon that cannot: %d", code)
	}
}

func TestWho(t *testing.T) {
	t.Parallel()
	for _, tc := range [][3]string{
		{"", "1.2.3.4:5", "1.2.3.4:5"},
		{"  alice \n bob ", "1.2.3.4:5", "alice bob from 1.2.3.4:5"},
	} {
		if got := Who(tc[0], tc[1]); got != tc[2] {
			t.Errorf("Who(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}
