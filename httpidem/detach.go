package httpidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/idem-go/idem/door"
)

// gate guards the real ResponseWriter from a handler that runs detached
// (WithHandlerTimeout): the handler's streamed writes reach it only while
// ServeHTTP still waits for the handler; once ServeHTTP has gone, they are
// dropped.
type gate struct {
	mu     sync.Mutex
	closed bool // ServeHTTP has stopped waiting, or is about to
	used   bool // something was written through the gate
}

// pass runs f on the real writer, unless the gate is closed; it reports
// whether f ran.
func (g *gate) pass(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.used = true
	f()
	return true
}

// close closes the gate and reports whether anything went through it.
func (g *gate) close() (used bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	return g.used
}

// errHandlerTimeout is the cause of a handler context that outlived
// WithHandlerTimeout.
var errHandlerTimeout = errors.New("httpidem: the handler ran longer than WithHandlerTimeout")

// errClientGone is what a streamed write returns once ServeHTTP has gone.
var errClientGone = errors.New("httpidem: the request's context ended; the handler runs on detached, and its response goes to the retry")

// detach runs do with door.Detach: on a context that keeps r's values
// but not its cancellation, bounded by WithHandlerTimeout, waited for
// while r's context lasts. It returns do's outcome (never a panic), or ok false once r's
// context ended first: do goes on, and its outcome is recorded for the
// retry. A panic in do reaches the caller while it waits; after, it is
// logged.
func (m *middleware) detach(r *http.Request, key string, do func(ctx context.Context) ([]byte, error)) (door.Outcome, bool) {
	o, ok := door.Detach(r.Context(), m.cfg.handlerTimeout, errHandlerTimeout, do, func(p any) {
		if p != http.ErrAbortHandler {
			m.log(r, key, slog.LevelError, "httpidem: a detached handler panicked after its client had gone; its key was released",
				nil, slog.Any("panic", p))
		}
	})
	if o.Panicked {
		if o.Panic == nil {
			panic(fmt.Sprintf("httpidem: key %q: the handler called runtime.Goexit or panicked with nil", key))
		}
		panic(o.Panic)
	}
	return o, ok
}
