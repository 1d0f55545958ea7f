// owner.go: running fn under a lease as the key's owner, then recording its
// outcome (complete) or giving the claim back (release, giveBack).

package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

// owning is what a call holds while it owns the key, in one allocation:
// fn's context, its lease's renewal, and what the ledger said before fn
// (see run).
type owning struct {
	fctx     attemptCtx
	lease    renewal
	recorded decision // the outcome the ledger holds, if it decided
	lerr     error    // the ledger's lookup failed
}

// own runs fn as the owner of attempt cl.n and records its outcome.
// deadline (mono) is the owner's lease deadline, the earliest moment the
// server may let another caller take over, less the margin: fn's context
// ends then unless a renewal moves it. retry tells in-process followers
// (see flights) that this outcome is not theirs to share: they should try
// the key themselves.
//
// Model: steps Complete and Release (the owner's side) of process Caller
// in model/idem.pml; the lease while fn runs is renewLoop's.
func (cl *call) own(ctx context.Context, deadline int64) (res []byte, retry bool, err error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	o := cl.prepare(cctx, cancel, deadline)
	res, err = cl.run(ctx, o)
	return cl.finish(ctx, o, res, err)
}

// prepare readies the call to own the key until deadline: fn's context on
// cctx, the hold for Commit with a ledger, and the lease's renewals,
// started (the steps are made by the first, see attemptCtx.stepsOf).
func (cl *call) prepare(cctx context.Context, cancel context.CancelCauseFunc, deadline int64) *owning {
	c := cl.c
	o := &owning{fctx: attemptCtx{Context: cctx, a: Attempt{Key: cl.key, Number: cl.n}, cancel: cancel, call: cl}}
	fctx := &o.fctx
	fctx.deadline.Store(deadline)
	var p *pending
	if c.cfg.ledger != nil {
		p = &pending{key: cl.key, fp: cl.fp, n: cl.n, maxResult: c.cfg.maxResultSize, ledger: c.cfg.ledger}
		fctx.pending = p
	}
	o.lease = renewal{ctx: fctx, due: monoBase.Add(time.Duration(deadline) - 2*c.renewals.every)}
	c.renewals.start(&o.lease)
	return o
}

// run looks the ledger up when an earlier attempt may have committed (or
// WithLedgerLookups asks), runs fn unless the ledger decided or failed,
// and stops the steps and the renewals. When fn panics or calls
// runtime.Goexit, run gives the claim back on its way out.
func (cl *call) run(ctx context.Context, o *owning) (res []byte, err error) {
	c, fctx, p := cl.c, &o.fctx, o.fctx.pending
	returned := false
	defer func() {
		if !returned {
			// fn panicked (the panic goes on to the caller) or called
			// runtime.Goexit (t.FailNow does): stop renewing, give the
			// claim back, and let either go on.
			cl.observeReconciled(fctx.endSteps())
			c.renewals.stop(&o.lease)
			if p != nil {
				p.close() // a commit left behind gets ErrNoLedger
			}
			cl.observeRelease(fctx)
			cl.release(ctx, false)
		}
	}()
	if p != nil && (cl.n > 1 || c.cfg.ledgerLookups) {
		// A takeover: an earlier attempt may have committed.
		o.recorded, o.lerr = cl.lookup(fctx)
		if o.recorded.e == nil && o.lerr == nil {
			o.lerr = cl.leftAfterLookup(fctx)
		}
	}
	if o.recorded.e == nil && o.lerr == nil {
		res, err = cl.fn(fctx)
	}
	returned = true
	cl.observeReconciled(fctx.endSteps())
	c.renewals.stop(&o.lease)
	return res, err
}

