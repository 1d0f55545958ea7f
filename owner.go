// owner.go: running fn under a lease as the key's owner, then recording its
// outcome (complete) or giving the claim back (release).

package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// release gives the claim up if it is still ours, so the next caller can
// take over at once instead of after the lease.
func (c *Client) release(ctx context.Context, keys []string, token string) {
	dctx := c.bounds.detached(ctx)
	err := releaseScript.Run(dctx, c.rdb, keys, token, c.publish).Err()
	if err != nil {
		c.cfg.logger.Warn("idem: could not release a claim; the key stays claimed until the lease ends",
			"record", keys[0], "error", err)
	}
}

// complete records an outcome, a record built by finishedRecord, with
// compare-and-set on the claim (claimed, built by claimRecord), retrying
// with a detached context until the store timeout. It never releases: fn
// has acted.
func (c *Client) complete(ctx context.Context, keys []string, claimed, record []byte) error {
	dctx := c.bounds.detached(ctx)
	var lastErr error
	for try, pause := 0, 20*time.Millisecond; ; try++ {
		n, err := c.write(dctx, completeScript, keys, claimed, record, c.retentionMs, c.publish).Int64()
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
		lastErr = err
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
// by a request sent at sent that wrote the record claimed (see
// claimRecord), and records its outcome. retry tells in-process followers
// (see flights) that this outcome is not theirs to share: they should try
// the key themselves.
func (c *Client) own(ctx context.Context, key string, keys []string, fp, token string, claimed []byte, n int64, sent time.Time, fn func(context.Context) ([]byte, error)) (res []byte, err error, retry bool) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// fn's context and its lease's renewal, in one allocation.
	o := &struct {
		ctx   attemptCtx
		lease renewal
	}{ctx: attemptCtx{Context: cctx, a: Attempt{Key: key, Number: n}}}
	fctx := &o.ctx
	o.lease = renewal{ctx: fctx, cancel: cancel, keys: keys[:1], token: token, claimed: sent}
	c.renewals.start(&o.lease)

	var panicked bool
	var pv any
	func() {
		defer func() {
			if p := recover(); p != nil {
				panicked, pv = true, p
			}
		}()
		res, err = fn(fctx)
	}()
	c.renewals.stop(&o.lease)

	if panicked {
		c.release(ctx, keys, token)
		panic(pv)
	}
	if err != nil && !IsPermanent(err) {
		c.release(ctx, keys, token)
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
	free()
	if serr != nil {
		if err != nil {
			return res, errors.Join(serr, err), true
		}
		return res, serr, true
	}
	return res, err, false
}
