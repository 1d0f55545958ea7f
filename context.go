// context.go: the contexts of a call: fn's (with its Attempt) and the
// detached ones that bound recording and releasing.

package idem

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// bounds hands out the contexts of work that must go on after its caller
// gave up, recording an outcome or releasing a claim, for at least d and
// at most d + d/16. Every call needs such a bound, and a context of its own
// (context.WithTimeout) would cost each call a timer; the calls of one
// sixteenth of d share one deadline instead.
type bounds struct {
	d   time.Duration
	cur atomic.Pointer[bound]
	mu  sync.Mutex // serialises making a new bound
}

type bound struct {
	ctx    context.Context // ends at at
	at     time.Time
	cancel context.CancelFunc // kept for vet; the deadline ends ctx
}

// detached returns a context that carries ctx's values but not its
// cancellation, and ends between b.d and b.d + b.d/16 from now.
func (b *bounds) detached(ctx context.Context) context.Context {
	return &detachedCtx{Context: b.get(), values: ctx}
}

func (b *bounds) get() context.Context {
	now := time.Now()
	least := now.Add(b.d)
	if p := b.cur.Load(); p != nil && !p.at.Before(least) {
		return p.ctx
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.cur.Load(); p != nil && !p.at.Before(least) {
		return p.ctx
	}
	at := least.Add(b.d / 16)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	b.cur.Store(&bound{ctx: ctx, at: at, cancel: cancel})
	return ctx
}

// detachedCtx is a shared bound (the embedded Context: Deadline, Done, Err)
// with the values of a caller's context.
type detachedCtx struct {
	context.Context
	values context.Context
}

// Value looks in the bound first: it holds no values of its own, only the
// context package's marker of its cancellation, which lets contexts derived
// from this one, and context.Cause, find it.
func (c *detachedCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// attemptCtx is the context of fn: cancelled when the lease is lost (the
// embedded Context, from context.WithCancelCause), carrying the Attempt.
// It also ends at the owner's lease deadline (see own): Err looks at the
// clock, so an fn that checks its context never acts past the deadline,
// even before the renewer's timer has closed Done.
type attemptCtx struct {
	context.Context
	a       Attempt
	cancel  context.CancelCauseFunc
	pending *pending // the call's hold for Commit; nil without a ledger
	call    *call    // the call that owns the key
	// deadline is the owner's lease deadline, in monotonic nanoseconds
	// (mono); renewals move it later.
	deadline atomic.Int64
	// steps is the state of Step in this attempt, made by the first step
	// (stepsOf): a call without steps pays nothing for it.
	steps atomic.Pointer[steps]
	// returned is set once fn returned (or panicked): later steps are
	// refused.
	returned atomic.Bool
}

// stepsOf returns the steps of this attempt, made on first use.
func (c *attemptCtx) stepsOf() *steps {
	if s := c.steps.Load(); s != nil {
		return s
	}
	cl := c.call
	s := &steps{c: cl.c, key: cl.key, keys: cl.claimKeys, token: cl.token, n: cl.n, p: c.pending, returned: &c.returned}
	if !c.steps.CompareAndSwap(nil, s) {
		return c.steps.Load() // a concurrent step made them first
	}
	return s
}

// endSteps notes that fn returned, and returns the attempt's steps, nil
// when fn called none.
func (c *attemptCtx) endSteps() *steps {
	c.returned.Store(true)
	return c.steps.Load()
}

// Value returns a *Attempt for attemptKey and a *steps for stepsKey
// (made on first use): pointers, which cost no allocation as interface
// values would; and
// the call's *pending for pendingKey, nil (a typed nil, so pendingFrom
// tells "no ledger" from "outside Do") without a ledger.
func (c *attemptCtx) Value(key any) any {
	switch key.(type) {
	case attemptKey:
		return &c.a
	case stepsKey:
		return c.stepsOf()
	case pendingKey:
		return c.pending
	}
	return c.Context.Value(key)
}

// Err is the embedded context's, or, once the lease deadline has passed,
// context.Canceled with cause errLeaseEnded.
func (c *attemptCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if mono() >= c.deadline.Load() {
		c.cancel(errLeaseEnded)
		return c.Context.Err()
	}
	return nil
}

// errLeaseEnded is the cause of fn's context when the owner's lease
// deadline passed without a renewal that moved it.
var errLeaseEnded = fmt.Errorf("%w: the lease ended before a renewal succeeded", ErrLeaseLost)

// monoBase anchors mono: time.Since reads the monotonic clock, which wall
// clock changes do not move.
var monoBase = time.Now()

// mono returns the monotonic clock's time, in nanoseconds since monoBase.
func mono() int64 { return int64(time.Since(monoBase)) }
