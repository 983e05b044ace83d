package client

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

// logRecord is one record a recordHandler received.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any // the logger's attrs and the record's
}

// recordHandler is a slog.Handler that keeps every record, for tests.
type recordHandler struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []slog.Attr
}

func newRecordHandler() recordHandler {
	return recordHandler{mu: new(sync.Mutex), records: new([]logRecord)}
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	h.mu.Lock()
	*h.records = append(*h.records, rec)
	h.mu.Unlock()
	return nil
}

func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(slices.Clip(h.attrs), as...)
	return h
}

func (h recordHandler) WithGroup(string) slog.Handler { return h }

// find returns the records with message msg.
func (h recordHandler) find(msg string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.records {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// An application's *slog.Logger receives the connection events, with the
// client's and the session's attributes.
func TestLoggerIsSlog(t *testing.T) {
	t.Parallel()
	h := newRecordHandler()
	d := startFake(t)
	connectTo(t, d, Config{ClientID: "worker-1", Logger: slog.New(h)})
	rs := h.find("connected")
	if len(rs) != 1 {
		t.Fatalf("%d \"connected\" records, want 1", len(rs))
	}
	r := rs[0]
	if r.level != slog.LevelInfo || r.attrs["client_id"] != "worker-1" || r.attrs["node"] != "fake" ||
		r.attrs["addr"] != d.addr() || r.attrs["topic"] != "test" {
		t.Errorf("connected record = %+v", r)
	}
}

// A nil Logger logs nothing, and formats nothing.
func TestNilLoggerDiscards(t *testing.T) {
	t.Parallel()
	cfg, err := Config{Addrs: []string{"x:1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil || cfg.Logger.Enabled(context.Background(), slog.LevelError) {
		t.Errorf("default Logger = %v, want one enabled at no level", cfg.Logger)
	}
}
