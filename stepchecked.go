// stepchecked.go: StepChecked, a step whose effect lives with a provider
// that has no idempotency key: an intent is stored before it acts, and a
// lost answer is settled by asking the provider (check), never by sending
// again blind; what cannot be settled is parked for an operator (Resolve,
// ResolveNotApplied). lua/stepcheck.lua holds the states.

package idem

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/idem-go/idem/internal/codec"
)

// Check is what a checked step's check learned from the provider about
// the step's effect (see StepChecked).
type Check int

// The answers of a check.
const (
	// CheckUnknown: the provider cannot tell yet (no answer, an error, a
	// charge still pending).
	CheckUnknown Check = iota
	// CheckApplied: the effect happened; check's value is the step's.
	CheckApplied
	// CheckNotApplied: the effect did not happen, and will not (the
	// provider will not apply a request it received late). It counts only
	// once SettleAfter has passed since the step's intent.
	CheckNotApplied
)

// String returns the answer's name.
func (c Check) String() string {
	switch c {
	case CheckUnknown:
		return "unknown"
	case CheckApplied:
		return "applied"
	case CheckNotApplied:
		return "not applied"
	}
	return "Check(" + strconv.Itoa(int(c)) + ")"
}

// A StepOption configures one StepChecked call.
type StepOption func(*checkedConfig)

type checkedConfig struct {
	settle    time.Duration
	reconcile time.Duration
}

// SettleAfter is how long after the step's last possible send a
// CheckNotApplied is believed: before, a request still in flight could
// land, so it counts as CheckUnknown. Use the longest time the provider
// may take to apply a request it received. It counts from when act
// returned Ambiguous, and, in a later attempt, from its first "not
// applied" (the earlier attempt's act may have sent until that attempt's
// lease ended, before this attempt's claim): act must not send once its
// context has ended (net/http does not). The default is 30 seconds.
func SettleAfter(d time.Duration) StepOption {
	return func(c *checkedConfig) { c.settle = d }
}

// ReconcileFor is how long one attempt calls check (with backoff) while
// it answers CheckUnknown or fails, before it parks the operation; it is
// at least SettleAfter. The default is 2 minutes.
func ReconcileFor(d time.Duration) StepOption {
	return func(c *checkedConfig) { c.reconcile = d }
}

// Ambiguous marks err, act's error, as one after which the effect may
// have happened (a timeout after the request was sent, a connection reset
// after the body was written): StepChecked then asks check at once
// instead of returning it. Ambiguous(nil) returns nil.
func Ambiguous(err error) error {
	if err == nil {
		return nil
	}
	return &ambiguousError{err: err}
}

type ambiguousError struct{ err error }

func (e *ambiguousError) Error() string { return "ambiguous: " + e.err.Error() }
func (e *ambiguousError) Unwrap() error { return e.err }

func isAmbiguous(err error) bool {
	var a *ambiguousError
	return errors.As(err, &a)
}

// The operations of lua/stepcheck.lua.
const (
	opBegin   = "begin"
	opRearm   = "rearm"
	opClear   = "clear"
	opPark    = "park"
	opStore   = "store"
	opResolve = "resolve"
)

// The tags of a checked step's field that are not checkpoints.
const (
	stepIntent = 'i'
	stepParked = 'u'
)

