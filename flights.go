// flights.go: in-process coalescing: concurrent calls with one key and
// fingerprint in one process share one claim and one wait.

package idem

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// flights lets concurrent calls in one process with the same key and
// fingerprint share one claim and one wait, so that a burst of duplicates
// costs one Redis round, not one each: the first call leads, and the
// others follow it, waiting for its outcome.
type flights struct {
	mu sync.Mutex
	m  map[string]*call // guarded by mu; the leading call, by key
}

// do takes cl through its key, as a follower of a leading call with the
// same key and fingerprint, or as a leader that claims (see claim).
func (f *flights) do(ctx context.Context, cl *call) ([]byte, error) {
	c := cl.c
	if c.cfg.wait <= 0 {
		// Followers could only wait; with no waiting, each asks Redis.
		res, _, err := cl.claim(ctx)
		return res, err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		f.mu.Lock()
		lead, ok := f.m[cl.key]
		if ok && lead.fp != cl.fp {
			// Another call with other parameters is under way: let Redis
			// decide which one conflicts.
			f.mu.Unlock()
			res, _, err := cl.claim(ctx)
			return res, err
		}
		if ok {
			if lead.ready == nil {
				lead.ready = make(chan struct{})
			}
			ready := lead.ready
			f.mu.Unlock()
			cl.observeFollow()
			if timer == nil {
				timer = time.NewTimer(time.Until(cl.until))
			}
			select {
			case <-ready:
				if lead.retry {
					continue
				}
				return lead.res, lead.err
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: key %q: %w", ErrInProgress, cl.key, ctx.Err())
			case <-timer.C:
				return nil, fmt.Errorf("%w: key %q", ErrInProgress, cl.key)
			case <-c.hub.Done():
				return nil, ErrClosed
			}
		}
		if f.m == nil {
			f.m = make(map[string]*call)
		}
		f.m[cl.key] = cl
		f.mu.Unlock()
		return f.lead(ctx, cl)
	}
}

// lead claims for cl, the flight of its key, and hands the outcome to its
// followers.
func (f *flights) lead(ctx context.Context, cl *call) ([]byte, error) {
	cl.retry = true // kept if claim panics
	defer func() {
		f.mu.Lock()
		delete(f.m, cl.key)
		ready := cl.ready
		f.mu.Unlock()
		if ready != nil {
			close(ready)
		}
	}()
	res, retry, err := cl.claim(ctx)
	cl.res, cl.err, cl.retry = res, err, retry
	return res, err
}
