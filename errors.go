// errors.go: the errors Do returns, Permanent, and the replayed StoredError.

package idem

import (
	"errors"
	"fmt"
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
	// that says so, and fn is never run again for it.
	ErrTooLarge = errors.New("idem: result too large")

	// ErrExpired means the record expired while this caller waited for
	// another owner: the retention is shorter than the operation takes. Do
	// does not silently start over as attempt 1.
	ErrExpired = errors.New("idem: record expired while waiting")

	// ErrNotReplicated means a write reached fewer replicas than
	// WithReplicas asks for within its timeout.
	ErrNotReplicated = errors.New("idem: not acknowledged by enough replicas")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("idem: client closed")
)

// Permanent marks err as the final outcome of the operation: Do stores its
// message and every later call with the key gets it back (as a
// *StoredError) without running fn. Errors not marked permanent are
// transient: the key is released and the next call runs fn again.
// Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent or is a replayed *StoredError.
func IsPermanent(err error) bool {
	var p *permanentError
	var s *StoredError
	return errors.As(err, &p) || errors.As(err, &s)
}

// StoredError is the permanent failure of an earlier attempt, replayed from
// the record. Its Error is the original error's message.
type StoredError struct {
	// Message is the text of the original error.
	Message string
}

// Error returns the original error's message.
func (e *StoredError) Error() string { return e.Message }

// tooLarge describes a result over the limit; its message is what is stored.
func tooLarge(size, limit int) error {
	return fmt.Errorf("%w: %d bytes exceeds the limit of %d bytes", ErrTooLarge, size, limit)
}
