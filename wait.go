// wait.go: the claim-and-wait loop (run): claim, and while another owner
// holds the key, wait to be told (or poll) and claim again.

package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// The first pause of a waiter's polling; it doubles up to WithPollInterval.
const defaultFirstPoll = 25 * time.Millisecond

// run is one caller's way through the key: claim, and while another owner
// holds the key, wait and claim again, until it gets an outcome, becomes the
// owner, or its budget ends. The wait loop is the claim loop: pub/sub only
// says when to claim again. retry reports an outcome that in-process
// followers must not share (see flights).
func (c *Client) run(ctx context.Context, key, fp string, fn func(context.Context) ([]byte, error)) (res []byte, err error, retry bool) {
	keys := c.keys(key)
	token := newToken()
	first := c.claimRecord(fp, token, 1) // what a claim of a new key writes
	var (
		w        *watcher
		deadline time.Time
		seen     int64 // the attempt number last seen in progress
		pause    = c.firstPoll
		timer    *time.Timer
	)
	defer func() {
		if w != nil {
			w.stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		sent := time.Now()
		r, err := c.claim(ctx, keys, fp, first)
		if err != nil {
			if mayHaveRun(err) || errors.Is(err, ErrNotReplicated) {
				// The claim may have happened with its reply lost: give it
				// back if it is ours. fn does not run.
				c.release(ctx, keys, token)
			}
			return nil, fmt.Errorf("idem: claim key %q: %w", key, err), ctx.Err() != nil
		}
		switch r.kind {
		case 'c':
			if seen > 0 && r.n == 1 {
				c.release(ctx, keys, token)
				return nil, fmt.Errorf("%w: key %q: attempt %d was in progress; is the retention shorter than the operation?", ErrExpired, key, seen), false
			}
			if err := ctx.Err(); err != nil {
				// The caller gave up while the claim was under way (go-redis
				// applies a context's deadline to reads only with
				// ContextTimeoutEnabled): give the claim back; fn does not
				// start.
				c.release(ctx, keys, token)
				return nil, fmt.Errorf("idem: claim key %q: %w", key, err), true
			}
			if w != nil {
				w.stop()
				w = nil
			}
			claimed := first
			if r.n != 1 {
				claimed = c.claimRecord(fp, token, r.n)
			}
			return c.own(ctx, key, keys, fp, token, claimed, r.n, sent, fn)
		case 'd':
			return replyBytes(r.payload), nil, false
		case 'f':
			return nil, readFailure(r.payload), false
		case 'x':
			return nil, fmt.Errorf("%w: key %q", ErrConflict, key), false
		case 'v':
			return nil, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, r.payload), false
		}
		// 'b': another owner holds a live lease.
		seen = r.n
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(c.cfg.wait)
		}
		if c.cfg.wait <= 0 || !now.Before(deadline) {
			return nil, fmt.Errorf("%w: key %q, attempt %d", ErrInProgress, key, r.n), false
		}
		if w == nil {
			w = c.hub.watch(keys[1])
		}
		d := min(jitter(pause), r.leaseLeft, deadline.Sub(now))
		pause = min(2*pause, c.cfg.pollInterval)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-w.sig:
		case <-timer.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, key, r.n, ctx.Err()), true
		case <-c.hub.done:
			return nil, ErrClosed, false
		}
	}
}

// jitter spreads waiters' polls over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// mayHaveRun reports whether a failed script call may still have run on the
// server: its reply was lost, it timed out, or it was cancelled after it was
// sent. It did not run when Redis answered with an error, or when no
// connection could be made.
func mayHaveRun(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false
	}
	var oe *net.OpError
	return !errors.As(err, &oe) || oe.Op != "dial"
}
