package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idem-go/idem/door"
)

// errHandlerTimeout is the cause of a handler context that outlived
// WithHandlerTimeout.
var errHandlerTimeout = errors.New("grpcidem: the handler ran longer than WithHandlerTimeout")

// detach runs do with door.Detach: on a context that keeps ctx's values
// (the call's metadata, its stream as captured) but not its cancellation
// or deadline, bounded by WithHandlerTimeout, waited for while ctx lasts.
// It returns do's outcome (never a panic), or ok false once ctx ended first: do goes on,
// and its outcome is recorded for the retry. A panic in do reaches the
// caller while it waits; after, it is logged.
func (cl *call) detach(ctx context.Context, do func(ctx context.Context) ([]byte, error)) (door.Outcome, bool) {
	o, ok := door.Detach(ctx, cl.s.cfg.handlerTimeout, errHandlerTimeout, do, func(p any) {
		cl.log(slog.LevelError, "grpcidem: a detached handler panicked after its caller had gone; its key was released",
			nil, slog.Any("panic", p))
	})
	if o.Panicked {
		if o.Panic == nil {
			panic(fmt.Sprintf("grpcidem: key %q: the handler called runtime.Goexit or panicked with nil", cl.key))
		}
		panic(o.Panic)
	}
	return o, ok
}
