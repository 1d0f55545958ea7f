// step.go: Step, StepKey and StepFrom: an fn made of steps checkpoints
// each step's outcome beside the key's record (lua/step.lua), so that a
// later attempt resumes after the last checkpointed step, and each step
// has a stable key to forward to a downstream system.

package idem

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/codec"
	"github.com/idem-go/idem/internal/pipeline"
)

// Step runs fn once per operation as the step called name of the Do call
// whose fn ctx belongs to, and checkpoints its outcome beside the key's
// record before it returns: a later attempt (after a crash, a lost lease
// or a transient error) gets the checkpoint and does not run fn again.
// A result is stored as Do[T] stores one; an error marked Permanent is
// stored and replayed as a *StoredError; any other error is returned as
// it is, and the step runs again in the next attempt.
//
// When the checkpoint is not stored, Step returns fn's value and an error
// wrapping ErrLeaseLost (another attempt owns the key) or ErrNotRecorded
// (the next attempt runs the step again: pass the downstream system
// StepKey(ctx, name)). After the ledger commit a step does not run, or
// does not finish: ErrStepAfterCommit. A name is 1 to 256 bytes, used
// once per attempt; steps do not nest, and may run concurrently. See
// docs/steps.md.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	s, err := stepsFor(ctx, name)
	if err != nil {
		return zero, err
	}
	if fn == nil {
		return zero, fmt.Errorf("idem: step %q: nil fn", name)
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
	if s.n > 1 {
		// An earlier attempt may have checkpointed the step.
		cp, found, err := s.load(ctx, name)
		if err != nil {
			return zero, err
		}
		if found {
			if cp[0] == checkpointFailed {
				return zero, readFailure(cp[1:])
			}
			var v T
			if err := rc.Decode([]byte(cp[1:]), &v); err != nil {
				return zero, fmt.Errorf("%w: key %q, step %q: %s: %v", ErrDecode, s.key, name, rc.Type(), err)
			}
			return v, nil
		}
	}

	v, err := fn(&stepCtx{Context: ctx, s: s, name: name})
	if err != nil && s.committed() {
		// The commit landed while the step ran: no attempt will run it again.
		if IsPermanent(err) {
			err = s.fail(ctx, name, err, stepScript)
		}
		return zero, s.afterCommit(fmt.Errorf("%w: step %q did not finish: it failed after the operation's outcome was committed to the ledger (key %q): %w",
			ErrStepAfterCommit, name, s.key, err))
	}
	if err != nil && !IsPermanent(err) {
		return zero, err
	}
	if err != nil {
		return zero, s.fail(ctx, name, err, stepScript)
	}
	return checkpoint(ctx, s, rc, name, v, stepScript)
}

// checkpoint stores v, the value of the step called name, with script
// (stepScript, or stepCheckScript for a checked step), and returns it, or
// a checkpointed permanent failure when v cannot be encoded or is too
// large.
func checkpoint[T any](ctx context.Context, s *steps, rc *codec.Codec, name string, v T, script pipeline.Script) (T, error) {
	var zero T
	b, err := rc.Encode(&v)
	if err != nil {
		// fn has acted: checkpoint the failure rather than run it again.
		return zero, s.fail(ctx, name, Permanent(fmt.Errorf("%w: key %q, step %q: %s: %v", ErrEncode, s.key, name, rc.Type(), err)), script)
	}
	max := s.c.cfg.maxResultSize
	if len(b) > max {
		return zero, s.fail(ctx, name, Permanent(fmt.Errorf("%w (step %q)", tooLarge(len(b), max), name)), script)
	}
	cp := make([]byte, 0, 1+len(b))
	cp = append(append(cp, checkpointDone), b...)
	switch r, err := s.store(ctx, name, cp, stepsTotal*max, script); {
	case err != nil:
		return v, err
	case r == stepOverTotal:
		return zero, s.fail(ctx, name, Permanent(fmt.Errorf("%w: step %q: the operation's checkpoints would take more than %d bytes",
			ErrTooLarge, name, stepsTotal*max)), script)
	}
	return v, nil
}

// StepKey returns the key of the step called name of the operation whose
// fn ctx belongs to: the same in every attempt, in every process,
// different for every other (prefix, key, name), to forward to a
// downstream system's idempotency (an Idempotency-Key header). It is
// "idem-" and 32 characters of a-z and 2-7: the first 160 bits of the
// SHA-256 of "idem.step\x00", the Client's prefix and the operation's key
// (each after its length as a uvarint) and the name, in lower-case base32.
// It returns "" outside a Do call's fn, and for an empty name.
func StepKey(ctx context.Context, name string) string {
	s, ok := ctx.Value(stepsKey{}).(*steps)
	if !ok || name == "" {
		return ""
	}
	return stepKey(s.c.cfg.prefix, s.key, name)
}

