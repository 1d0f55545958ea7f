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
// costs one Redis round, not one each.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight // guarded by mu; by key
}

type flight struct {
	fp string
	// done is closed when res, err and retry are set. It is made (under
	// flights.mu) when the first follower comes: most calls have none.
	done  chan struct{}
	res   []byte
	err   error
	retry bool // the leader's outcome is not for followers: they try themselves
}

func (f *flights) do(ctx context.Context, c *Client, key, fp string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	until := time.Now().Add(c.cfg.wait) // this caller's own wait budget
	if c.cfg.wait <= 0 {
		// Followers could only wait; with no waiting, each asks Redis.
		res, err, _ := c.claim(ctx, key, fp, until, fn)
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
		fl, ok := f.m[key]
		if ok && fl.fp != fp {
			// Another call with other parameters is under way: let Redis
			// decide which one conflicts.
			f.mu.Unlock()
			res, err, _ := c.claim(ctx, key, fp, until, fn)
			return res, err
		}
		if ok {
			if fl.done == nil {
				fl.done = make(chan struct{})
			}
			done := fl.done
			f.mu.Unlock()
			c.observeFollow(ctx, key)
			if timer == nil {
				timer = time.NewTimer(time.Until(until))
			}
			select {
			case <-done:
				if fl.retry {
					continue
				}
				return fl.res, fl.err
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: key %q: %w", ErrInProgress, key, ctx.Err())
			case <-timer.C:
				return nil, fmt.Errorf("%w: key %q", ErrInProgress, key)
			case <-c.hub.Done():
				return nil, ErrClosed
			}
		}
		fl = &flight{fp: fp}
		if f.m == nil {
			f.m = make(map[string]*flight)
		}
		f.m[key] = fl
		f.mu.Unlock()
		return f.lead(ctx, c, key, until, fl, fn)
	}
}

func (f *flights) lead(ctx context.Context, c *Client, key string, until time.Time, fl *flight, fn func(context.Context) ([]byte, error)) (res []byte, err error) {
	fl.retry = true // kept if claim panics
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		done := fl.done
		f.mu.Unlock()
		if done != nil {
			close(done)
		}
	}()
	res, err, retry := c.claim(ctx, key, fl.fp, until, fn)
	fl.res, fl.err, fl.retry = res, err, retry
	return res, err
}
