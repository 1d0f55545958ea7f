// owner.go: running fn under a lease as the key's owner, then recording its
// outcome (complete) or giving the claim back (release).

package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// release gives the claim up if it is still ours, so the next caller can
// take over at once instead of after the lease. unknown says that the
// claim's own reply was lost: it may never have been made, so a failed
// release is no news worth a warning (the claim's error said why).
func (c *Client) release(ctx context.Context, keys []string, token string, unknown bool) {
	dctx := c.bounds.detached(ctx)
	err := c.scripts.run(dctx, releaseScript, keys, []any{token, c.publish}).Err()
	switch {
	case err == nil:
	case unknown:
		c.cfg.logger.LogAttrs(context.Background(), slog.LevelDebug,
			"idem: could not give back a claim whose reply was lost (it may never have been made; if it was, the key stays claimed until the lease ends)",
			c.LogAttrs(c.keyOf(keys[0]), err)...)
	default:
		c.warnRecord("idem: could not release a claim; the key stays claimed until the lease ends", keys[0], err)
	}
}

// giveBack releases a claim that fn never ran under (its outcome was
// unknown, or the caller gave up), without holding the caller past its
// context: the release goes on in the background, bounded by the store
// timeout, and Close waits for it. With the context live, giveBack waits
// for it, so that a caller that returns finds the key released. When too
// many releases are under way already (Redis hangs), the claim is left to
// its lease, which ends it as surely.
//
// When the claim's call left a pipeline under way (cause, the claim's
// error; see inFlightError), the release waits for that pipeline to be
// over: released first, the claim could land after, and hold the key for
// a lease with nobody to run fn.
func (c *Client) giveBack(ctx context.Context, keys []string, token string, cause error) {
	unknown := cause != nil && !errors.Is(cause, ErrNotReplicated) // a claim not replicated was made
	if c.releasing.Add(1) > maxBackgroundReleases {
		c.releasing.Add(-1)
		if unknown {
			c.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "idem: too many releases under way; the claim, if it was made, stays until the lease ends",
				c.LogAttrs(c.keyOf(keys[0]), nil)...)
		} else {
			c.warnRecord("idem: too many releases under way; the key stays claimed until the lease ends", keys[0], nil)
		}
		return
	}
	done := make(chan struct{})
	sent := inFlight(cause)
	c.bg.Add()
	go func() {
		defer c.bg.Done()
		defer c.releasing.Add(-1)
		defer close(done)
		if sent != nil {
			<-sent
		}
		c.release(ctx, keys, token, unknown)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// maxBackgroundReleases bounds the releases under way at once in a Client.
const maxBackgroundReleases = 1024

// complete records an outcome, a record built by finishedRecord, with
// compare-and-set on the claim (claimed, built by claimRecord), retrying
// with a detached context until the store timeout. It never releases: fn
// has acted.
func (c *Client) complete(ctx context.Context, keys []string, claimed, record []byte) error {
	dctx := c.bounds.detached(ctx)
	var lastErr error
	for try, pause := 0, 20*time.Millisecond; ; try++ {
		n, err := c.completeScript(dctx, keys, claimed, record).Int64()
		switch {
		case err == nil && n == 1:
			return nil
		case err == nil:
			return ErrLeaseLost
		case errors.Is(err, ErrNotReplicated):
			// Stored on the primary; retrying cannot make it more durable
			// than WAIT just did.
			return fmt.Errorf("%w: %w", ErrNotRecorded, err)
		}
		// Keep the server's word over the deadline's: an OOM is the cause
		// worth naming, even when the last try was cut by the timeout.
		if lastErr == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			lastErr = err
		}
		t := time.NewTimer(pause)
		select {
		case <-dctx.Done():
			t.Stop()
			return fmt.Errorf("%w: after %d tries: %w", ErrNotRecorded, try+1, lastErr)
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// own runs fn as the owner of attempt n, claimed with fingerprint digest fp
// by the caller's token, with the record claimed (see claimRecord), and
// records its outcome. deadline (mono) is the owner's lease deadline, the
// earliest moment the server may let another caller take over, less the
// margin (see lease in wait.go): fn's context ends then unless a renewal
// moves it. retry tells in-process followers (see flights) that this
// outcome is not theirs to share: they should try the key themselves.
//
// Model: steps Complete and Release (the owner's side) of process Caller
// in model/idem.pml; the lease while fn runs is renewLoop's.
func (c *Client) own(ctx context.Context, key string, keys []string, fp, token string, claimed []byte, n int64, deadline int64, fn func(context.Context) ([]byte, error)) (res []byte, err error, retry bool) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// fn's context and its lease's renewal, in one allocation.
	o := &struct {
		ctx   attemptCtx
		lease renewal
	}{ctx: attemptCtx{Context: cctx, a: Attempt{Key: key, Number: n}, cancel: cancel}}
	fctx := &o.ctx
	fctx.deadline.Store(deadline)
	fctx.steps.init(c, key, keys[0], token, n)
	var p *Pending
	if c.cfg.ledger != nil {
		p = &Pending{key: key, fp: fp, n: n, maxResult: c.cfg.maxResultSize, ledger: c.cfg.ledger}
		fctx.pending = p
	}
	o.lease = renewal{ctx: fctx, keys: keys[:1], token: token,
		due: monoBase.Add(time.Duration(deadline) - 2*c.renewals.every)}
	c.renewals.start(&o.lease)

	returned := false
	defer func() {
		if !returned {
			// fn panicked (the panic goes on to the caller) or called
			// runtime.Goexit (t.FailNow does): stop renewing, give the
			// claim back, and let either go on.
			fctx.steps.end()
			c.renewals.stop(&o.lease)
			if p != nil {
				p.close() // a commit left behind gets ErrNoLedger
			}
			c.observeRelease(fctx, key)
			c.release(ctx, keys, token, false)
		}
	}()
	var (
		recorded *Entry // the outcome the ledger holds, if it decided
		lerr     error  // the ledger's lookup failed
	)
	if p != nil && (n > 1 || c.cfg.ledgerLookups) {
		// A takeover: an earlier attempt may have committed.
		recorded, lerr = c.lookup(fctx, key)
	}
	if recorded == nil && lerr == nil {
		res, err = fn(fctx)
	}
	returned = true
	fctx.steps.end()
	c.renewals.stop(&o.lease)
	if p != nil {
		e, mine, v, undecided := p.close()
		if e != nil {
			res, err, retry = c.finishFromLedger(ctx, key, keys, fp, token, claimed, n, e, mine, err)
			if ferr, ok := v.(error); ok && mine && e.Failed {
				err = ferr // the owner's own error, as without a ledger
			}
			return res, err, retry
		}
		if undecided && err == nil {
			// fn tried to commit and did not, yet returned success: storing
			// its result in Redis would record an outcome the ledger lacks.
			// Transient: the next attempt's lookup tells whether the
			// commit landed after all.
			err = fmt.Errorf("idem: key %q: fn returned success, but its ledger commit did not complete: nothing is recorded, and the next call looks the ledger up", key)
		}
	}
	switch {
	case lerr != nil:
		c.observeRelease(fctx, key)
		c.release(ctx, keys, token, false)
		return nil, lerr, true
	case recorded != nil:
		return c.finishFromLedger(ctx, key, keys, fp, token, claimed, n, recorded, false, nil)
	}

	if err != nil && !IsPermanent(err) {
		c.observeRelease(fctx, key)
		c.release(ctx, keys, token, false)
		return nil, err, true
	}
	var record []byte
	var free func()
	switch {
	case err != nil:
		record, free = finishedRecord('f', fp, token, n, failurePayload(err, c.cfg.maxResultSize))
	case len(res) > c.cfg.maxResultSize:
		err = tooLarge(len(res), c.cfg.maxResultSize)
		res = nil
		record, free = finishedRecord('f', fp, token, n, failurePayload(err, c.cfg.maxResultSize))
	default:
		record, free = finishedRecord('d', fp, token, n, res)
	}
	serr := c.complete(ctx, keys, claimed, record)
	c.observeStored(ctx, key, serr, err)
	free()
	if serr != nil {
		if err != nil {
			return res, errors.Join(serr, err), true
		}
		return res, serr, true
	}
	return res, err, false
}

// lookup reads key's outcome from the ledger, for an owner about to run fn.
func (c *Client) lookup(ctx context.Context, key string) (*Entry, error) {
	e, ok, err := c.cfg.ledger.Lookup(ctx, key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("idem: key %q: ledger lookup (fn did not run): %w", key, err)
	case !ok:
		return nil, nil
	}
	return &e, nil
}

// finishFromLedger finishes the record of attempt n from e, the outcome
// the ledger holds for key (this call's own commit when mine), and
// returns that outcome: the ledger is the truth, whatever fn returned
// (fnErr). When the record cannot be finished, the claim is given back:
// the next caller takes over, finds e in the ledger and finishes it.
func (c *Client) finishFromLedger(ctx context.Context, key string, keys []string, fp, token string, claimed []byte, n int64, e *Entry, mine bool, fnErr error) (res []byte, err error, retry bool) {
	record, free := ledgerRecord(e, token, n)
	serr := c.complete(ctx, keys, claimed, record)
	free()
	if serr != nil && !errors.Is(serr, ErrLeaseLost) {
		c.release(ctx, keys, token, false)
	}
	if mine && !e.Failed && fnErr != nil {
		c.warnKey(ctx, "idem: fn returned an error after its outcome was committed to the ledger; the committed outcome stands", key, fnErr)
	}
	c.observeLedger(ctx, key, mine, e.Failed)
	res, err = ledgerOutcome(key, fp, e)
	return res, err, false
}

// completeScript runs lua/complete.lua once, with the tombstone's
// arguments when the Client leaves tombstones.
func (c *Client) completeScript(ctx context.Context, keys []string, claimed, record []byte) *redis.Cmd {
	if !c.tomb.on {
		return c.write(ctx, completeScript, keys, claimed, record, c.retentionMs, c.publish)
	}
	tkeys := []string{keys[0], keys[1], c.tomb.base(c.cfg.prefix, keys[0])}
	return c.write(ctx, completeScript, tkeys, claimed, record, c.retentionMs, c.publish,
		tombstoneField(keys[0]), c.tomb.span, c.tomb.window)
}
