package door

import (
	"context"
	"time"
)

// Outcome is what a call run by Detach came to.
type Outcome struct {
	// Res and Err are what the call returned.
	Res []byte
	Err error
	// Panicked is set when the call panicked (or called runtime.Goexit),
	// with Panic the panic's value (nil after runtime.Goexit).
	Panicked bool
	Panic    any
}

// Detach runs do, a door's call of idem.Client.Do, so that the work
// outlives its caller: on a context that keeps ctx's values (the
// request's, the call's metadata) but not its cancellation or deadline,
// ending timeout after it started, with cause (the door's
// WithHandlerTimeout), and waits for it while ctx lasts. It returns do's
// outcome, or ok false once ctx ended first: do goes on, and its outcome
// is recorded for the retry.
//
// A panic in do while the caller waits is its Outcome (Panicked), for the
// door to panic again in its caller; one after the caller has gone goes
// to late, if not nil, for the door to log (the key was released).
func Detach(ctx context.Context, timeout time.Duration, cause error, do func(context.Context) ([]byte, error), late func(p any)) (o Outcome, ok bool) {
	done := make(chan Outcome, 1)
	gone := make(chan struct{})
	go func() {
		dctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), timeout, cause)
		defer cancel()
		finished := false
		defer func() {
			if finished {
				return
			}
			p := recover() // nil after runtime.Goexit
			select {
			case <-gone:
				if late != nil {
					late(p)
				}
			default:
			}
			done <- Outcome{Panicked: true, Panic: p}
		}()
		res, err := do(dctx)
		finished = true
		done <- Outcome{Res: res, Err: err}
	}()
	select {
	case o := <-done:
		return o, true
	case <-ctx.Done():
		close(gone)
		return Outcome{}, false
	}
}