// StepChecked is Step for an effect that a provider applies without an
// idempotency key: act sends the request (passing StepKey(ctx, name) as
// its reference), and check asks the provider, by that reference, whether
// the effect happened. Before act runs, the step's intent is stored (one
// round trip, only while the attempt owns the key), so every later
// attempt knows the effect may have happened, and calls check instead of
// act.
//
// act's value is checkpointed as Step does, and an error marked
// Permanent too; another error says the effect did not happen: the
// intent is cleared and the step runs again in the next attempt. An
// error marked Ambiguous starts the reconciliation at once. Reconciling,
// check is called with backoff: CheckApplied checkpoints and returns its
// value; CheckNotApplied lets act run again (same StepKey) once
// SettleAfter has passed since the intent, and counts as CheckUnknown
// before; CheckUnknown or an error for ReconcileFor parks the step:
// StepChecked returns an error matching ErrUnknownOutcome and ErrParked,
// then and in every later attempt, and neither act nor check runs again
// until an operator calls Resolve or ResolveNotApplied. Return that
// error from fn, as any step's. A reconciliation that fn's context ends
// leaves the intent: the next attempt checks again.
//
// The rules of Step apply (names, nesting, the ledger commit, bounds).
// check's value must be act's, and check must tell "not applied" only of
// a request the provider will never apply (see docs/steps.md, "When the
// provider has no key").
func StepChecked[T any](ctx context.Context, name string,
	act func(ctx context.Context) (T, error),
	check func(ctx context.Context) (T, Check, error),
	opts ...StepOption) (T, error) {
	var zero T
	s, err := stepsFor(ctx, name)
	if err != nil {
		return zero, err
	}
	cfg := checkedConfig{settle: 30 * time.Second, reconcile: 2 * time.Minute}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case act == nil || check == nil:
		return zero, fmt.Errorf("idem: step %q: nil act or check", name)
	case cfg.settle < 0 || cfg.reconcile <= 0:
		return zero, fmt.Errorf("idem: step %q: SettleAfter (%v) must not be negative and ReconcileFor (%v) must be positive", name, cfg.settle, cfg.reconcile)
	case cfg.reconcile < cfg.settle:
		return zero, fmt.Errorf("idem: step %q: ReconcileFor (%v) is shorter than SettleAfter (%v): a provider's \"not applied\" could never count", name, cfg.reconcile, cfg.settle)
	}
	rc := codec.For(reflect.TypeFor[T]())
	if err := rc.Err(); err != nil {
		return zero, fmt.Errorf("idem: step %q: %w: %v", name, ErrEncode, err)
	}
	if err := s.reserve(name); err != nil {
		return zero, err
	}
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("idem: step %q not run: %w", name, causeOf(ctx, err))
	}
	if s.committed() {
		return zero, s.afterCommit(fmt.Errorf("%w: step %q did not run: it was called after the operation's outcome was committed to the ledger (key %q)",
			ErrStepAfterCommit, name, s.key))
	}
	r := &checked[T]{s: s, name: name, cfg: cfg, rc: rc, check: check,
		sctx: &stepCtx{Context: ctx, s: s, name: name}}

	found, err := s.begin(ctx, name)
	if err != nil {
		return zero, err
	}
	switch {
	case found == "":
		// The intent is stored: act may run.
	case found[0] == checkpointFailed:
		return zero, readFailure(found[1:])
	case found[0] == checkpointDone:
		var v T
		if err := rc.Decode([]byte(found[1:]), &v); err != nil {
			return zero, fmt.Errorf("%w: key %q, step %q: %s: %v", ErrDecode, s.key, name, rc.Type(), err)
		}
		return v, nil
	case found[0] == stepParked:
		return zero, s.notePark(&parkedError{key: s.key, name: name, why: "parked by an earlier attempt"})
	case found[0] == stepIntent:
		// An earlier attempt may have acted: ask before acting.
		v, again, err := r.reconcile(ctx)
		if !again {
			return v, err
		}
	default:
		return zero, fmt.Errorf("%w: key %q, step %q: unknown checkpoint", ErrCorrupt, s.key, name)
	}
	for {
		// An owner whose lease ended (or that paused past it) leaves act
		// to the next attempt, which checks first: its request would be
		// sent after that attempt began to count the settle time.
		if err := ctx.Err(); err != nil {
			return zero, fmt.Errorf("idem: step %q: act not run (its intent stays: the next attempt checks first): %w", name, causeOf(ctx, err))
		}
		v, err := act(r.sctx)
		if err != nil && s.committed() {
			if IsPermanent(err) && !isAmbiguous(err) {
				err = s.fail(ctx, name, err, stepCheckScript)
			}
			return zero, s.afterCommit(fmt.Errorf("%w: step %q did not finish: it failed after the operation's outcome was committed to the ledger (key %q): %w",
				ErrStepAfterCommit, name, s.key, err))
		}
		switch {
		case err == nil:
			return checkpoint(ctx, s, rc, name, v, stepCheckScript)
		case isAmbiguous(err):
			// act may have sent its request at any moment before it
			// returned: the settle time counts from now, not from the
			// intent stored before act began (a re-sent begin of this
			// owner dates it anew).
			if _, berr := s.begin(ctx, name); berr != nil {
				return zero, fmt.Errorf("idem: step %q: act's outcome is unknown (%v) and its intent could not be dated anew (it stays: the next attempt checks first): %w", name, err, berr)
			}
			v, again, rerr := r.reconcile(ctx)
			if !again && rerr != nil {
				return v, fmt.Errorf("%w (act: %v)", rerr, err)
			}
			if !again {
				return v, nil
			}
		case IsPermanent(err):
			return zero, s.fail(ctx, name, err, stepCheckScript)
		default:
			return zero, errors.Join(err, s.clear(ctx, name))
		}
	}
}