// StepFrom returns the name of the step whose fn ctx belongs to (see
// Step). It reports false outside a step's fn.
func StepFrom(ctx context.Context) (name string, ok bool) {
	if ctx.Value(currentStepKey{}) == nil {
		return "", false // before stepsKey, which would make the attempt's steps
	}
	s, _ := ctx.Value(stepsKey{}).(*steps)
	if sc := currentStep(ctx, s); sc != nil {
		return sc.name, true
	}
	return "", false
}

const (
	// maxStepName is the longest step name, in bytes.
	maxStepName = 256
	// stepsTotal is how many times WithMaxResultSize one operation's
	// checkpoints may take in all.
	stepsTotal = 4
	// stepsSuffix follows the record's key in its checkpoints' key.
	stepsSuffix = ":steps"

	// The tags that start a checkpoint: a result, or a permanent failure
	// (the payload of a failed record).
	checkpointDone   = 'd'
	checkpointFailed = 'f'

	// The replies of lua/step.lua to a write.
	stepNotOwner  = 0
	stepStored    = 1
	stepOverTotal = 2
	stepTaken     = 3
)

// steps is the state of one attempt's steps, made by its first step
// (attemptCtx.stepsOf). A nil *steps is an attempt without steps.
type steps struct {
	c     *Client
	key   string   // the operation's
	keys  []string // the Redis keys of the record and of its checkpoints (the call's claimKeys)
	token string   // the attempt owner's
	n     int64    // the attempt number

	p        *pending     // the call's hold for Commit; nil without a ledger
	returned *atomic.Bool // the attempt's (attemptCtx.returned): fn returned

	mu      sync.Mutex
	names   map[string]struct{} // guarded by mu; the names used in this attempt
	after   error               // guarded by mu; the steps refused or failed after the commit
	parked  error               // guarded by mu; a checked step parked, or found parked, in this attempt
	settled []reconciled        // guarded by mu; the checked steps' reconciliations, in order
}

// reconciled is one reconciliation of a checked step: what settled it,
// and when.
type reconciled struct {
	name  string
	check Check
	at    time.Time
}

// committed reports whether a ledger commit decided the operation's
// outcome: no attempt runs fn, nor any step, again.
func (s *steps) committed() bool {
	return s.p != nil && s.p.decided().e != nil
}

// afterCommit notes err, a step refused or failed after the commit, for
// the owner's Do to report (see afterCommitErr), and returns it.
func (s *steps) afterCommit(err error) error {
	s.mu.Lock()
	s.after = errors.Join(s.after, err)
	s.mu.Unlock()
	return err
}

// afterCommitErr returns the steps refused or failed after the commit, or
// nil.
func (s *steps) afterCommitErr() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.after
}

// notePark notes err, the error of a checked step parked (or found parked)
// in this attempt, and returns it: the attempt ends parked whatever fn
// returns (see parkedErr).
func (s *steps) notePark(err error) error {
	s.mu.Lock()
	if s.parked == nil {
		s.parked = err
	}
	s.mu.Unlock()
	return err
}

// noteReconciled notes that a reconciliation of the checked step called
// name ended with c (CheckUnknown: parked), for the call's events.
func (s *steps) noteReconciled(name string, c Check) {
	if !s.c.observed() {
		return
	}
	s.mu.Lock()
	s.settled = append(s.settled, reconciled{name: name, check: c, at: time.Now()})
	s.mu.Unlock()
}

// reconciliations returns the reconciliations noted in this attempt.
func (s *steps) reconciliations() []reconciled {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled
}

// parkedErr returns the error of the first checked step parked in this
// attempt, or nil.
func (s *steps) parkedErr() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parked
}

type stepsKey struct{}

// stepsFor returns the steps of the attempt that ctx belongs to, for a
// step called name, or an error naming the step that says why it cannot
// run there.
func stepsFor(ctx context.Context, name string) (*steps, error) {
	s, ok := ctx.Value(stepsKey{}).(*steps)
	switch {
	case !ok:
		return nil, fmt.Errorf("idem: step %q called outside the fn of a Do call", name)
	case name == "":
		return nil, errors.New("idem: step with an empty name")
	case len(name) > maxStepName:
		return nil, fmt.Errorf("idem: step %.32q...: a name of %d bytes is longer than the limit of %d", name, len(name), maxStepName)
	}
	if sc := currentStep(ctx, s); sc != nil {
		return nil, fmt.Errorf("idem: step %q called inside step %q: steps do not nest", name, sc.name)
	}
	return s, nil
}

// reserve claims name for a step of this attempt.
func (s *steps) reserve(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.returned.Load() {
		return fmt.Errorf("idem: step %q called after its Do call's fn returned", name)
	}
	if _, dup := s.names[name]; dup {
		return fmt.Errorf("idem: step %q used twice in one attempt: step names are unique within an operation", name)
	}
	if s.names == nil {
		s.names = make(map[string]struct{})
	}
	s.names[name] = struct{}{}
	return nil
}

