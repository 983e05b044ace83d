package deliverylog

import (
	"bytes"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func quiet() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

func TestAppendAndParseRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_700_000_000, 123)
	events := []Event{
		{At: at, Kind: Open, Partition: -1, Offset: -1, Detail: "node=d0,pid=1"},
		{At: at, Kind: Deliver, Partition: 3, Offset: 0, ID: 1 << 40, Attempt: 2, Session: 7, Client: "c0.1"},
		{At: at, Kind: Gone, Partition: 3, Offset: 0, ID: 1 << 40, Attempt: 2, Session: 7, Detail: Counted, Client: "a name with spaces"},
		{At: at, Kind: Leave, Partition: -1, Offset: -1, Session: 7, Detail: "no sign of life", Client: "two\nlines"},
		{At: at, Kind: Assign, Partition: 0, Offset: -1},
	}
	var b []byte
	for _, e := range events {
		b = Append(b, e)
	}
	got, bad, err := Parse(bytes.NewReader(append(b, "garbage line\n1700 deliv"...)))
	if err != nil || bad != 2 || len(got) != len(events) {
		t.Fatalf("parsed %d events, %d bad, err %v:\n%s", len(got), bad, err, b)
	}
	events[3].Detail, events[3].Client = "no?sign?of?life", "two?lines"
	for i, e := range events {
		e.At = e.At.Round(0)
		if got[i] != e {
			t.Errorf("event %d: got %+v, want %+v", i, got[i], e)
		}
	}
	if !got[2].Counted() || got[1].Counted() {
		t.Error("Counted is wrong")
	}
}

// lineWriter records each write and blocks while gate is held; entered,
// when set, is signalled as a write begins.
type lineWriter struct {
	mu      sync.Mutex
	writes  [][]byte
	gate    sync.Mutex
	entered chan struct{}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	if w.entered != nil {
		select {
		case w.entered <- struct{}{}:
		default:
		}
	}
	w.gate.Lock()
	w.gate.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

func (w *lineWriter) Close() error { return nil }

// Every write to the file holds whole lines, so a process killed between
// two writes leaves no half line for the next one to append to.
func TestWritesHoldWholeLines(t *testing.T) {
	t.Parallel()
	w := &lineWriter{}
	l := newLog(w, 1<<16, quiet())
	l.start()
	for i := range 5000 {
		l.Add(Event{At: time.Now(), Kind: Deliver, Partition: 1, Offset: int64(i), ID: uint64(i + 1), Attempt: 1, Session: 9, Client: "client"})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range w.writes {
		if len(p) == 0 || p[len(p)-1] != '\n' {
			t.Fatalf("a write ends in the middle of a line: %q", p[max(0, len(p)-40):])
		}
		n += bytes.Count(p, []byte("\n"))
	}
	if n != 5000 || len(w.writes) < 2 {
		t.Fatalf("%d lines in %d writes, want 5000 in several", n, len(w.writes))
	}
}

// A slow disk never blocks Add: what does not fit the queue is dropped,
// and a gap line says how much.
func TestASlowDiskDropsEventsAndMarksTheGap(t *testing.T) {
	t.Parallel()
	w := &lineWriter{entered: make(chan struct{}, 1)}
	w.gate.Lock() // the disk hangs
	l := newLog(w, 4, quiet())
	l.start()
	l.Add(Event{At: time.Now(), Kind: Ack, Partition: 0, Offset: 100, ID: 101})
	<-w.entered // the writer caught up, flushes, and hangs
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			l.Add(Event{At: time.Now(), Kind: Ack, Partition: 0, Offset: int64(i), ID: uint64(i + 1)})
		}
	}()
	<-done // Add returned 100 times while nothing could be written
	w.gate.Unlock()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, p := range w.writes {
		all = append(all, p...)
	}
	evs, bad, err := Parse(bytes.NewReader(all))
	if err != nil || bad != 0 {
		t.Fatalf("bad %d, err %v", bad, err)
	}
	acks, dropped := 0, 0
	for _, e := range evs {
		switch e.Kind {
		case Ack:
			acks++
		case Gap:
			n, err := strconv.Atoi(e.Detail)
			if err != nil {
				t.Fatalf("gap without a count: %+v", e)
			}
			dropped += n
		}
	}
	if acks+dropped != 101 || dropped != 96 {
		t.Fatalf("%d acks written and %d dropped, want 101 in all, 96 dropped (the queue holds 4)", acks, dropped)
	}
}

func TestOpenFileAppendsAndNamesTheProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "d0.log")
	for range 2 {
		l, err := OpenFile(path, "d0", quiet())
		if err != nil {
			t.Fatal(err)
		}
		l.Add(Event{At: time.Now(), Kind: Start, Partition: -1, Offset: -1, Detail: "leader"})
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	evs, bad, err := ReadFile(path)
	if err != nil || bad != 0 || len(evs) != 4 {
		t.Fatalf("%d events, %d bad, err %v", len(evs), bad, err)
	}
	for i, want := range []Kind{Open, Start, Open, Start} {
		if evs[i].Kind != want {
			t.Fatalf("event %d is %v, want %v", i, evs[i].Kind, want)
		}
	}
	if !strings.HasPrefix(evs[0].Detail, "node=d0,pid=") {
		t.Fatalf("open: %q", evs[0].Detail)
	}
	var nilLog *Log
	nilLog.Add(Event{}) // a nil log records nothing
	if err := nilLog.Close(); err != nil {
		t.Fatal(err)
	}
}