// checked is one StepChecked call's reconciliation.
type checked[T any] struct {
	s     *steps
	name  string
	cfg   checkedConfig
	rc    *codec.Codec
	check func(ctx context.Context) (T, Check, error)
	sctx  *stepCtx
}

// reconcile calls check until it settles the step's effect: applied
// (its value, checkpointed), not applied after the settle time (again:
// the intent is renewed, and act may run), or neither for ReconcileFor
// (parked).
func (r *checked[T]) reconcile(ctx context.Context) (v T, again bool, err error) {
	var zero T
	deadline := time.Now().Add(r.cfg.reconcile)
	pause := 100 * time.Millisecond
	ceil := min(max(r.cfg.reconcile/8, pause), 10*time.Second)
	last := ""
	for tries := 1; ; tries++ {
		if err := ctx.Err(); err != nil {
			return zero, false, fmt.Errorf("idem: step %q: reconciliation stopped after %d checks (its intent stays: the next attempt checks again): %w",
				r.name, tries-1, causeOf(ctx, err))
		}
		v, c, cerr := r.check(r.sctx)
		switch {
		case cerr != nil:
			last = "check failed: " + cerr.Error()
		case c == CheckApplied:
			r.s.noteReconciled(r.name, CheckApplied)
			v, err := checkpoint(ctx, r.s, r.rc, r.name, v, stepCheckScript)
			return v, false, err
		case c == CheckNotApplied:
			wait, err := r.s.rearm(ctx, r.name, r.cfg.settle)
			if err != nil {
				return zero, false, err
			}
			if wait == 0 {
				r.s.noteReconciled(r.name, CheckNotApplied)
				return zero, true, nil
			}
			last = fmt.Sprintf("not applied, %v before that counts", wait)
		default:
			last = "check: " + c.String()
		}
		if !time.Now().Before(deadline) {
			if err := r.s.park(ctx, r.name); err != nil {
				return zero, false, err
			}
			r.s.noteReconciled(r.name, CheckUnknown)
			return zero, false, r.s.notePark(&parkedError{key: r.s.key, name: r.name,
				why: fmt.Sprintf("%d checks over %v did not settle it (last: %s)", tries, r.cfg.reconcile, last)})
		}
		t := time.NewTimer(min(pause, max(time.Until(deadline), 0)))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		pause = min(2*pause, ceil)
	}
}

// parkedError is the error of a parked step: it matches ErrUnknownOutcome
// and ErrParked.
type parkedError struct {
	key, name, why string
}

func (e *parkedError) Error() string {
	return fmt.Sprintf("idem: outcome unknown: key %q, step %q: %s; the operation is parked until an operator resolves the step (Resolve, ResolveNotApplied)",
		e.key, e.name, e.why)
}

func (e *parkedError) Unwrap() []error { return []error{ErrUnknownOutcome, ErrParked} }

// begin stores the intent of the checked step called name, unless its
// field holds something: it returns "" when the intent is stored, or the
// field's value ("d"/"f" checkpoint, "i"/"u" and the marker's age).
func (s *steps) begin(ctx context.Context, name string) (string, error) {
	v, err := s.c.write(ctx, stepCheckScript, s.keys, s.token, name, opBegin).Result()
	if err != nil {
		return "", fmt.Errorf("idem: step %q not run: storing its intent: %w", name, err)
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		if v == stepNotOwner {
			return "", fmt.Errorf("%w: step %q not run: another attempt owns the operation now", ErrLeaseLost, name)
		}
	}
	return "", fmt.Errorf("idem: step %q not run: unexpected reply %v from the step script", name, v)
}

// rearm renews the intent of the step called name when it is at least
// settle old, and returns 0 then (act may run again), or how long it has
// to go.
func (s *steps) rearm(ctx context.Context, name string, settle time.Duration) (time.Duration, error) {
	v, err := s.c.write(ctx, stepCheckScript, s.keys, s.token, name, opRearm, settle.Milliseconds()).Result()
	if err != nil {
		return 0, fmt.Errorf("idem: step %q: renewing its intent (act did not run again): %w", name, err)
	}
	if n, ok := v.(int64); ok && n == stepNotOwner {
		return 0, fmt.Errorf("%w: step %q: another attempt owns the operation now; act did not run again", ErrLeaseLost, name)
	}
	a, _ := v.([]any)
	if len(a) == 2 {
		code, _ := a[0].(int64)
		ms, _ := a[1].(int64)
		switch code {
		case 1:
			return 0, nil
		case 2:
			return max(time.Duration(ms)*time.Millisecond, time.Millisecond), nil
		case 3:
			return 0, fmt.Errorf("%w: key %q, step %q: its intent is gone while it was reconciled", ErrCorrupt, s.key, name)
		}
	}
	return 0, fmt.Errorf("idem: step %q: unexpected reply %v from the step script", name, v)
}

