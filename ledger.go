// ledger.go: recording outcomes with the business change. A Ledger keeps
// outcomes in the user's own store, written by fn inside the transaction of
// the business change (idemsql.Commit), read by the Client on takeovers.

package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// A Ledger keeps the outcomes of calls in the store that holds their
// business changes, so that an outcome is recorded atomically with the
// change it reports: the store's unique key on the idempotency key decides
// which attempt's change stands. fn writes to it through the store's own
// helper (idemsql.Commit), inside its transaction; the Client reads it with
// Lookup before fn runs on a takeover (see WithLedger).
//
// Implementations must be safe for concurrent use.
type Ledger interface {
	// Lookup returns the outcome recorded for key, and false when none is.
	// Keys are compared as bytes: an entry of another key, or one whose
	// fingerprint is not a digest idem made, fails the call with an error
	// wrapping ErrCorrupt, and fn does not run.
	Lookup(ctx context.Context, key string) (Entry, bool, error)
}

// Entry is one outcome as a Ledger records it.
type Entry struct {
	// Key is the idempotency key, as Do got it (arbitrary bytes).
	Key string
	// Fingerprint is the digest of the call's fingerprint as idem stores
	// it (16 raw bytes), or "" when the call had none. Store and compare
	// it as bytes.
	Fingerprint string
	// Attempt is the attempt number of the call that recorded it.
	Attempt int64
	// Failed reports a permanent failure: Value is then the failure
	// (message and code) as idem stores one, replayed as a *StoredError.
	Failed bool
	// Value is the outcome, encoded exactly as idem stores it in Redis: the
	// result's bytes for Client.Do, its msgpack encoding for Do[T].
	Value []byte
}

// Errors of the ledger, matched with errors.Is.
var (
	// ErrNoLedger means a ledger's commit helper was called where no call
	// can record through it: outside the fn of a Do, in a call of a Client
	// without WithLedger, or after the call's outcome was already decided
	// (a second commit, or fn has returned). Nothing is committed.
	ErrNoLedger = errors.New("idem: no ledger for this context")

	// ErrRecorded means the ledger already held an outcome for the key,
	// with the same fingerprint, when fn tried to commit its own: fn's
	// transaction was rolled back and Do returns the recorded outcome, not
	// fn's. fn should return at once.
	ErrRecorded = errors.New("idem: an outcome was recorded for the key before this one; Do returns it")
)

// Pending is the call whose fn is running, as a ledger's commit helper
// sees it (see PendingFrom). Its methods are safe for concurrent use.
type Pending struct {
	key, fp   string // the idempotency key and its fingerprint digest
	n         int64  // the attempt
	maxResult int
	ledger    Ledger // the Client's (WithLedger)

	mu     sync.Mutex
	encode func(v any) ([]byte, error) // guarded by mu; Do[T]'s, nil for Client.Do
	typ    string                      // guarded by mu; the result type's name, for errors
	closed bool                        // guarded by mu; fn returned
	tried  bool                        // guarded by mu; an entry was made: a commit was under way
	// The call's outcome, once a commit decided it; guarded by mu.
	outcome *Entry
	mine    bool // the outcome is this call's own commit
	value   any  // the value this call committed (Do[T]'s T), if mine
}

// pendingKey is the context key under which fn's context holds the call's
// *Pending (see attemptCtx.Value).
type pendingKey struct{}

// PendingFrom returns the call that ctx belongs to: ctx is fn's context, or
// one derived from it. It fails, with an error wrapping ErrNoLedger,
// outside the fn of a Do, for a Client without a ledger (WithLedger), and
// once the call's outcome is decided (a commit already won or lost) or fn
// has returned.
func PendingFrom(ctx context.Context) (*Pending, error) {
	v := ctx.Value(pendingKey{})
	if v == nil {
		return nil, fmt.Errorf("%w: not inside the fn of a Do call", ErrNoLedger)
	}
	p, _ := v.(*Pending)
	if p == nil {
		return nil, fmt.Errorf("%w: the Client has no ledger (use idem.WithLedger)", ErrNoLedger)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return nil, err
	}
	return p, nil
}

// usable tells why p can take no more commits; p.mu is held.
func (p *Pending) usable() error {
	switch {
	case p.closed:
		return fmt.Errorf("%w: fn has returned", ErrNoLedger)
	case p.outcome != nil:
		return fmt.Errorf("%w: the call's outcome is recorded already", ErrNoLedger)
	}
	return nil
}

// Key returns the call's idempotency key.
func (p *Pending) Key() string { return p.key }

// Ledger returns the Client's ledger (WithLedger). A commit helper that is
// not given its ledger (idemsql.Commit takes only fn's context and the
// transaction) learns from it where to write (its table, its SQL) and
// checks that it is one of its own kind.
func (p *Pending) Ledger() Ledger { return p.ledger }

// Entry encodes v as the call's outcome, exactly as Do stores a result:
// for Do[T], v must be a T (encoded with msgpack); for Client.Do, a
// []byte. A value of another type, one that cannot be encoded, or one
// larger than WithMaxResultSize is an error wrapping ErrEncode or
// ErrTooLarge: commit nothing then.
func (p *Pending) Entry(v any) (Entry, error) {
	p.mu.Lock()
	encode, typ := p.encode, p.typ
	err := p.usable()
	p.tried = true
	p.mu.Unlock()
	if err != nil {
		return Entry{}, err
	}
	var b []byte
	if encode == nil {
		raw, ok := v.([]byte)
		if !ok {
			return Entry{}, fmt.Errorf("%w: key %q: Client.Do records []byte, not %T", ErrEncode, p.key, v)
		}
		b = raw
	} else if b, err = encode(v); err != nil {
		return Entry{}, fmt.Errorf("%w: key %q: %s: %w", ErrEncode, p.key, typ, err)
	}
	if len(b) > p.maxResult {
		return Entry{}, tooLarge(len(b), p.maxResult)
	}
	return Entry{Key: p.key, Fingerprint: p.fp, Attempt: p.n, Value: b}, nil
}

