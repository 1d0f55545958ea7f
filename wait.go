// wait.go: the claim-and-wait loop (claim): claim, and while another owner
// holds the key, wait to be told (or poll) and claim again.

package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/notify"
	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

// The first pause of a waiter's polling; it doubles up to the poll
// interval (500ms: config.pollInterval).
const defaultFirstPoll = 25 * time.Millisecond

// claim is one caller's way through the key: claim, and while another owner
// holds the key, wait and claim again, until it gets an outcome, becomes the
// owner (see own), or its budget ends: its context, and cl.until, the end
// of its wait (WithWait). The wait loop is the claim loop: pub/sub says when to claim
// again, or carries the outcome of the owner the caller waits for (see
// notified), as a claim would read it from the record. retry reports an
// outcome that in-process followers must not share (see flights).
//
// Model: steps Claim, ClaimReply and RenewBeforeFn of process Caller in
// model/idem.pml.
func (cl *call) claim(ctx context.Context) (res []byte, retry bool, err error) {
	c, key := cl.c, cl.key
	cl.keys, cl.token = c.keys(key), newToken()
	first := c.claimRecord(cl.fp, cl.token, 1) // what a claim of a new key writes
	var (
		w     *notify.Watcher
		seen  int64       // the attempt number last seen in progress
		owner string      // the token of its owner
		woken *claimReply // an outcome that the owner's notification carried
		pause = c.firstPoll
		timer *time.Timer
	)
	defer func() {
		if w != nil {
			w.Stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		sent := mono()
		var r claimReply
		var err error
		if woken != nil {
			// The owner's notification carried its outcome: the record
			// holds it as a claim would find it.
			r, woken = *woken, nil
		} else {
			r, err = c.claimOnce(ctx, cl.keys, cl.fp, first)
		}
		if err != nil {
			if mayHaveRun(err) || errors.Is(err, ErrNotReplicated) {
				// The claim may have happened with its reply lost: give it
				// back if it is ours. fn does not run.
				cl.giveBack(ctx, err)
			}
			if seen > 0 && ctx.Err() != nil {
				return nil, true, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, key, seen, ctx.Err())
			}
			return nil, ctx.Err() != nil, claimError(ctx, key, err)
		}
		cl.observeClaim(r.kind, r.n, r.age)
		switch r.kind {
		case replyClaimed:
			if seen > 0 && r.n == 1 {
				cl.giveBack(ctx, nil)
				return nil, false, fmt.Errorf("%w: key %q: attempt %d was in progress; is the retention shorter than the operation?", ErrExpired, key, seen)
			}
			if err := ctx.Err(); err != nil {
				// The caller gave up while the claim was under way (go-redis
				// applies a context's deadline to reads only with
				// ContextTimeoutEnabled): give the claim back; fn does not
				// start.
				cl.giveBack(ctx, nil)
				return nil, true, fmt.Errorf("idem: claim key %q: %w", key, err)
			}
			// The server granted the lease after the claim was sent: for
			// the owner, it ends no later than sent + the lease left.
			deadline := sent + int64(r.leaseLeft-c.margin)
			if deadline-mono() < int64(c.renewals.every) {
				// Too little left to start fn on (a slow reply, or a repeat
				// of a claim whose reply was lost): renew first.
				renewed, at, err := cl.renew(ctx)
				if err == nil && !renewed {
					// Another caller took the key over meanwhile (or the
					// record is gone): wait for it like any duplicate.
					seen = r.n
					continue
				}
				if renewed {
					deadline = at + int64(c.cfg.lease-c.margin)
				}
				if left := time.Duration(deadline - mono()); err != nil || left < c.renewals.every {
					cl.giveBack(ctx, nil)
					if err == nil {
						err = fmt.Errorf("only %v left after a renewal", left)
					}
					return nil, true, fmt.Errorf("%w: key %q: the claim came back with %v of its lease left, and renewing it failed (fn did not run): %w",
						ErrLeaseLost, key, r.leaseLeft, err)
				}
			}
			if w != nil {
				w.Stop()
				w = nil
			}
			cl.n, cl.claimed = r.n, first
			if r.n != 1 {
				cl.claimed = c.claimRecord(cl.fp, cl.token, r.n)
			}
			return cl.own(ctx, deadline)
		case replyDone:
			return replyBytes(r.payload), false, nil
		case replyFailed:
			return nil, false, readFailure(r.payload)
		case replyConflict:
			return nil, false, fmt.Errorf("%w: key %q", ErrConflict, key)
		case replyLateRetry:
			res, err := cl.lateRetry(ctx)
			return res, false, err
		case replyBadRecord:
			return nil, false, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, r.payload)
		}
		// replyBusy: another owner holds a live lease.
		seen, owner = r.n, r.owner
		now := time.Now()
		if c.cfg.wait <= 0 || !now.Before(cl.until) {
			// Followers with budgets of their own try again themselves.
			return nil, true, fmt.Errorf("%w: key %q, attempt %d", ErrInProgress, key, r.n)
		}
		if w == nil {
			w = c.hub.Watch(cl.keys[1])
		}
		d := min(jitter(pause), r.leaseLeft, cl.until.Sub(now))
		pause = min(2*pause, c.cfg.pollInterval)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-w.C():
			if msg, ok := w.Note(); ok {
				if r, ok := notified(msg, cl.fp, owner); ok {
					// Its own copy: the message is shared by every waiter
					// of the channel, and a result is the caller's to
					// change (see replyBytes).
					r.payload = strings.Clone(r.payload)
					woken = &r
				}
			}
		case <-timer.C:
		case <-ctx.Done():
			return nil, true, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, key, r.n, ctx.Err())
		case <-c.hub.Done():
			return nil, false, ErrClosed
		}
	}
}

// jitter spreads waiters' polls over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// mayHaveRun reports whether a failed script call may still have run on the
// server: its reply was lost, it timed out, or it was cancelled after it was
// sent. It did not run when Redis answered with an error, when no
// connection could be made, or when the call's context ended while it was
// queued for a pipeline.
func mayHaveRun(err error) bool {
	if pipeline.NotSent(err) {
		return false
	}
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