// finish ends the attempt after run: with the outcome fn committed to the
// ledger, or the one the ledger held before fn; with the claim given back
// when nothing is to be recorded (a checked step is parked, the lookup
// failed, or fn failed transiently); or by recording fn's outcome in
// Redis (store).
func (cl *call) finish(ctx context.Context, o *owning, res []byte, err error) ([]byte, bool, error) {
	fctx, p := &o.fctx, o.fctx.pending
	if p != nil {
		d, undecided := p.close()
		if d.e != nil {
			return cl.finishCommitted(ctx, fctx, d, err)
		}
		if undecided && err == nil {
			// fn tried to commit and did not, yet returned success: storing
			// its result in Redis would record an outcome the ledger lacks.
			// Transient: the next attempt's lookup tells whether the
			// commit landed after all.
			err = fmt.Errorf("idem: key %q: fn returned success, but its ledger commit did not complete: nothing is recorded, and the next call looks the ledger up", cl.key)
		}
	}
	if perr := fctx.steps.Load().parkedErr(); perr != nil && o.recorded.e == nil {
		// A checked step is parked: the attempt ends unfinished, for an
		// operator, whatever fn made of the step's error (returned it,
		// wrapped it, or swallowed it and returned success).
		if err != nil && !errors.Is(err, ErrUnknownOutcome) {
			perr = errors.Join(perr, err)
		}
		cl.observeParked()
		cl.release(ctx, false)
		return nil, true, perr
	}
	switch {
	case o.lerr != nil:
		cl.observeRelease(fctx)
		cl.release(ctx, false)
		return nil, true, o.lerr
	case o.recorded.e != nil:
		return cl.finishFromLedger(ctx, o.recorded, nil)
	case err != nil && !IsPermanent(err):
		cl.observeRelease(fctx)
		cl.release(ctx, false)
		if cl.op != nil && cl.op.parked {
			cl.observeParked() // by WithMaxRecoveries
		}
		return nil, true, err
	}
	return cl.store(ctx, res, err)
}

// finishCommitted finishes the call from d, the outcome its attempt's
// Commit decided: the ledger's, with the owner's own error when it failed,
// and the steps that did not finish after the commit joined to it.
func (cl *call) finishCommitted(ctx context.Context, fctx *attemptCtx, d decision, fnErr error) (res []byte, retry bool, err error) {
	res, retry, err = cl.finishFromLedger(ctx, d, fnErr)
	if ferr, ok := d.v.(error); ok && d.mine && d.e.Failed {
		err = ferr // the owner's own error, as without a ledger
	}
	if serr := fctx.steps.Load().afterCommitErr(); serr != nil && d.mine {
		// Nothing silently lost: the outcome stands, and the owner
		// learns which steps never ran or finished. Followers in
		// this process claim for themselves and get the outcome.
		err, retry = errors.Join(err, fmt.Errorf("idem: key %q: the outcome is committed and stands, but: %w", cl.key, serr)), true
	}
	return res, retry, err
}

// store records fn's outcome in Redis: res, or err, a permanent failure
// (a result over the size limit is one too).
func (cl *call) store(ctx context.Context, res []byte, err error) ([]byte, bool, error) {
	c := cl.c
	var record []byte
	var free func()
	switch {
	case err != nil:
		record, free = finishedRecord(recordFailed, cl.fp, cl.token, cl.n, failurePayload(err, c.cfg.maxResultSize))
	case len(res) > c.cfg.maxResultSize:
		err = tooLarge(len(res), c.cfg.maxResultSize)
		res = nil
		record, free = finishedRecord(recordFailed, cl.fp, cl.token, cl.n, failurePayload(err, c.cfg.maxResultSize))
	default:
		record, free = finishedRecord(recordDone, cl.fp, cl.token, cl.n, res)
	}
	serr := cl.complete(ctx, record, free, c.retentionMs)
	cl.observeStored(serr, err)
	if serr != nil {
		if err != nil {
			return res, true, errors.Join(serr, err)
		}
		return res, true, serr
	}
	return res, false, err
}

// lookup reads the call's outcome from the ledger, for an owner about to
// run fn.
func (cl *call) lookup(ctx context.Context) (decision, error) {
	start := mono()
	e, ok, err := cl.c.cfg.ledger.Lookup(ctx, cl.key)
	switch {
	case err != nil:
		return decision{}, fmt.Errorf("idem: key %q: ledger lookup (fn did not run): %w", cl.key, err)
	case !ok:
		return decision{}, nil
	}
	if err := checkEntry(cl.key, &e); err != nil {
		return decision{}, fmt.Errorf("%w (fn did not run)", err)
	}
	return decision{e: &e, since: start}, nil
}

