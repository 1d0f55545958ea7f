// ledger.go: recording outcomes with the business change. A Ledger keeps
// outcomes in the user's own database; fn commits its outcome in the
// transaction of its business change (Commit, through a driver's LedgerTx),
// and the Client reads the ledger on takeovers. The protocol (insert, then
// committed or found) is here, once; a driver supplies only its SQL.

package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A Ledger keeps the outcomes of calls in the database that holds their
// business changes, so that an outcome is recorded atomically with the
// change it reports: the database's unique key on the idempotency key
// decides which attempt's change stands. fn records through a driver's
// commit helper (idemsql.Commit, idempgx.Commit), which calls Commit; the
// Client calls Lookup before fn runs on a takeover (see WithLedger).
//
// Implementations must be safe for concurrent use. The module
// github.com/idem-go/idem/ledgertest is the suite every driver runs.
type Ledger interface {
	// Lookup returns the outcome recorded for key, and false when none is.
	// Keys are compared as bytes: an entry of another key, or one whose
	// FingerprintDigest is not a digest idem made, fails the call with an
	// error wrapping ErrCorrupt, and fn does not run.
	Lookup(ctx context.Context, key string) (Entry, bool, error)

	// MaxKeyLen returns the longest key, in bytes, that the ledger can
	// record (a database index has a limit), or 0 when it sets no limit of
	// its own. New lowers the Client's key limit to it, so that a longer
	// key is refused with ErrInvalidKey before fn runs.
	MaxKeyLen() int
}

// LedgerTx is one of the user's transactions, as a ledger driver hands it
// to Commit and CommitError. Drivers implement it; users call the driver's
// helpers (idemsql.Commit), not its methods.
type LedgerTx interface {
	// Commit writes e as the ledger's row of e.Key in the transaction and
	// commits the transaction, in as few round trips as the database
	// allows. When the key has a row already, the transaction is not
	// committed (it is rolled back, with the business change) and Commit
	// returns that row with found true, read without waiting for a second
	// connection: through the transaction before it ends, or through its
	// own connection after. Its Age is set as Lookup sets it.
	//
	// An error means that nothing was committed, or that whether the
	// COMMIT landed is unknown (the next attempt's Lookup tells). Errors
	// that the database will repeat whatever the attempt (a key or a row
	// too large for it) are wrapped with Permanent. A transaction of
	// another database than the ledger's is refused: nothing commits.
	Commit(ctx context.Context, e Entry) (recorded Entry, found bool, err error)

	// Rollback rolls the transaction back. Commit and CommitError call it
	// when nothing may be committed: outside a call, or for a value Do
	// cannot store. Its error is ignored.
	Rollback(ctx context.Context) error
}

// Entry is one outcome as a Ledger records it.
type Entry struct {
	// Key is the idempotency key, as Do got it (arbitrary bytes).
	Key string
	// FingerprintDigest is the digest of the call's fingerprint as idem
	// stores it (16 raw bytes), or "" when the call had none. Store and
	// compare it as bytes.
	FingerprintDigest string
	// Attempt is the attempt number of the call that recorded it.
	Attempt int64
	// Failed reports a permanent failure: Value is then the failure
	// (message and code) as idem stores one, replayed as a *StoredError.
	Failed bool
	// Value is the outcome, encoded exactly as idem stores it in Redis: the
	// result's bytes for Client.Do, its msgpack encoding for Do[T].
	Value []byte
	// Age is how long before it was read the database recorded the entry,
	// by the database's own clock (the driver computes it in SQL); zero for
	// an entry that was not read from a database. A record that the Client
	// finishes from the entry expires when the entry is the retention old
	// (WithRetention), so that a ledger pruned of rows older than the
	// retention never lacks the row of a record Redis still holds.
	Age time.Duration
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

// LedgerFrom returns the ledger (WithLedger) of the call that ctx belongs
// to: ctx is fn's context, or one derived from it. A driver's commit
// helper uses it to check that the ledger is of its kind and to learn its
// table. It fails, with an error wrapping ErrNoLedger, outside the fn of a
// Do, for a Client without a ledger, and once the call's outcome is decided
// (a commit already won or lost) or fn has returned.
func LedgerFrom(ctx context.Context) (Ledger, error) {
	p, err := pendingFrom(ctx)
	if err != nil {
		return nil, err
	}
	return p.ledger, nil
}

// Commit records v as the outcome of the call that ctx belongs to (fn's
// context, or one derived from it), through tx, a transaction that holds
// the call's business change: both commit, or neither. v must be what Do
// stores: a T for Do[T], a []byte for Client.Do.
//
// Commit returns nil once committed: v is the call's outcome whatever fn
// returns next. When the ledger held an outcome for the key already
// (another attempt committed first), tx is rolled back and Commit returns
// an error wrapping ErrRecorded, or ErrConflict when that outcome is of
// other parameters; Do then returns the recorded outcome, not fn's. When
// nothing can be recorded (outside a call, a Client without a ledger, a
// second commit, a v that Do cannot store), tx is rolled back and Commit
// says why. When tx's COMMIT fails, its error is returned: the outcome
// counts only if the commit landed, which the next attempt's lookup finds
// out. Drivers wrap Commit in a typed helper (idemsql.Commit[T]).
func Commit(ctx context.Context, tx LedgerTx, v any) error {
	if tx == nil {
		return errors.New("idem: Commit with a nil transaction")
	}
	p, err := pendingFrom(ctx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("idem: Commit: nothing committed: %w", err)
	}
	e, err := p.entry(v)
	if err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("idem: Commit: nothing committed: %w", err)
	}
	return p.commit(ctx, tx, e, v)
}

