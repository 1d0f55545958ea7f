package door

import (
	"errors"
	"slices"

	"github.com/idem-go/idem"
)

// Reason is why a door answered a call itself instead of with its
// handler's response: the one list that every door maps to its
// transport (httpidem to a problem type and status, grpcidem to a code
// and the ErrorInfo reason, which is the Reason's value).
type Reason string

// The reasons.
const (
	// KeyMissing: the call has no key, and the door requires one.
	KeyMissing Reason = "KEY_MISSING"
	// KeyInvalid: the key is empty, too long, sent more than once, or has
	// characters other than visible ASCII.
	KeyInvalid Reason = "KEY_INVALID"
	// KeyReused: the key was used before with another request (another
	// fingerprint); the handler did not run (idem.VerdictConflict).
	KeyReused Reason = "KEY_REUSED"
	// LateRetry: the key was used, and its outcome is no longer kept
	// (only its tombstone is left); the handler did not run again
	// (idem.VerdictLateRetry).
	LateRetry Reason = "LATE_RETRY"
	// InProgress: a call with the key is still running; retry later
	// (idem.VerdictInProgress).
	InProgress Reason = "IN_PROGRESS"
	// BodyTooLarge: the request's body is over the door's limit.
	BodyTooLarge Reason = "BODY_TOO_LARGE"
	// BadRequest: the request could not be read, or its fingerprint could
	// not be taken.
	BadRequest Reason = "BAD_REQUEST"
	// Scope: the call's principal could not be established.
	Scope Reason = "SCOPE_FAILED"
	// NotStored: a call with the key was processed, but its response
	// could not be stored, so it cannot be replayed (idem.VerdictTooLarge,
	// idem.VerdictFailure).
	NotStored Reason = "NOT_STORED"
	// NotRecorded: the handler ran in this call, but its outcome could not
	// be recorded; a retry after the lease may run it again.
	NotRecorded Reason = "NOT_RECORDED"
	// RecordUnusable: the key's record cannot be used (corrupt, or of a
	// format this version cannot read); the handler did not run
	// (idem.VerdictUnusable, idem.VerdictUndecodable).
	RecordUnusable Reason = "RECORD_UNUSABLE"
	// Unavailable: the idempotency store cannot be reached, the service is
	// shutting down, or another transient failure (the key's record
	// expired while the call waited: idem.ErrExpired); the handler did not
	// run here; retry later.
	Unavailable Reason = "STORE_UNAVAILABLE"
	// Parked: the key's operation is parked, unfinished, until an operator
	// retries it (idem.VerdictParked); waiting alone does not help.
	Parked Reason = "PARKED"
	// OutcomeUnknown: a step of the key's operation acted and its effect
	// could not be settled; an operator reconciles it
	// (idem.VerdictUnknownOutcome). Do not start the operation again under
	// a new key.
	OutcomeUnknown Reason = "OUTCOME_UNKNOWN"
	// KeyUnknown: a status check found no operation with the key (for
	// this principal): never run, or its record's retention ended with no
	// tombstone left.
	KeyUnknown Reason = "KEY_UNKNOWN"
	// NotFinished: a status check found the key's operation unfinished,
	// with nothing stored: its last attempt failed transiently (the
	// record is released), and the request, sent again with the key, runs
	// it again.
	NotFinished Reason = "NOT_FINISHED"
)

// Reasons returns every Reason, in the order of their declaration (a new
// slice at each call).
func Reasons() []Reason { return slices.Clone(reasons) }

var reasons = []Reason{
	KeyMissing, KeyInvalid, KeyReused, LateRetry, InProgress, BodyTooLarge, BadRequest,
	Scope, NotStored, NotRecorded, RecordUnusable, Unavailable, Parked, OutcomeUnknown,
	KeyUnknown, NotFinished,
}

