package grpcidem

import (
	"context"
	"log/slog"
)

// defaultHandler sends each record to slog.Default()'s handler at the time
// it is logged, as the Client does, so that a program that sets its
// default logger after building the interceptor still gets its records.
// It is this module's own: a nested module does not import the core's
// internal packages, which promise no compatibility.
type defaultHandler struct{}

func (defaultHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return slog.Default().Handler().Enabled(ctx, l)
}

func (defaultHandler) Handle(ctx context.Context, r slog.Record) error {
	return slog.Default().Handler().Handle(ctx, r)
}

func (defaultHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return slog.Default().Handler().WithAttrs(attrs)
}

func (defaultHandler) WithGroup(name string) slog.Handler {
	return slog.Default().Handler().WithGroup(name)
}
