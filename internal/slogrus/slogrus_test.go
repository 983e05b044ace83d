package slogrus

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

func TestLoggerForwardsToLogrus(t *testing.T) {
	l, hook := test.NewNullLogger()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.InfoLevel)
	log := Logger(logrus.NewEntry(l).WithField("component", "chaos")).With("client_id", "c1")
	boom := errors.New("boom")
	log.Debug("not shown")
	log.Info("connected", "node", "n1", slog.Group("welcome", "max_in_flight", 8))
	log.WithGroup("session").Warn("disconnected", "error", boom)
	es := hook.AllEntries()
	if len(es) != 2 {
		t.Fatalf("%d entries, want 2 (debug is below the level)", len(es))
	}
	if e := es[0]; e.Level != logrus.InfoLevel || e.Message != "connected" || e.Data["component"] != "chaos" ||
		e.Data["client_id"] != "c1" || e.Data["node"] != "n1" || e.Data["welcome.max_in_flight"] != int64(8) {
		t.Errorf("info entry: %v %q %v", e.Level, e.Message, e.Data)
	}
	if e := es[1]; e.Level != logrus.WarnLevel || e.Data["session.error"] != boom || e.Data["client_id"] != "c1" {
		t.Errorf("warn entry: %v %q %v", e.Level, e.Message, e.Data)
	}
}
