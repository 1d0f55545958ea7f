// events.go: what a Client tells about its calls: the Event, its
// EventKind, the Observer that receives them (WithObserver), and
// LogObserver.

package idem

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EventKind says what an Event reports. Every call of Do ends in exactly
// one outcome (see EventKind.Outcome); on its way it may also have waited
// for another owner (EventWaited), taken the key over from an earlier
// attempt (EventTookOver) and reconciled checked steps (EventReconciled).
type EventKind uint8

// The kinds of events.
const (
	// EventExecuted: fn ran in this call and its result was stored.
	EventExecuted EventKind = iota + 1
	// EventReplayed: the call returned a stored outcome, a result or a
	// permanent failure (a *StoredError), without running fn; also a call
	// that shared the outcome of a concurrent call with the same key and
	// fingerprint in this process.
	EventReplayed
	// EventConflict: the key was used before with other parameters
	// (ErrConflict). fn did not run.
	EventConflict
	// EventWaited: the call waited Event.Wait for another owner of the key
	// (in this process or another) before it went on. A step, not an
	// outcome: the call's outcome follows.
	EventWaited
	// EventTookOver: the call claimed the key for attempt Event.Attempt,
	// above 1: an earlier attempt failed, or its owner's lease ended
	// (crashed, paused, cut off). A step, not an outcome.
	EventTookOver
	// EventLeaseLost: fn ran, but the call lost its lease, to a newer
	// owner or to a renewal that failed until the lease ended: its outcome
	// was not stored (ErrLeaseLost, or fn's error after its context was
	// cancelled for that reason).
	EventLeaseLost
	// EventReleased: fn returned an error not marked Permanent, or
	// panicked: the claim was given back and the next call runs fn again.
	EventReleased
	// EventFailed: fn's permanent failure (Permanent, or a result over
	// WithMaxResultSize) was stored; later calls replay it.
	EventFailed
	// EventNotRecorded: fn ran, but its outcome could not be stored
	// (ErrNotRecorded): the key stays claimed until the lease ends, and
	// the next call runs fn again as a higher attempt.
	EventNotRecorded
	// EventInProgress: another owner held the key and its outcome did not
	// arrive within the wait or the caller's context (ErrInProgress).
	EventInProgress
	// EventError: any other error: Redis unreachable or failing, a corrupt
	// record, an invalid key, a closed Client. fn did not run.
	EventError
	// EventLateRetry: the key's record was gone and its tombstone left
	// (WithTombstones): a retry later than the retention (ErrLateRetry).
	// fn did not run.
	EventLateRetry
	// EventLedgerReplayed: the call returned an outcome that the ledger
	// (WithLedger) held, not Redis: a takeover's lookup found an earlier
	// attempt's commit, or fn's commit met the row of another attempt (two
	// live owners, or Redis lost the record: fn's transaction was rolled
	// back), or a lookup of WithLedgerLookups found it after Redis lost
	// the record. The record is finished from the row. Attempt is the
	// call's own, Age the row's (Entry.Age). A conflict with the ledger's
	// row is EventConflict.
	EventLedgerReplayed
	// EventParked: fn ran, and a checked step of it (StepChecked) is
	// parked: its outcome is unknown. The claim was given back, nothing
	// was stored, and every call gets ErrUnknownOutcome until an operator
	// resolves the step (Resolve, ResolveNotApplied). Also the outcome of
	// a recovery (Client.Recover) that parked its operation after
	// WithMaxRecoveries recoveries did not finish it: every call gets
	// ErrParked until Retry.
	EventParked
	// EventReconciled: a checked step of fn (StepChecked, named by
	// Event.Step) asked its provider whether its effect happened, and
	// Event.Check is what settled it: CheckApplied (check's value was
	// checkpointed; act did not run), CheckNotApplied (after the settle
	// time: act ran again) or CheckUnknown (ReconcileFor ended: the step
	// is parked). One event per reconciliation; a reconciliation that
	// fn's context cut short makes none. A step, not an outcome.
	EventReconciled
	// EventRecovered: a Recover loop finished, as attempt Event.Attempt,
	// an operation that its caller had left unfinished (see
	// Client.Recover), with a result or a permanent failure. It follows
	// the events of the recovery's own call (a takeover, then its
	// outcome): a step, not an outcome. A recovery that parks the
	// operation (WithMaxRecoveries) ends with EventParked instead.
	EventRecovered
)

var kindNames = [...]string{
	EventExecuted:    "executed",
	EventReplayed:    "replayed",
	EventConflict:    "conflict",
	EventWaited:      "waited",
	EventTookOver:    "took_over",
	EventLeaseLost:   "lease_lost",
	EventReleased:    "released",
	EventFailed:      "failed",
	EventNotRecorded: "not_recorded",
	EventInProgress:  "in_progress",
	EventError:       "error",
	EventLateRetry:   "late_retry",

	EventLedgerReplayed: "ledger_replayed",
	EventParked:         "parked",
	EventReconciled:     "reconciled",
	EventRecovered:      "recovered",
}