// leftAfterLookup tells why fn must not start after a ledger lookup that
// found nothing: the lookup took so long that the lease ended, or has
// less left than fn may start on (the renewals failed meanwhile), or the
// caller gave up.
func (cl *call) leftAfterLookup(fctx *attemptCtx) error {
	if err := fctx.Err(); err != nil {
		return fmt.Errorf("idem: key %q: after the ledger lookup (fn did not run): %w", cl.key, causeOf(fctx, err))
	}
	if left := time.Duration(fctx.deadline.Load() - mono()); left < cl.c.renewals.every {
		return fmt.Errorf("%w: key %q: %v of the lease left after the ledger lookup (fn did not run)", ErrLeaseLost, cl.key, left.Round(time.Millisecond))
	}
	return nil
}

// finishFromLedger finishes the record of the call's attempt from d, the
// outcome the ledger holds for its key (this call's own commit when
// d.mine), and returns that outcome: the ledger is the truth, whatever fn
// returned (fnErr). The record expires when the ledger's row is the
// retention old (ledgerTTL). When the record cannot be finished, the claim
// is given back: the next caller takes over, finds the row in the ledger
// and finishes it.
func (cl *call) finishFromLedger(ctx context.Context, d decision, fnErr error) (res []byte, retry bool, err error) {
	e, mine := d.e, d.mine
	record, free := ledgerRecord(e, cl.token, cl.n)
	ttl := ledgerTTL(cl.c.cfg.retention, e, d.since).Milliseconds()
	serr := cl.complete(ctx, record, free, ttl)
	if serr != nil && !errors.Is(serr, ErrLeaseLost) {
		cl.release(ctx, false)
	}
	if mine && !e.Failed && fnErr != nil {
		cl.c.warnKey(ctx, "idem: fn returned an error after its outcome was committed to the ledger; the committed outcome stands", cl.key, fnErr)
	}
	cl.observeLedger(mine, e.Failed, conflicts(cl.fp, e.FingerprintDigest), e.Age)
	res, err = ledgerOutcome(cl.key, cl.fp, e)
	return res, false, err
}

