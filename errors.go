// errors.go: the errors Do returns, Permanent and its codes, and the
// replayed StoredError.

package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Errors returned by Do, matched with errors.Is.
var (
	// ErrConflict means the key was used before with other parameters: the
	// stored fingerprint differs from the one given. fn does not run.
	ErrConflict = errors.New("idem: key reused with different parameters")

	// ErrInProgress means another caller owns the key and its outcome did not
	// arrive within the wait budget (WithWait) or the caller's context. Retry
	// later. When the context ended the wait, the error matches ctx.Err() too.
	ErrInProgress = errors.New("idem: operation in progress")

	// ErrLeaseLost means fn ran, but its lease ended and another caller took
	// over (or the record was deleted) before the outcome could be recorded:
	// the outcome was not stored. The newer owner's outcome stands. It is
	// also the cause of fn's context when the owner's lease deadline passes
	// without a renewal. Before fn starts, it means the claim came back with
	// too little of its lease left and could not be renewed: fn did not run,
	// and the claim was given back.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrInvalidKey means the key is empty or longer than the limit
	// (WithMaxKeyLen).
	ErrInvalidKey = errors.New("idem: invalid key")

	// ErrNotRecorded means fn ran but its outcome could not be stored, even
	// after retries. The key stays claimed until the lease ends; the next
	// attempt sees a higher Attempt.Number and should reconcile first.
	ErrNotRecorded = errors.New("idem: outcome not recorded")

	// ErrCorrupt means the stored record cannot be understood (damaged, or
	// written by an unknown version). Do fails closed: fn does not run.
	ErrCorrupt = errors.New("idem: corrupt record")

	// ErrTooLarge means fn's result is larger than the limit
	// (WithMaxResultSize). The key is then finished as a permanent failure
	// that says so, and fn is never run again for it. Its replays match
	// ErrTooLarge too (code "idem.too_large").
	ErrTooLarge = errors.New("idem: result too large")

	// ErrEncode means the typed Do cannot store a result of its type T
	// faithfully (see Do for what is refused). Do returns it at once, before
	// fn runs, when T itself is refused. When fn's value could not be
	// encoded (a cyclic value, a marshaler that failed), fn has acted: the
	// key is finished as a permanent failure that says so, and its replays
	// match ErrEncode too (code "idem.encode").
	ErrEncode = errors.New("idem: result cannot be stored")

	// ErrDecode means a stored result does not decode exactly into the
	// typed Do's result type T: a field the stored result has and T has
	// not (renamed or removed), a value that does not fit its field (300
	// into a uint8, 1.5 into an int), or another shape. The error names the
	// key and the type; Do fails closed, as for any record it cannot
	// understand: it wraps ErrCorrupt, and fn does not run.
	ErrDecode = fmt.Errorf("%w: stored result does not decode into the result type", ErrCorrupt)

	// ErrExpired means the record expired while this caller waited for
	// another owner: the retention is shorter than the operation takes. Do
	// does not silently start over as attempt 1.
	ErrExpired = errors.New("idem: record expired while waiting")

	// ErrNotReplicated means a write reached fewer replicas than
	// WithReplicas asks for within its timeout.
	ErrNotReplicated = errors.New("idem: not acknowledged by enough replicas")

	// ErrLateRetry means the key was used, and its outcome is gone: the
	// record's retention ended, and only its tombstone (WithTombstones)
	// is left. fn does not run. The retry came later than the retention
	// allows for: lengthen it (see cmd/ttlbench), or treat the operation
	// as done.
	ErrLateRetry = errors.New("idem: late retry: the key was used and its outcome is no longer kept")

	// ErrParked means the key's operation is parked: it is unfinished,
	// and nothing runs it again until an operator says so (Client.Retry
	// runs it again; Forget deletes it). A record is parked after too many
	// failed recoveries (WithMaxRecoveries), or when a checked step's
	// outcome could not be settled (ErrUnknownOutcome). fn does not run.
	ErrParked = errors.New("idem: operation parked: it runs again only when an operator says so")

	// ErrUnknownOutcome means a checked step (StepChecked) acted, and
	// neither its answer nor its checks could tell whether the effect
	// happened before the reconciliation ran out of time: the operation is
	// parked (Do's error matches ErrParked too) until an operator resolves
	// the step (Resolve, ResolveNotApplied). fn does not run.
	ErrUnknownOutcome = errors.New("idem: outcome unknown: a step's effect could not be settled; parked for an operator")

	// ErrInputTooLarge means an Op's input, encoded, is larger than
	// MaxInputSize. Nothing is claimed and fn does not run.
	ErrInputTooLarge = errors.New("idem: operation input too large")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("idem: client closed")

	// ErrStepAfterCommit means a step (Step) began or ended after the
	// operation's outcome was committed to the ledger (Commit,
	// CommitError). The commit ends the operation: every later call gets
	// the committed outcome and no attempt runs fn again, so such a step
	// never runs again. A step called after the commit does not run; one
	// that failed after it did not finish. The owner's Do returns the
	// committed outcome with this error; replays return the outcome alone.
	ErrStepAfterCommit = errors.New("idem: step after the ledger commit: the outcome is committed and stands, and the step will not run again")

	// ErrUnavailable means a claim could not reach Redis (no connection,
	// a connection lost, a timeout, the go-redis pool exhausted), or Redis
	// answered that it cannot serve for now (LOADING, BUSY, MASTERDOWN,
	// CLUSTERDOWN, TRYAGAIN, READONLY, OOM). fn did not run; retry later.
	// A call whose own context ended gets ctx.Err() instead.
	ErrUnavailable = errors.New("idem: Redis unavailable")
)

