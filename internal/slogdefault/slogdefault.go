// Package slogdefault has the handler that the idem packages log to by
// default: slog.Default()'s, looked up when a record is logged.
package slogdefault

import (
	"context"
	"log/slog"
)

// Handler sends each record to the handler of slog.Default() at the time
// it is logged, so that a program that sets its default logger after
// building a Client or a middleware still gets their records.
type Handler struct{}

// Enabled reports whether slog.Default()'s handler handles level l.
func (Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return slog.Default().Handler().Enabled(ctx, l)
}

// Handle hands r to slog.Default()'s handler.
func (Handler) Handle(ctx context.Context, r slog.Record) error {
	return slog.Default().Handler().Handle(ctx, r)
}

// WithAttrs returns slog.Default()'s handler, as it is now, with attrs.
func (Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return slog.Default().Handler().WithAttrs(attrs)
}

// WithGroup returns slog.Default()'s handler, as it is now, with the group.
func (Handler) WithGroup(name string) slog.Handler {
	return slog.Default().Handler().WithGroup(name)
}
