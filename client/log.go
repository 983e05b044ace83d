package client

import (
	"context"
	"log/slog"
)

// discardHandler is the slog.Handler of a nil Config.Logger: it is enabled
// at no level, so nothing is formatted.
type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (h discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h discardHandler) WithGroup(string) slog.Handler           { return h }