// FailureEntry encodes err as the call's permanent failure, as Do stores
// one (its message, cut to the limit, and its code; see Permanent and
// PermanentCode): replays get it as a *StoredError. err must not be nil.
func (p *Pending) FailureEntry(err error) (Entry, error) {
	if err == nil {
		return Entry{}, fmt.Errorf("%w: key %q: a failure entry needs an error", ErrEncode, p.key)
	}
	p.mu.Lock()
	uerr := p.usable()
	p.tried = true
	p.mu.Unlock()
	if uerr != nil {
		return Entry{}, uerr
	}
	return Entry{Key: p.key, Fingerprint: p.fp, Attempt: p.n, Failed: true,
		Value: failurePayload(err, p.maxResult)}, nil
}

// Committed tells the call that e, made by Entry or FailureEntry and
// written with the business change, is committed: it is the call's
// outcome, whatever fn returns after it. v is what e was made from: the
// value, which the owner's Do returns as it is, or the error, which the
// owner's Do returns as it is (later calls get the stored failure).
func (p *Pending) Committed(e Entry, v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outcome == nil {
		p.outcome, p.mine, p.value = &e, true, v
	}
}

// Found tells the call that the ledger already held e for its key: the
// commit helper's INSERT met the unique key, and its transaction was
// rolled back. e becomes the call's outcome. Found returns the error for
// the helper to return to fn: ErrConflict when e's fingerprint differs
// from the call's (Do then returns ErrConflict), else ErrRecorded (Do then
// returns e's outcome). An e of another key, or with a fingerprint that is
// not a digest, is not the call's outcome: Found returns an error wrapping
// ErrCorrupt, for fn to return.
func (p *Pending) Found(e Entry) error {
	if err := checkEntry(p.key, &e); err != nil {
		return err // not this call's outcome: fn's transaction is void
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outcome == nil {
		p.outcome = &e
	}
	if conflicts(p.fp, e.Fingerprint) {
		return fmt.Errorf("%w: key %q: the ledger holds an outcome of other parameters", ErrConflict, p.key)
	}
	return fmt.Errorf("%w: key %q", ErrRecorded, p.key)
}

// checkEntry tells why e, which a ledger holds for key, cannot be key's
// outcome: it is another key's (a key column that folds case, or trims or
// cuts bytes, maps two keys to one row), or its fingerprint is no digest
// idem made. The ledger cannot decide key's outcome then: the call fails
// closed, and no record is finished from e.
func checkEntry(key string, e *Entry) error {
	switch {
	case e.Key != key:
		return fmt.Errorf("%w: key %q: the ledger holds the outcome of key %q under it (does its key column compare bytes?)", ErrCorrupt, key, e.Key)
	case e.Fingerprint != "" && len(e.Fingerprint) != digestSize:
		return fmt.Errorf("%w: key %q: the ledger holds a fingerprint of %d bytes, not a digest of %d", ErrCorrupt, key, len(e.Fingerprint), digestSize)
	}
	return nil
}

// digestSize is the length of a fingerprint's digest (see digest).
const digestSize = 16

// conflicts reports whether two fingerprint digests differ, "" matching any.
func conflicts(a, b string) bool { return a != "" && b != "" && a != b }

// setCodec tells p how Do[T] encodes its results.
func (p *Pending) setCodec(typ string, encode func(any) ([]byte, error)) {
	p.mu.Lock()
	p.typ, p.encode = typ, encode
	p.mu.Unlock()
}

// close ends the commits of the call (fn has returned) and returns its
// outcome, if a commit decided it, with whether it is this call's own
// commit and the value committed; and whether a commit was tried without
// deciding it (it failed, or its end is unknown).
func (p *Pending) close() (e *Entry, mine bool, v any, undecided bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return p.outcome, p.mine, p.value, p.tried && p.outcome == nil
}

// decided returns the call's outcome as close does, without closing p.
func (p *Pending) decided() (e *Entry, mine bool, v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outcome, p.mine, p.value
}

// pendingIn returns the *Pending of the call whose fn has ctx, or nil.
func pendingIn(ctx context.Context) *Pending {
	p, _ := ctx.Value(pendingKey{}).(*Pending)
	return p
}

// ledgerOutcome is what Do returns for an outcome e that the ledger
// decided: its result, or its stored failure, or ErrConflict when e's
// fingerprint differs from the call's fp.
func ledgerOutcome(key, fp string, e *Entry) ([]byte, error) {
	switch {
	case conflicts(fp, e.Fingerprint):
		return nil, fmt.Errorf("%w: key %q", ErrConflict, key)
	case e.Failed:
		return nil, readFailure(string(e.Value))
	}
	if e.Value == nil {
		return []byte{}, nil
	}
	return e.Value, nil
}

// ledgerRecord builds the finished Redis record of e for the owner token
// and attempt n of the call that finishes it. The fingerprint is the
// ledger's: the ledger is the truth, and later calls with other
// parameters get ErrConflict from Redis at once.
func ledgerRecord(e *Entry, token string, n int64) (record []byte, free func()) {
	st := recordDone
	if e.Failed {
		st = recordFailed
	}
	return finishedRecord(st, e.Fingerprint, token, n, e.Value)
}