// CommitError records err as the permanent failure of the call that ctx
// belongs to, through tx: for a failure whose own changes must stick, such
// as the row of a declined payment. Every later call with the key gets the
// failure (a *StoredError); the owner's Do returns err. Return what
// CommitError returns from fn: that is err marked permanent (Permanent)
// once committed, or, as for Commit, why nothing was committed. err must
// not be nil.
func CommitError(ctx context.Context, tx LedgerTx, err error) error {
	if tx == nil {
		return errors.New("idem: CommitError with a nil transaction")
	}
	if err == nil {
		_ = tx.Rollback(ctx)
		return errors.New("idem: CommitError with a nil error: nothing committed")
	}
	if !IsPermanent(err) {
		err = Permanent(err)
	}
	p, perr := pendingFrom(ctx)
	if perr != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("idem: CommitError: nothing committed: %w", perr)
	}
	e, perr := p.failureEntry(err)
	if perr != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("idem: CommitError: nothing committed: %w", perr)
	}
	if cerr := p.commit(ctx, tx, e, err); cerr != nil {
		return cerr
	}
	return err
}

// pending is the call whose fn is running, as Commit sees it. Its methods
// are safe for concurrent use.
type pending struct {
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
	mine    bool  // the outcome is this call's own commit
	value   any   // the value this call committed (Do[T]'s T), if mine
	since   int64 // mono when the outcome's age was known (see recorded)
}

// pendingKey is the context key under which fn's context holds the call's
// *pending (see attemptCtx.Value).
type pendingKey struct{}

