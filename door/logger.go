package door

import (
	"log/slog"

	"github.com/idem-go/idem/internal/slogdefault"
)

// Logger returns the logger a door logs to when it is given none: one
// that hands each record to slog.Default() as it is when the record is
// logged, as the Client does, so that a program that sets its default
// logger after building a door still gets its records.
func Logger() *slog.Logger { return slog.New(slogdefault.Handler{}) }