// String returns the kind's name in snake case, such as "lease_lost",
// fit for a metric label.
func (k EventKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Outcome reports whether k is the outcome of a call (every call has
// exactly one), not a step on its way (EventWaited, EventTookOver,
// EventReconciled, EventRecovered).
func (k EventKind) Outcome() bool {
	return k != EventWaited && k != EventTookOver && k != EventReconciled && k != EventRecovered && k != 0 && int(k) < len(kindNames)
}

// Ran reports whether a call with outcome k ran fn: executed, failed,
// released, lease lost, not recorded or parked.
func (k EventKind) Ran() bool {
	switch k {
	case EventExecuted, EventFailed, EventReleased, EventLeaseLost, EventNotRecorded, EventParked:
		return true
	}
	return false
}

// An Event reports one outcome, or one step, of a call of Do (see
// EventKind). Events reach the Observers given to WithObserver when the
// call ends, in the order they happened: a wait, a takeover, the
// reconciliations, then the outcome.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Key identifies the idempotency key without revealing it: the first
	// 16 bytes of HMAC-SHA256(secret, key), in hex (32 characters). The
	// secret is the one given to WithEventKeySecret or, without it, a
	// random one per process: then the digests of one key agree within a
	// process only.
	Key string
	// RawKey is the key itself with WithRawEventKeys(true); "" otherwise.
	RawKey string
	// Attempt is the attempt number involved: the call's own for the
	// outcomes of a call that ran fn and for EventTookOver; the one it
	// waited for for EventWaited and EventInProgress; 0 when unknown
	// (replays, conflicts, errors before a claim).
	Attempt int64
	// Duration is the time from the start of the call to this event: for
	// an outcome, the call's whole duration.
	Duration time.Duration
	// Wait is the time the call waited for another owner: the wait's for
	// EventWaited, the call's in all for an outcome; 0 if it did not wait.
	Wait time.Duration
	// Age is, for EventReplayed, how long ago the replayed outcome was
	// recorded, when the call read it from Redis (0 when it shared a
	// concurrent call's outcome, or read it from a notification): compare
	// the ages of real retries with the retention (WithRetention). For
	// EventLedgerReplayed, the age of the ledger's row (Entry.Age).
	Age time.Duration
	// Owned is, for an outcome of a call that ran fn, how long it owned
	// the key: from its claim to its outcome's recording, or to the
	// release (fn's run time plus a round trip to Redis); 0 otherwise.
	Owned time.Duration
	// Err is the error Do returned, for an outcome; nil for a step and for
	// executed and replayed calls (a replayed permanent failure carries
	// its *StoredError). Unless WithRawEventKeys(true), it wraps that error
	// with the key in its message replaced by the digest (see
	// Client.LogAttrs): errors.Is and errors.As see the error Do returned,
	// and a log of Err.Error() does not reveal the key.
	Err error
	// Step is, for EventReconciled, the checked step's name; "" otherwise.
	Step string
	// Check is, for EventReconciled, the answer that settled the step
	// (CheckUnknown: it was parked); CheckUnknown otherwise.
	Check Check
}

// An Observer receives the events of a Client's calls (WithObserver).
// Observe is called on the caller's goroutine when its call ends, once per
// event: it must be quick and safe for concurrent use, and should hand
// slow work (network I/O) elsewhere. ctx is the call's context (carrying
// what the caller put in it); it may be done already.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// A CallStarter is an Observer that also hears of each call as it starts,
// before the claim: the context StartCall returns is the one the call runs
// with, fn's context derives from it, and Observe later gets it (or one
// derived from it). A tracer starts a span there, so that what fn does
// nests under it (see the otelidem module).
type CallStarter interface {
	StartCall(ctx context.Context) context.Context
}

// eventKey returns the digest of key that events carry (see Event.Key).
func (c *Client) eventKey(key string) string {
	secret := c.cfg.eventSecret
	if secret == nil {
		secret = processSecret()
	}
	return EventKeyDigest(secret, key)
}

// processSecret is the secret of event key digests without
// WithEventKeySecret: random, one per process.
var processSecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand documents it)
	return b
})

// EventKeyDigest returns the digest that stands for key in the events of
// Clients made with WithEventKeySecret(secret) (see Event.Key): for
// matching a key an operator knows against logs and traces.
func EventKeyDigest(secret []byte, key string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// LogObserver returns an Observer that logs events to l: lost leases,
// unrecorded outcomes and parked steps at Error (fn acted and its outcome
// is not stored); takeovers, errors, calls that ran out of wait, outcomes
// the ledger decided (Redis had lost or not finished the record),
// reconciliations (a provider's answer was lost) and recoveries (a caller
// left its operation unfinished) at Warn; the rest at
// Debug. Each record carries the kind, the key's digest, the attempt, the
// durations and the error, whose message names the key by its digest (the
// key itself only with WithRawEventKeys(true), as Client.LogAttrs says); a
// reconciliation's also the step and the check ("applied", "not applied",
// "unknown").
func LogObserver(l *slog.Logger) Observer {
	return logObserver{l}
}

// logObserver is LogObserver's Observer.
type logObserver struct{ l *slog.Logger }

// Observe logs e.
func (o logObserver) Observe(ctx context.Context, e Event) {
	level := slog.LevelDebug
	switch e.Kind {
	case EventLeaseLost, EventNotRecorded, EventParked:
		level = slog.LevelError
	case EventTookOver, EventError, EventInProgress, EventLedgerReplayed, EventReconciled, EventRecovered:
		level = slog.LevelWarn
	}
	if !o.l.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("event", e.Kind.String()), slog.String("key_digest", e.Key),
		slog.Int64("attempt", e.Attempt), slog.Duration("duration", e.Duration),
	}
	if e.RawKey != "" {
		attrs = append(attrs, slog.String("key", e.RawKey))
	}
	if e.Wait > 0 {
		attrs = append(attrs, slog.Duration("wait", e.Wait))
	}
	if e.Owned > 0 {
		attrs = append(attrs, slog.Duration("owned", e.Owned))
	}
	if e.Kind == EventReconciled {
		attrs = append(attrs, slog.String("step", e.Step), slog.String("check", e.Check.String()))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("error", e.Err))
	}
	o.l.LogAttrs(ctx, level, "idem: "+strings.ReplaceAll(e.Kind.String(), "_", " "), attrs...)
}