// pendingFrom returns the call that ctx belongs to, or why it can take no
// commit.
func pendingFrom(ctx context.Context) (*pending, error) {
	v := ctx.Value(pendingKey{})
	if v == nil {
		return nil, fmt.Errorf("%w: not inside the fn of a Do call", ErrNoLedger)
	}
	p, _ := v.(*pending)
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
func (p *pending) usable() error {
	switch {
	case p.closed:
		return fmt.Errorf("%w: fn has returned", ErrNoLedger)
	case p.outcome != nil:
		return fmt.Errorf("%w: the call's outcome is recorded already", ErrNoLedger)
	}
	return nil
}

// entry encodes v as the call's outcome, exactly as Do stores a result:
// for Do[T], v must be a T (encoded with msgpack); for Client.Do, a
// []byte. A value of another type, one that cannot be encoded, or one
// larger than WithMaxResultSize is an error wrapping ErrEncode or
// ErrTooLarge.
func (p *pending) entry(v any) (Entry, error) {
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
	if b == nil {
		b = []byte{}
	}
	return Entry{Key: p.key, FingerprintDigest: p.fp, Attempt: p.n, Value: b}, nil
}

// failureEntry encodes err as the call's permanent failure, as Do stores
// one (its message, cut to the limit, and its code; see Permanent and
// PermanentCode): replays get it as a *StoredError.
func (p *pending) failureEntry(err error) (Entry, error) {
	p.mu.Lock()
	uerr := p.usable()
	p.tried = true
	p.mu.Unlock()
	if uerr != nil {
		return Entry{}, uerr
	}
	return Entry{Key: p.key, FingerprintDigest: p.fp, Attempt: p.n, Failed: true,
		Value: failurePayload(err, p.maxResult)}, nil
}

// commit runs the protocol for e, made from v: the driver inserts e and
// commits, or finds the key's row, and the outcome is decided by which.
func (p *pending) commit(ctx context.Context, tx LedgerTx, e Entry, v any) error {
	// The retention of a record finished from this commit counts from
	// here, before the row is written: the row is never younger than the
	// record thinks it is.
	start := mono()
	found, ok, err := tx.Commit(ctx, e)
	switch {
	case err != nil:
		return fmt.Errorf("idem: Commit: key %q: %w", p.key, err)
	case ok:
		return p.found(found, start)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outcome == nil {
		p.outcome, p.mine, p.value, p.since = &e, true, v, start
	}
	return nil
}

// found makes e, the row the ledger already held for the key when the
// commit's INSERT met its unique key (tx rolled back), the call's outcome.
// It returns the error for Commit to return to fn: ErrConflict when e's
// fingerprint differs from the call's (Do then returns ErrConflict), else
// ErrRecorded (Do then returns e's outcome). An e of another key, or with a
// fingerprint that is not a digest, is not the call's outcome: the error
// wraps ErrCorrupt. start is when the read of e began (mono).
func (p *pending) found(e Entry, start int64) error {
	if err := checkEntry(p.key, &e); err != nil {
		return fmt.Errorf("idem: Commit: %w", err) // not this call's outcome: fn's transaction is void
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outcome == nil {
		p.outcome, p.since = &e, start
	}
	if conflicts(p.fp, e.FingerprintDigest) {
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
	case e.FingerprintDigest != "" && len(e.FingerprintDigest) != digestSize:
		return fmt.Errorf("%w: key %q: the ledger holds a fingerprint of %d bytes, not a digest of %d", ErrCorrupt, key, len(e.FingerprintDigest), digestSize)
	case e.Age < 0:
		return fmt.Errorf("%w: key %q: the ledger gives its entry a negative age (%v)", ErrCorrupt, key, e.Age)
	}
	return nil
}

// digestSize is the length of a fingerprint's digest (see digest).
const digestSize = 16

// conflicts reports whether two fingerprint digests differ, "" matching any.
func conflicts(a, b string) bool { return a != "" && b != "" && a != b }

// setCodec tells p how Do[T] encodes its results.
func (p *pending) setCodec(typ string, encode func(any) ([]byte, error)) {
	p.mu.Lock()
	p.typ, p.encode = typ, encode
	p.mu.Unlock()
}

// decision is a call's outcome as a commit decided it: the entry, whether
// it is this call's own commit and the value committed, and when its age
// was known (see ledgerTTL).
type decision struct {
	e     *Entry
	mine  bool
	v     any
	since int64
}

// close ends the commits of the call (fn has returned) and returns its
// outcome, if a commit decided it; and whether a commit was tried without
// deciding it (it failed, or its end is unknown).
func (p *pending) close() (d decision, undecided bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return decision{p.outcome, p.mine, p.value, p.since}, p.tried && p.outcome == nil
}

// decided returns the call's outcome as close does, without closing p.
func (p *pending) decided() decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	return decision{p.outcome, p.mine, p.value, p.since}
}

// LedgerDecided reports whether a commit through the ledger has decided
// the outcome of the call that ctx belongs to (fn's context, or one
// derived from it), and whether that outcome is this attempt's own commit
// (mine) or one the ledger held already, which Do returns instead of fn's
// result (Commit returned ErrRecorded or ErrConflict). A door that runs a
// handler as fn reads it when the handler returns, to answer a recorded
// outcome as a replay. Outside fn, or for a Client without a ledger, it
// returns false, false.
func LedgerDecided(ctx context.Context) (decided, mine bool) {
	p := pendingIn(ctx)
	if p == nil {
		return false, false
	}
	d := p.decided()
	return d.e != nil, d.mine
}

// pendingIn returns the *pending of the call whose fn has ctx, or nil.
func pendingIn(ctx context.Context) *pending {
	p, _ := ctx.Value(pendingKey{}).(*pending)
	return p
}

// ledgerOutcome is what Do returns for an outcome e that the ledger
// decided: its result, or its stored failure, or ErrConflict when e's
// fingerprint differs from the call's fp.
func ledgerOutcome(key, fp string, e *Entry) ([]byte, error) {
	switch {
	case conflicts(fp, e.FingerprintDigest):
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
	return finishedRecord(st, e.FingerprintDigest, token, n, e.Value)
}

// ledgerTTL is the retention left to a record finished from e, whose age
// was e.Age at since (mono): the record expires when e is the retention
// old, so that it never outlives a row pruned at the retention (see
// Entry.Age). A record with no retention left is kept for a millisecond:
// the caller that finishes it gets its outcome, later callers find the
// key as the retention left it.
func ledgerTTL(retention time.Duration, e *Entry, since int64) time.Duration {
	left := retention - e.Age - time.Duration(mono()-since)
	return max(left, time.Millisecond)
}