var titles = map[Reason]string{
	KeyMissing:     "Idempotency key missing",
	KeyInvalid:     "Invalid idempotency key",
	KeyReused:      "Idempotency key reused with another request",
	LateRetry:      "Idempotency key used, outcome no longer kept",
	InProgress:     "Request with this idempotency key in progress",
	BodyTooLarge:   "Request body too large",
	BadRequest:     "Bad request",
	Scope:          "Principal not established",
	NotStored:      "Response not stored",
	NotRecorded:    "Response not recorded",
	RecordUnusable: "Idempotency record unusable",
	Unavailable:    "Idempotency store unavailable",
	Parked:         "Operation parked",
	OutcomeUnknown: "Outcome unknown, under reconciliation",
	KeyUnknown:     "No operation with this idempotency key",
	NotFinished:    "Operation not finished",
}

// Title returns the reason's short, human-readable summary, the same for
// every call ("Idempotency key reused with another request"), or "" for
// a string that is not one of the Reasons.
func (r Reason) Title() string { return titles[r] }

// Retryable reports whether the same call, retried later with the same
// key, may get another answer: in progress, unavailable, not recorded.
func (r Reason) Retryable() bool {
	return r == InProgress || r == Unavailable || r == NotRecorded
}

// Answer is what a door says to a call whose handler did not run in it:
// AnswerOf's reading of Do's error.
type Answer struct {
	// Verdict is the error's idem.Verdict.
	Verdict idem.Verdict
	// Reason is the answer's reason.
	Reason Reason
	// Detail says what happened to this call, for the caller, naming the
	// key as the door calls it (the header's or metadata's name).
	Detail string
	// Log is the message to log at Error, with the error: the door cannot
	// do its work for this call (Redis unreachable, a record unusable);
	// "" when nothing needs an operator (a conflict, a key in progress, a
	// record that expired while the call waited, the service closing).
	Log string
}

// AnswerOf returns the answer to a call whose Do returned err and whose
// handler did not run here; keyName is what the door calls the key
// ("Idempotency-Key"). It is a look-up of idem.VerdictOf(err), so that
// every door answers every sentinel the same way. A door whose caller's
// context ended answers that first, in its transport's way.
func AnswerOf(err error, keyName string) Answer {
	v := idem.VerdictOf(err)
	a := Answer{Verdict: v}
	switch v {
	case idem.VerdictConflict:
		a.Reason, a.Detail = KeyReused, "this "+keyName+" was used before with another request"
	case idem.VerdictLateRetry:
		a.Reason, a.Detail = LateRetry, "this "+keyName+" was used, and its outcome is no longer kept; the request was not processed again: use a new key for a new operation"
	case idem.VerdictInProgress:
		a.Reason, a.Detail = InProgress, "a request with this "+keyName+" is still being processed; retry later"
	case idem.VerdictParked:
		a.Reason, a.Detail = Parked, "the operation of this "+keyName+" is parked; it runs again only when an operator retries it"
	case idem.VerdictUnknownOutcome:
		a.Reason, a.Detail = OutcomeUnknown, "the outcome of this "+keyName+"'s operation is unknown and under reconciliation by an operator"
	case idem.VerdictInvalidKey:
		a.Reason, a.Detail = KeyInvalid, "the "+keyName+" is too long for this service"
	case idem.VerdictFailure, idem.VerdictTooLarge:
		a.Reason, a.Detail = NotStored, "the request was processed, but its response could not be stored, so it cannot be replayed"
	case idem.VerdictUnusable, idem.VerdictUndecodable, idem.VerdictOutcome:
		a.Reason, a.Detail = RecordUnusable, "the record of this "+keyName+" cannot be used"
		a.Log = "cannot answer from the stored record"
	case idem.VerdictUnavailable:
		a.Reason = Unavailable
		if errors.Is(err, idem.ErrClosed) {
			a.Detail = "the service is shutting down; retry later"
		} else {
			a.Detail = "the idempotency store is unavailable; the request was not processed; retry later"
			a.Log = "cannot reach the idempotency store"
		}
	default:
		// The caller's context, an outcome not recorded elsewhere, a
		// record that expired while this call waited, another error:
		// nothing ran here, and a retry finds out.
		a.Reason, a.Detail = Unavailable, "the request was not processed; retry later"
		if v != idem.VerdictContext && !errors.Is(err, idem.ErrExpired) {
			a.Log = "cannot answer; a retry may"
		}
	}
	return a
}
