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
	cl.keys, cl.claimKeys = c.callKeys(key, &cl.keySet)
	cl.token = newToken()
	first := c.claimRecord(cl.fp, cl.token, 1) // what a claim of a new key writes
	cl.claimCmd = [8]any{2: len(cl.claimKeys), 3: cl.claimKeys[0], 4: cl.claimKeys[1], 5: first, 6: c.retentionMs, 7: c.ages}
	wt := waiting{pause: c.firstPoll}
	defer wt.stop()
	for {
		sent := mono()
		var r claimReply
		var err error
		if wt.woken != nil {
			// The owner's notification carried its outcome: the record
			// holds it as a claim would find it.
			r, wt.woken = *wt.woken, nil
		} else {
			r, err = cl.claimOnce(ctx)
		}
		if err != nil {
			retry, err := cl.claimFailed(ctx, wt.seen, err)
			return nil, retry, err
		}
		cl.observeClaim(r.kind, r.n, r.age)
		switch r.kind {
		case replyClaimed:
			if wt.seen > 0 && r.n == 1 {
				cl.giveBack(ctx, nil)
				return nil, false, fmt.Errorf("%w: key %q: attempt %d was in progress; is the retention shorter than the operation?", ErrExpired, key, wt.seen)
			}
			deadline, owned, err := cl.leaseFor(ctx, r, sent)
			if err != nil {
				return nil, true, err
			}
			if !owned {
				// Another caller took the key over meanwhile (or the
				// record is gone): wait for it like any duplicate.
				wt.seen = r.n
				continue
			}
			wt.unwatch()
			cl.n, cl.claimed = r.n, cl.claimCmd[5] // first, boxed once
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
		case replyParked:
			if r.payload == "" {
				// Parked by its recoveries (WithMaxRecoveries): Retry.
				if cl.notes != nil && cl.op != nil && cl.op.recovery {
					cl.notes.outcome = EventParked // this recovery's claim parked it
				}
				return nil, false, fmt.Errorf("%w: key %q: parked after attempt %d, as WithMaxRecoveries recoveries did not finish it; fn does not run (Retry runs it again)", ErrParked, key, r.n)
			}
			// fn does not run: the parked step is settled by an operator.
			return nil, false, &parkedError{key: key, name: r.payload,
				why: fmt.Sprintf("parked after attempt %d; fn does not run", r.n)}
		case replyGone:
			return nil, false, errNothingToRecover
		}
		// replyBusy: another owner holds a live lease.
		if retry, err := cl.await(ctx, &wt, r); err != nil {
			return nil, retry, err
		}
	}
}

// waiting is the claim loop's state while other owners hold the key.
type waiting struct {
	w     *notify.Watcher
	seen  int64         // the attempt number last seen in progress
	owner string        // the token of its owner
	woken *claimReply   // an outcome that the owner's notification carried
	pause time.Duration // the next poll's, before jitter
	timer *time.Timer
}

// unwatch stops listening to the key's channel.
func (wt *waiting) unwatch() {
	if wt.w != nil {
		wt.w.Stop()
		wt.w = nil
	}
}

// stop stops listening and polling.
func (wt *waiting) stop() {
	wt.unwatch()
	if wt.timer != nil {
		wt.timer.Stop()
	}
}

// claimFailed gives back a claim whose script call failed (err) but may
// have run, and returns the call's error: ErrInProgress when the caller
// gave up waiting for attempt seen, else the claim's.
func (cl *call) claimFailed(ctx context.Context, seen int64, err error) (retry bool, _ error) {
	if mayHaveRun(err) || errors.Is(err, ErrNotReplicated) {
		// The claim may have happened with its reply lost: give it
		// back if it is ours. fn does not run.
		cl.giveBack(ctx, err)
	}
	if seen > 0 && ctx.Err() != nil {
		return true, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, cl.key, seen, ctx.Err())
	}
	return ctx.Err() != nil, claimError(ctx, cl.key, err)
}

// leaseFor returns the owner's lease deadline (mono) for r, a claim sent
// at sent, renewing first when too little of it is left to start fn on.
// owned is false when a renewal found the key taken over meanwhile. On an
// error the claim is given back (or left to its lease) and fn does not run.
func (cl *call) leaseFor(ctx context.Context, r claimReply, sent int64) (deadline int64, owned bool, err error) {
	c := cl.c
	if err := ctx.Err(); err != nil {
		// The caller gave up while the claim was under way (go-redis
		// applies a context's deadline to reads only with
		// ContextTimeoutEnabled): give the claim back; fn does not
		// start.
		cl.giveBack(ctx, nil)
		return 0, false, fmt.Errorf("idem: claim key %q: %w", cl.key, err)
	}
	// The server granted the lease after the claim was sent: for
	// the owner, it ends no later than sent + the lease left.
	deadline = sent + int64(r.leaseLeft-c.margin)
	if deadline-mono() >= int64(c.renewals.every) {
		return deadline, true, nil
	}
	// Too little left to start fn on (a slow reply, or a repeat
	// of a claim whose reply was lost): renew first.
	renewed, at, err := cl.renew(ctx)
	if err == nil && !renewed {
		return 0, false, nil
	}
	if renewed {
		deadline = at + int64(c.cfg.lease-c.margin)
	}
	if left := time.Duration(deadline - mono()); err != nil || left < c.renewals.every {
		cl.giveBack(ctx, nil)
		if err == nil {
			err = fmt.Errorf("only %v left after a renewal", left)
		}
		return 0, false, fmt.Errorf("%w: key %q: the claim came back with %v of its lease left, and renewing it failed (fn did not run): %w",
			ErrLeaseLost, cl.key, r.leaseLeft, err)
	}
	return deadline, true, nil
}

// await waits, after a claim found the key busy (r), to be told of its
// owner's outcome or to poll again, within the caller's wait. A non-nil
// error ends the call (retry as for claim).
func (cl *call) await(ctx context.Context, wt *waiting, r claimReply) (retry bool, _ error) {
	c := cl.c
	wt.seen, wt.owner = r.n, r.owner
	now := time.Now()
	if c.cfg.wait <= 0 || !now.Before(cl.until) {
		// Followers with budgets of their own try again themselves.
		return true, fmt.Errorf("%w: key %q, attempt %d", ErrInProgress, cl.key, r.n)
	}
	if wt.w == nil {
		wt.w = c.hub.Watch(cl.keys[1])
	}
	d := min(jitter(wt.pause), r.leaseLeft, cl.until.Sub(now))
	wt.pause = min(2*wt.pause, c.cfg.pollInterval)
	if wt.timer == nil {
		wt.timer = time.NewTimer(d)
	} else {
		wt.timer.Reset(d)
	}
	select {
	case <-wt.w.C():
		if msg, ok := wt.w.Note(); ok {
			if r, ok := notified(msg, cl.fp, wt.owner); ok {
				// Its own copy: the message is shared by every waiter
				// of the channel, and a result is the caller's to
				// change (see replyBytes).
				r.payload = strings.Clone(r.payload)
				wt.woken = &r
			}
		}
	case <-wt.timer.C:
	case <-ctx.Done():
		return true, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, cl.key, r.n, ctx.Err())
	case <-c.hub.Done():
		return false, ErrClosed
	}
	return false, nil
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