// complete records an outcome, a record built by finishedRecord, with
// compare-and-set on the call's claim, retrying with a detached context
// until the store timeout. It never releases: fn has acted. Then it frees
// the record's buffer (free, from finishedRecord), unless a try left a
// pipeline under way that may still send the record (see
// pipeline.InFlight): that buffer is left to the garbage collector, for
// another record written into it would be sent as this one.
func (cl *call) complete(ctx context.Context, record []byte, free func(), ttlMs any) error {
	c := cl.c
	dctx := c.bounds.detached(ctx)
	sending := false // a pipeline under way may still send record
	defer func() {
		if !sending {
			free()
		}
	}()
	var lastErr error
	var plain []any // filled once: a pipeline under way may still read it
	for try, pause := 0, 20*time.Millisecond; ; try++ {
		n, err := cl.completeScript(dctx, record, ttlMs, &plain).Int64()
		if pipeline.InFlight(err) != nil {
			sending = true
		}
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

// release gives the call's claim up if it is still its own, so the next
// caller can take over at once instead of after the lease. unknown says
// that the claim's own reply was lost: it may never have been made, so a
// failed release is no news worth a warning (the claim's error said why).
func (cl *call) release(ctx context.Context, unknown bool) {
	c := cl.c
	dctx := c.bounds.detached(ctx)
	var cmd *redis.Cmd
	if cl.op != nil {
		// A registered operation's release indexes it as due, or parks
		// it (see lua/release.lua).
		rk := cl.keys[0]
		ks := []string{rk, cl.keys[1], rk + stepsSuffix, rk + inputSuffix, c.pendingKey(rk)}
		cmd = c.scripts.Run(dctx, releaseScript, ks, cl.token, c.publish, cl.key, c.recoverMs, c.maxRecoveries)
		if n, _ := cmd.Int64(); n == 2 {
			cl.op.parked = true
		}
	} else {
		cmd = c.scripts.Run(dctx, releaseScript, cl.keys, cl.token, c.publish)
	}
	err := cmd.Err()
	switch {
	case err == nil:
	case unknown:
		c.cfg.logger.LogAttrs(ctx, slog.LevelDebug,
			"idem: could not give back a claim whose reply was lost (it may never have been made; if it was, the key stays claimed until the lease ends)",
			c.LogAttrs(cl.key, err)...)
	default:
		c.warnKey(ctx, "idem: could not release a claim; the key stays claimed until the lease ends", cl.key, err)
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
// When the claim's script may still run (cause, the claim's error, left
// its pipeline under way: see pipeline.InFlight), the release waits for
// that pipeline to be over: released first, the claim could land after,
// and hold the key for a lease with nobody to run fn.
func (cl *call) giveBack(ctx context.Context, cause error) {
	c := cl.c
	unknown := cause != nil && !errors.Is(cause, ErrNotReplicated) // a claim not replicated was made
	if c.releasing.Add(1) > maxBackgroundReleases {
		c.releasing.Add(-1)
		if unknown {
			c.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "idem: too many releases under way; the claim, if it was made, stays until the lease ends",
				c.LogAttrs(cl.key, nil)...)
		} else {
			c.warnKey(ctx, "idem: too many releases under way; the key stays claimed until the lease ends", cl.key, nil)
		}
		return
	}
	released := make(chan struct{})
	sent := pipeline.InFlight(cause)
	c.bg.Add()
	go func() {
		defer c.bg.Done()
		defer c.releasing.Add(-1)
		defer close(released)
		if sent != nil {
			<-sent
		}
		cl.release(ctx, unknown)
	}()
	select {
	case <-released:
	case <-ctx.Done():
	}
}

// maxBackgroundReleases bounds the releases under way at once in a Client.
const maxBackgroundReleases = 1024

// completeScript runs lua/complete.lua once for the call's claim, the
// record to live ttlMs (milliseconds, boxed), with the tombstone's
// arguments when the Client leaves tombstones. Without them, and without an
// operation, the command is *plain, made on the first try (see
// completeArgs) and sent as it is on every other.
func (cl *call) completeScript(ctx context.Context, record []byte, ttlMs any, plain *[]any) *redis.Cmd {
	c, keys := cl.c, cl.keys
	if cl.op != nil {
		ks := []string{keys[0], keys[1]}
		var tf, span, window any = "", "", ""
		if c.tomb.on {
			ks = append(ks, c.tomb.base(c.cfg.prefix, keys[0]))
			tf, span, window = tombstoneField(keys[0]), c.tomb.span, c.tomb.window
		}
		ks = append(ks, keys[0]+inputSuffix, c.pendingKey(keys[0]))
		return c.write(ctx, completeScript, ks, cl.claimed, record, ttlMs, c.publish, tf, span, window, "1", cl.key)
	}
	if !c.tomb.on {
		if *plain == nil {
			*plain = cl.completeArgs(record, ttlMs)
		}
		return c.writeArgs(ctx, completeScript, keys, *plain)
	}
	tkeys := []string{keys[0], keys[1], c.tomb.base(c.cfg.prefix, keys[0])}
	return c.write(ctx, completeScript, tkeys, cl.claimed, record, ttlMs, c.publish,
		tombstoneField(keys[0]), c.tomb.span, c.tomb.window)
}

// completeArgs returns complete.lua's command (see pipeline.RunArgs) for
// the call's claim and record, without tombstones or an operation: in the
// call's completeCmd the first time, which no command then changes (a
// pipeline may read it after the call gave up on it), else in a new slice.
func (cl *call) completeArgs(record []byte, ttlMs any) []any {
	a := cl.completeCmd[:]
	if cl.completeUsed {
		a = make([]any, len(cl.completeCmd))
	}
	cl.completeUsed = true
	// The record's key, boxed once for the claim (claimKeys[0] is keys[0]).
	a[2], a[3], a[4] = 2, cl.claimCmd[3], cl.keys[1]
	a[5], a[6], a[7], a[8] = cl.claimed, record, ttlMs, cl.c.publish
	return a
}
