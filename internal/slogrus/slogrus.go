// Package slogrus hands the records of a *slog.Logger to a logrus entry:
// the Go client logs through log/slog (so that applications need not take
// logrus), and the daemon's own tools that run a client (bin/chaos) keep
// their logrus logs.
package slogrus

import (
	"context"
	"log/slog"

	"github.com/sirupsen/logrus"
)

// Logger returns a *slog.Logger whose records go to e, at the matching
// level, with their attributes as fields (a group's as "group.key").
func Logger(e *logrus.Entry) *slog.Logger { return slog.New(handler{entry: e}) }

// handler is the slog.Handler of Logger.
type handler struct {
	entry *logrus.Entry
	group string // prefix of the keys of attributes added from now on
}

// level maps a slog level onto logrus's.
func level(l slog.Level) logrus.Level {
	switch {
	case l >= slog.LevelError:
		return logrus.ErrorLevel
	case l >= slog.LevelWarn:
		return logrus.WarnLevel
	case l >= slog.LevelInfo:
		return logrus.InfoLevel
	default:
		return logrus.DebugLevel
	}
}

func (h handler) Enabled(_ context.Context, l slog.Level) bool {
	return h.entry.Logger.IsLevelEnabled(level(l))
}

func (h handler) Handle(_ context.Context, r slog.Record) error {
	fields := make(logrus.Fields, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		h.add(fields, h.group, a)
		return true
	})
	e := h.entry.WithFields(fields)
	if !r.Time.IsZero() {
		e = e.WithTime(r.Time)
	}
	e.Log(level(r.Level), r.Message)
	return nil
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	fields := make(logrus.Fields, len(as))
	for _, a := range as {
		h.add(fields, h.group, a)
	}
	return handler{entry: h.entry.WithFields(fields), group: h.group}
}

func (h handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return handler{entry: h.entry, group: h.group + name + "."}
}

// add puts a into fields under prefix, a group's attributes one by one;
// an error stays an error (logrus's "error" field).
func (h handler) add(fields logrus.Fields, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			h.add(fields, p, g)
		}
		return
	}
	if a.Key == "" {
		return
	}
	fields[prefix+a.Key] = v.Any()
}