// clear deletes the intent of the step called name, whose act failed
// without acting, so that the next attempt runs act, not check. It
// returns nil, or why the intent stays (the next attempt checks then).
func (s *steps) clear(ctx context.Context, name string) error {
	return s.mark(ctx, name, opClear, "clearing its intent (the next attempt checks first)")
}

// park turns the intent of the step called name into a parked marker.
func (s *steps) park(ctx context.Context, name string) error {
	return s.mark(ctx, name, opPark, "parking it (the next attempt checks again)")
}

func (s *steps) mark(ctx context.Context, name, op, what string) error {
	r, err := s.c.write(s.c.bounds.detached(ctx), stepCheckScript, s.keys, s.token, name, op).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("idem: step %q: %s: %w", name, what, err)
	case r == stepNotOwner:
		return fmt.Errorf("%w: step %q: %s: another attempt owns the operation now", ErrLeaseLost, name, what)
	case r != 1:
		return fmt.Errorf("idem: step %q: %s: unexpected reply %d from the step script", name, what, r)
	}
	return nil
}

// Resolve settles the parked checked step called step of key's operation
// (see StepChecked) as applied, with v, its value: the next attempt
// resumes with v as the step's result, and act does not run. It is an
// operator's call (idemctl), made after asking the provider. It fails,
// and changes nothing, unless the step is parked; v is bounded as a
// step's result is.
func Resolve[T any](ctx context.Context, c *Client, key, step string, v T) error {
	rc := codec.For(reflect.TypeFor[T]())
	if err := rc.Err(); err != nil {
		return fmt.Errorf("idem: resolve key %q, step %q: %w: %v", key, step, ErrEncode, err)
	}
	b, err := rc.Encode(&v)
	if err != nil {
		return fmt.Errorf("idem: resolve key %q, step %q: %w: %v", key, step, ErrEncode, err)
	}
	if len(b) > c.cfg.maxResultSize {
		return fmt.Errorf("idem: resolve key %q, step %q: %w", key, step, tooLarge(len(b), c.cfg.maxResultSize))
	}
	return c.resolve(ctx, key, step, append([]byte{checkpointDone}, b...))
}

// ResolveNotApplied settles the parked checked step called step of key's
// operation (see StepChecked) as not applied: the next attempt runs its
// act again. It is an operator's call (idemctl), made after the provider
// confirmed that the effect did not happen and will not. It fails, and
// changes nothing, unless the step is parked.
func (c *Client) ResolveNotApplied(ctx context.Context, key, step string) error {
	return c.resolve(ctx, key, step, nil)
}

func (c *Client) resolve(ctx context.Context, key, step string, cp []byte) error {
	if err := c.checkCall(ctx, key); err != nil {
		return err
	}
	if step == "" || len(step) > maxStepName {
		return fmt.Errorf("idem: resolve key %q: a step name is 1 to %d bytes", key, maxStepName)
	}
	rk := c.recordKey(key)
	r, err := c.write(ctx, stepCheckScript, []string{rk, rk + stepsSuffix}, "", step, opResolve, cp,
		stepsTotal*c.cfg.maxResultSize).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("idem: resolve key %q, step %q: %w", key, step, err)
	case r == 1:
		return nil
	case r == 0:
		return fmt.Errorf("idem: resolve key %q, step %q: the key has no record", key, step)
	case r == 4:
		return fmt.Errorf("idem: resolve key %q, step %q: the operation is finished", key, step)
	case r == stepOverTotal:
		return fmt.Errorf("idem: resolve key %q, step %q: %w: the operation's checkpoints would take more than %d bytes", key, step, ErrTooLarge, stepsTotal*c.cfg.maxResultSize)
	case r == stepTaken:
		return fmt.Errorf("idem: resolve key %q, step %q: the step is not parked", key, step)
	}
	return fmt.Errorf("idem: resolve key %q, step %q: unexpected reply %d from the step script", key, step, r)
}