// load reads the checkpoint of the step called name, if one is stored.
func (s *steps) load(ctx context.Context, name string) (cp string, found bool, err error) {
	v, err := s.c.scripts.Run(ctx, stepScript, s.keys, s.token, name, "", 0).Result()
	if err != nil {
		return "", false, fmt.Errorf("idem: step %q: reading its checkpoint (the step did not run): %w", name, err)
	}
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", false, nil
		}
		if v[0] != checkpointDone && v[0] != checkpointFailed {
			return "", false, fmt.Errorf("%w: key %q, step %q: unknown checkpoint", ErrCorrupt, s.key, name)
		}
		return v, true, nil
	case int64:
		if v == stepNotOwner {
			return "", false, fmt.Errorf("%w: step %q not run: another attempt owns the operation now", ErrLeaseLost, name)
		}
	}
	return "", false, fmt.Errorf("idem: step %q: unexpected reply %v from the step script", name, v)
}

// fail checkpoints err, a permanent error of the step called name, with
// script (see store), and returns it (joined with the reason it was not
// stored, if it was not).
func (s *steps) fail(ctx context.Context, name string, err error, script pipeline.Script) error {
	p := failurePayload(err, s.c.cfg.maxResultSize)
	cp := make([]byte, 0, 1+len(p))
	cp = append(append(cp, checkpointFailed), p...)
	if _, serr := s.store(ctx, name, cp, 0, script); serr != nil {
		return errors.Join(serr, err)
	}
	return err
}

// store writes the checkpoint cp of the step called name with script
// (stepScript; stepCheckScript, which replaces the step's intent, for a
// checked step), when the checkpoints would take at most limit bytes in
// all (0: no limit), with a detached context, retrying until the store timeout, as complete does:
// the step has acted. It returns the script's reply, stepStored or
// stepOverTotal, or an error that says why cp was not stored.
func (s *steps) store(ctx context.Context, name string, cp []byte, limit int, script pipeline.Script) (int64, error) {
	dctx := s.c.bounds.detached(ctx)
	var lastErr error
	for try, pause := 0, 20*time.Millisecond; ; try++ {
		var args []any
		if script.Script == stepCheckScript.Script {
			args = []any{s.token, name, opStore, cp, limit}
		} else {
			args = []any{s.token, name, cp, limit}
		}
		r, err := s.c.write(dctx, script, s.keys, args...).Int64()
		switch {
		case err == nil && (r == stepStored || r == stepOverTotal):
			return r, nil
		case err == nil && r == stepNotOwner:
			return r, fmt.Errorf("%w: step %q: another attempt owns the operation now; the step's checkpoint was not stored", ErrLeaseLost, name)
		case err == nil && r == stepTaken:
			return r, fmt.Errorf("%w: step %q: another checkpoint is stored under its name", ErrNotRecorded, name)
		case err == nil:
			return r, fmt.Errorf("%w: step %q: unexpected reply %d from the step script", ErrNotRecorded, name, r)
		case errors.Is(err, ErrNotReplicated):
			return r, fmt.Errorf("%w: step %q: %w", ErrNotRecorded, name, err)
		}
		if lastErr == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			lastErr = err
		}
		t := time.NewTimer(pause)
		select {
		case <-dctx.Done():
			t.Stop()
			return 0, fmt.Errorf("%w: step %q: its checkpoint, after %d tries: %w", ErrNotRecorded, name, try+1, lastErr)
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// stepCtx is the context of a step's fn: ctx with the step's name.
type stepCtx struct {
	context.Context
	s    *steps
	name string
}

type currentStepKey struct{}

func (c *stepCtx) Value(key any) any {
	if _, ok := key.(currentStepKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// currentStep returns the step of s whose fn ctx belongs to, or nil: a
// step of another Do call (one nested in a step) does not count.
func currentStep(ctx context.Context, s *steps) *stepCtx {
	sc, _ := ctx.Value(currentStepKey{}).(*stepCtx)
	if sc == nil || s == nil || sc.s != s {
		return nil
	}
	return sc
}

// causeOf is err, the error of a context that ended, with its cause when
// that says more (ErrLeaseLost).
func causeOf(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// stepKey derives StepKey's key (see there).
func stepKey(prefix, key, name string) string {
	b := make([]byte, 0, 32+len(prefix)+len(key)+len(name))
	b = append(b, "idem.step\x00"...)
	b = append(binary.AppendUvarint(b, uint64(len(prefix))), prefix...)
	b = append(binary.AppendUvarint(b, uint64(len(key))), key...)
	b = append(b, name...)
	sum := sha256.Sum256(b)
	return "idem-" + stepKeyEncoding.EncodeToString(sum[:20])
}

var stepKeyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
