// verdict.go: Verdict, what an error of Do means for whoever answers it:
// the one classifier that Ack, the events and the integrations share.

package idem

import (
	"context"
	"errors"
	"strconv"
)

// Verdict is what Do's error means for whoever answers the call: an HTTP
// or gRPC handler, a message consumer. VerdictOf finds it once; an
// integration maps verdicts to its transport (a status code, an XACK, a
// dead letter) instead of classifying errors itself, so that every
// integration answers a sentinel the same way, and a new sentinel takes
// one edit.
type Verdict int

// The verdicts, from VerdictOf.
const (
	// VerdictOutcome: Do returned the key's outcome (fn's, or a replay).
	// Also for ErrStepAfterCommit: the committed outcome stands.
	VerdictOutcome Verdict = iota
	// VerdictFailure: a permanent failure, stored and replayed
	// (Permanent, a *StoredError).
	VerdictFailure
	// VerdictConflict: the key was used with other parameters
	// (ErrConflict).
	VerdictConflict
	// VerdictLateRetry: a tombstone says the key's operation ran, and its
	// outcome is no longer kept (ErrLateRetry).
	VerdictLateRetry
	// VerdictTooLarge: the result was over WithMaxResultSize; a failure
	// saying so is stored (ErrTooLarge).
	VerdictTooLarge
	// VerdictUndecodable: a stored result does not decode into Do[T]'s
	// type (ErrDecode): the outcome is stored, this caller cannot read it.
	VerdictUndecodable
	// VerdictInProgress: another attempt holds the key (ErrInProgress).
	VerdictInProgress
	// VerdictParked: the operation is parked until an operator acts
	// (ErrParked).
	VerdictParked
	// VerdictUnknownOutcome: a step's effect could not be settled; the
	// operation is parked for an operator (ErrUnknownOutcome).
	VerdictUnknownOutcome
	// VerdictNotRecorded: fn may have run, and its outcome is not known
	// to be kept (ErrNotRecorded, ErrLeaseLost, ErrNotReplicated): the
	// next attempt finds out.
	VerdictNotRecorded
	// VerdictInvalidKey: the key is empty or too long (ErrInvalidKey).
	VerdictInvalidKey
	// VerdictUnusable: the record is not one this version can use, or
	// Do[T]'s type cannot be stored (ErrCorrupt, ErrEncode before fn ran).
	VerdictUnusable
	// VerdictUnavailable: Redis cannot be reached or refuses, or the
	// Client is closed (ErrUnavailable, ErrClosed).
	VerdictUnavailable
	// VerdictContext: the caller's own context ended (context.Canceled,
	// context.DeadlineExceeded).
	VerdictContext
	// VerdictTransient: fn failed transiently and the key was released,
	// or the record vanished while the call waited (ErrExpired), or any
	// other error: the next attempt runs fn.
	VerdictTransient
)

var verdictNames = [...]string{
	VerdictOutcome: "outcome", VerdictFailure: "failure", VerdictConflict: "conflict",
	VerdictLateRetry: "late retry", VerdictTooLarge: "too large", VerdictUndecodable: "undecodable",
	VerdictInProgress: "in progress", VerdictParked: "parked", VerdictUnknownOutcome: "outcome unknown",
	VerdictNotRecorded: "not recorded", VerdictInvalidKey: "invalid key", VerdictUnusable: "unusable",
	VerdictUnavailable: "unavailable", VerdictContext: "context", VerdictTransient: "transient",
}

// String returns the verdict's name, such as "late retry".
func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Settled reports whether the key's outcome is stored, so that a
// redelivery or a retry would only replay it: a message may be
// acknowledged. True for outcome, failure, conflict, late retry, too
// large and undecodable.
func (v Verdict) Settled() bool {
	switch v {
	case VerdictOutcome, VerdictFailure, VerdictConflict, VerdictLateRetry, VerdictTooLarge, VerdictUndecodable:
		return true
	}
	return false
}

// DeadLetter reports whether no retry can cure the call and nothing is
// stored: a message belongs in a dead-letter queue, neither acknowledged
// (it would be lost) nor redelivered (it would fail again). True for an
// invalid key and an unusable record.
func (v Verdict) DeadLetter() bool { return v == VerdictInvalidKey || v == VerdictUnusable }

// VerdictOf returns what err, an error of Do (or Client.Do, Result), means.
// Errors that Do joins are read in this order: not recorded (it is joined
// with fn's own permanent error when that could not be stored), in
// progress (joined with the caller's context error), outcome unknown
// (which also matches ErrParked), parked, then the rest.
func VerdictOf(err error) Verdict {
	switch {
	case err == nil, errors.Is(err, ErrStepAfterCommit):
		return VerdictOutcome
	case errors.Is(err, ErrNotRecorded), errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotReplicated):
		return VerdictNotRecorded
	case errors.Is(err, ErrInProgress):
		return VerdictInProgress
	case errors.Is(err, ErrUnknownOutcome):
		return VerdictUnknownOutcome
	case errors.Is(err, ErrParked):
		return VerdictParked
	case errors.Is(err, ErrConflict):
		return VerdictConflict
	case errors.Is(err, ErrLateRetry):
		return VerdictLateRetry
	case errors.Is(err, ErrTooLarge):
		return VerdictTooLarge
	case errors.Is(err, ErrDecode):
		return VerdictUndecodable
	case IsPermanent(err):
		return VerdictFailure
	case errors.Is(err, ErrInvalidKey):
		return VerdictInvalidKey
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrEncode):
		return VerdictUnusable
	case errors.Is(err, ErrClosed), errors.Is(err, ErrUnavailable):
		return VerdictUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return VerdictContext
	}
	return VerdictTransient
}
