package actor

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
)

func testLog() (*logrus.Entry, *bytes.Buffer) {
	var buf bytes.Buffer
	l := logrus.New()
	l.Out = &buf
	l.Level = logrus.DebugLevel
	return logrus.NewEntry(l), &buf
}

func TestGoWaits(t *testing.T) {
	log, buf := testLog()
	var g Group
	var n atomic.Int32
	for range 10 {
		g.Go(log, "worker", func() { n.Add(1) }, nil)
	}
	g.Wait()
	if n.Load() != 10 {
		t.Fatalf("%d goroutines ran before Wait returned, want 10", n.Load())
	}
	if !strings.Contains(buf.String(), "goroutine started") || !strings.Contains(buf.String(), "goroutine stopped") {
		t.Fatalf("debug log lacks start/stop lines:\n%s", buf.String())
	}
}

func TestGoHandsPanicsToOwner(t *testing.T) {
	log, buf := testLog()
	var g Group
	var got any
	g.Go(log, "bad", func() { panic("boom") }, func(v any) { got = v })
	g.Wait()
	if got != "boom" {
		t.Fatalf("onPanic got %v, want boom", got)
	}
	if !strings.Contains(buf.String(), "goroutine panicked") || !strings.Contains(buf.String(), "bad") {
		t.Fatalf("panic not logged with the goroutine's name:\n%s", buf.String())
	}
}