// claimError is the error Do returns for a claim of key that failed with
// err: it wraps ErrUnavailable as well when Redis could not be reached or
// could not serve, unless ctx ended (the caller gave up).
func claimError(ctx context.Context, key string, err error) error {
	if ctx.Err() == nil && unavailable(err) {
		return fmt.Errorf("%w: claim key %q: %w", ErrUnavailable, key, err)
	}
	return fmt.Errorf("idem: claim key %q: %w", key, err)
}

// unavailable reports whether err, the error of a script call, says that
// Redis could not be reached or cannot serve for now.
func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		code, _, _ := strings.Cut(re.Error(), " ")
		switch code {
		case "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM":
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Permanent marks err as the final outcome of the operation: Do stores its
// message and every later call with the key gets it back (as a
// *StoredError) without running fn. Errors not marked permanent are
// transient: the key is released and the next call runs fn again.
// Permanent(nil) returns nil.
//
// The stored error keeps the code of the first error in err's chain that
// has one (see Code), so that replays match the same registered errors
// as the owner's error does; use PermanentCode to give one explicitly.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// PermanentCode is Permanent with a stable code, stored with the message:
// a replayed *StoredError has it in its Code field, and matches with
// errors.Is the error registered for the code (RegisterCode), as the
// owner's error does. A code is an identifier of at most 64 bytes, such as
// "card_declined"; PermanentCode keeps the first 64 bytes of a longer one.
// An empty code is no code. PermanentCode(code, nil) returns nil.
func PermanentCode(code string, err error) error {
	if err == nil {
		return nil
	}
	if len(code) > maxCodeLen {
		code = code[:maxCodeLen]
	}
	return &permanentError{err: err, code: code}
}

// maxCodeLen is the longest code, in bytes.
const maxCodeLen = 64

type permanentError struct {
	err  error
	code string // "" for none
}

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Is reports whether target is the error registered for e's code, or one
// it wraps: the owner's error matches what its replays will match.
func (e *permanentError) Is(target error) bool {
	t := registered(e.code)
	return t != nil && errors.Is(t, target)
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent or PermanentCode, or is a replayed *StoredError. Do stores
// every such error returned by fn as the key's outcome.
func IsPermanent(err error) bool {
	var p *permanentError
	var s *StoredError
	return errors.As(err, &p) || errors.As(err, &s)
}

// StoredError is the permanent failure of an earlier attempt, replayed from
// the record. Its Error is the original error's message (cut, with a note
// saying so, if it was longer than WithMaxResultSize allows).
//
// errors.Is(err, target) holds for a replay when target is the error
// registered for its code (RegisterCode), or an error that one wraps;
// errors.As reaches the registered error too.
type StoredError struct {
	// Message is the text of the original error.
	Message string
	// Code is the original error's code (see Code), or "" when it had
	// none.
	Code string
}

// Error returns the original error's message.
func (e *StoredError) Error() string { return e.Message }

// Unwrap returns the error registered for e's code, or nil.
func (e *StoredError) Unwrap() error { return registered(e.Code) }

// RegisterCode registers target as the error that stored failures with
// code stand for: a replayed *StoredError with the code matches target
// (errors.Is), and Permanent(err) stores the code when err wraps target,
// so that a plain Permanent(fmt.Errorf("...: %w", ErrCardDeclined)) keeps
// its identity on replay. Register codes at initialization, as with
// gob.Register, in every process that replays them.
//
// RegisterCode panics if code is empty, longer than 64 bytes, starts with
// "idem." (the package's own codes) or is registered already, or if
// target is nil: these are programming errors.
func RegisterCode(code string, target error) {
	switch {
	case code == "" || len(code) > maxCodeLen:
		panic(fmt.Sprintf("idem: RegisterCode(%q): a code is 1 to %d bytes", code, maxCodeLen))
	case strings.HasPrefix(code, "idem."):
		panic(fmt.Sprintf("idem: RegisterCode(%q): codes starting with \"idem.\" are reserved", code))
	case target == nil:
		panic(fmt.Sprintf("idem: RegisterCode(%q): nil error", code))
	}
	if err := codes.add(code, target); err != nil {
		panic(err)
	}
}

// Code returns err's code: the code of the outermost error in its chain
// that has one, which is the code given to PermanentCode, the Code of a
// replayed *StoredError, or the code registered (RegisterCode) for an
// error in the chain. It returns "" when none has a code.
func Code(err error) string {
	for err != nil {
		switch e := err.(type) {
		case *permanentError:
			if e.code != "" {
				return e.code
			}
		case *StoredError:
			if e.Code != "" {
				return e.Code
			}
		}
		if c := codes.of(err); c != "" {
			return c
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if c := Code(e); c != "" {
					return c
				}
			}
			return ""
		default:
			return ""
		}
	}
	return ""
}

// codes holds the registered codes, the package's own first.
var codes = codeRegistry{list: []codeEntry{
	{"idem.too_large", ErrTooLarge},
	{"idem.encode", ErrEncode},
}}

type codeRegistry struct {
	mu   sync.RWMutex
	list []codeEntry // guarded by mu; in the order of registration
}

type codeEntry struct {
	code   string
	target error
}

func (r *codeRegistry) add(code string, target error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.list {
		if e.code == code {
			return fmt.Errorf("idem: RegisterCode(%q): registered already", code)
		}
	}
	r.list = append(r.list, codeEntry{code, target})
	return nil
}

// entries returns the registered codes. Entries are only ever appended,
// so the slice can be read after the lock is released: Is methods called
// on it may themselves look codes up.
func (r *codeRegistry) entries() []codeEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.list[:len(r.list):len(r.list)]
}

// registered returns the error registered for code, or nil.
func registered(code string) error {
	if code == "" {
		return nil
	}
	for _, e := range codes.entries() {
		if e.code == code {
			return e.target
		}
	}
	return nil
}

// of returns the code registered for err itself (not the errors it wraps):
// err is the registered error, or says it is with an Is method.
func (r *codeRegistry) of(err error) string {
	list := r.entries()
	if reflect.TypeOf(err).Comparable() {
		for _, e := range list {
			if err == e.target {
				return e.code
			}
		}
	}
	if x, ok := err.(interface{ Is(error) bool }); ok {
		for _, e := range list {
			if x.Is(e.target) {
				return e.code
			}
		}
	}
	return ""
}

// tooLarge describes a result over the limit; its message is what is stored.
func tooLarge(size, limit int) error {
	return fmt.Errorf("%w: %d bytes exceeds the limit of %d bytes", ErrTooLarge, size, limit)
}
