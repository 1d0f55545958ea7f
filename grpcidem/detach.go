package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// errHandlerTimeout is the cause of a handler context that outlived
// WithHandlerTimeout.
var errHandlerTimeout = errors.New("grpcidem: the handler ran longer than WithHandlerTimeout")

// outcome is what the detached call to idem.Client.Do came to.
type outcome struct {
	res      []byte
	err      error
	panicked bool
	value    any // the panic's
}

// detach runs do on a context that keeps ctx's values (the call's
// metadata, its stream as captured) but not its cancellation or deadline,
// bounded by WithHandlerTimeout, and waits for it while ctx lasts. It
// returns do's outcome, or ok false once ctx ended first: do goes on, and
// its outcome is recorded for the retry. A panic in do reaches the caller
// while it waits; after, it is logged.
func (cl *call) detach(ctx context.Context, do func(ctx context.Context) ([]byte, error)) (o outcome, ok bool) {
	done := make(chan outcome, 1)
	gone := make(chan struct{})
	go func() {
		dctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), cl.s.cfg.handlerTimeout, errHandlerTimeout)
		defer cancel()
		finished := false
		defer func() {
			if finished {
				return
			}
			p := recover() // nil after runtime.Goexit
			select {
			case <-gone:
				cl.log(slog.LevelError, "grpcidem: a detached handler panicked after its caller had gone; its key was released",
					nil, slog.Any("panic", p))
			default:
			}
			done <- outcome{panicked: true, value: p}
		}()
		res, err := do(dctx)
		finished = true
		done <- outcome{res: res, err: err}
	}()
	select {
	case o := <-done:
		if o.panicked {
			if o.value == nil {
				panic(fmt.Sprintf("grpcidem: key %q: the handler called runtime.Goexit or panicked with nil", cl.key))
			}
			panic(o.value)
		}
		return o, true
	case <-ctx.Done():
		close(gone)
		return outcome{}, false
	}
}
