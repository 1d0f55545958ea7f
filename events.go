// events.go: what a Client tells about its calls: the Event, the Observer
// that receives them (WithObserver), CallInfo, which tells one caller what
// became of its own call, and the notes that the call path takes.

package idem

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EventKind says what an Event reports. Every call of Do ends in exactly
// one outcome (see EventKind.Outcome); on its way it may also have waited
// for another owner (EventWaited) and taken the key over from an earlier
// attempt (EventTookOver).
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
// exactly one), not a step on its way (EventWaited, EventTookOver).
func (k EventKind) Outcome() bool {
	return k != EventWaited && k != EventTookOver && k != 0 && int(k) < len(kindNames)
}

// Ran reports whether a call with outcome k ran fn: executed, failed,
// released, lease lost or not recorded.
func (k EventKind) Ran() bool {
	switch k {
	case EventExecuted, EventFailed, EventReleased, EventLeaseLost, EventNotRecorded:
		return true
	}
	return false
}

// An Event reports one outcome, or one step, of a call of Do (see
// EventKind). Events reach the Observers given to WithObserver when the
// call ends, in the order they happened: a wait, a takeover, then the
// outcome.
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
	// the ages of real retries with the retention (WithRetention).
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
}

// An Observer receives the events of a Client's calls (WithObserver).
// Observe is called on the caller's goroutine when its call ends, once per
// event: it must be quick and safe for concurrent use, and should hand
// slow work (network I/O) elsewhere. ctx is the call's context (carrying
// what the caller put in it); it may be done already.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// A CallStarter is an Observer that also hears of each call as it starts,
// before the claim: the context StartCall returns is the one the call runs
// with, fn's context derives from it, and Observe later gets it (or one
// derived from it). A tracer starts a span there, so that what fn does
// nests under it (see the otelidem module).
type CallStarter interface {
	StartCall(ctx context.Context) context.Context
}

// WithObserver adds an Observer that receives an Event for every step and
// outcome of every call of Do (see Event). It may be given more than once:
// each observer gets every event, in the order they were given. Without
// observers, and without WithCallInfo, calls take no notes: they cost no
// allocation and no clock reading more.
// The default is no observer.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.problem("WithObserver(nil): give an Observer")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// WithEventKeySecret sets the secret of the keyed digest (HMAC-SHA256)
// that stands for the key in events (Event.Key): keys may carry personal
// or guessable data, which a plain hash would not hide. Give every
// instance of a service the same secret, at least 16 bytes (32 random
// bytes, say), so that their digests of one key agree and can be matched
// across logs and traces.
// The default is a random secret per process: digests agree within a
// process only.
func WithEventKeySecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) < 16 {
			c.problem("WithEventKeySecret: the secret has %d bytes, want at least 16", len(secret))
			return
		}
		c.eventSecret = append([]byte(nil), secret...)
	}
}

// WithRawEventKeys makes events carry the key itself (Event.RawKey) as well
// as its digest. Turn it on only where keys are not sensitive and the
// observer's output (logs, traces) is as private as Redis.
// The default is false: events carry the digest only.
func WithRawEventKeys(raw bool) Option {
	return func(c *config) { c.rawEventKeys = raw }
}

// CallInfo tells a caller what became of its own call of Do: pass Do a
// context made by WithCallInfo, and read the CallInfo after Do returned.
// An HTTP handler, for one, marks a replayed response with it.
type CallInfo struct {
	// Outcome is the call's outcome (see EventKind.Outcome).
	Outcome EventKind
	// Attempt is the attempt number, as in Event.Attempt.
	Attempt int64
	// Duration is the call's duration, and Wait the part of it spent
	// waiting for another owner.
	Duration, Wait time.Duration
}

// Replayed reports whether the call returned a stored outcome without
// running fn.
func (i *CallInfo) Replayed() bool { return i.Outcome == EventReplayed }

// Ran reports whether this call ran fn, whatever became of its result.
func (i *CallInfo) Ran() bool { return i.Outcome.Ran() }

// WithCallInfo returns a context that makes the Do it is given to fill in
// info when it returns (panics included). One CallInfo serves one call at
// a time; calls made inside fn do not see it.
func WithCallInfo(ctx context.Context, info *CallInfo) context.Context {
	callInfoUsed.Store(true)
	return context.WithValue(ctx, callInfoKey{}, info)
}

type callInfoKey struct{}

// callInfoUsed is set once any context carries a CallInfo: until then,
// calls of Clients without observers do not look for one.
var callInfoUsed atomic.Bool

// observed reports whether a call with ctx takes notes for events or a
// CallInfo.
func (c *Client) observed(ctx context.Context) bool {
	return c != nil && (len(c.cfg.observers) > 0 || (callInfoUsed.Load() && ctx.Value(callInfoKey{}) != nil))
}

// doObserved is Do for a call that takes notes: it runs the call with a
// context that carries its notes, and reports them when the call ends.
func (c *Client) doObserved(ctx context.Context, key, fingerprint string, fn func(context.Context) ([]byte, error)) (res []byte, err error) {
	for _, o := range c.cfg.observers {
		if s, ok := o.(CallStarter); ok {
			ctx = s.StartCall(ctx)
		}
	}
	info, _ := ctx.Value(callInfoKey{}).(*CallInfo)
	cc := &callCtx{Context: ctx, st: callState{c: c, key: key, info: info, start: time.Now()}}
	returned := false
	defer func() { c.report(cc, &cc.st, err, returned) }()
	res, err = c.do(cc, key, fingerprint, fn)
	returned = true
	return res, err
}

// callCtx is the context of an observed call: the caller's, with the
// call's notes. It hides the caller's CallInfo, which is this call's alone.
type callCtx struct {
	context.Context
	st callState
}

type callKey struct{}

// Value returns the call's notes for callKey, and nil for callInfoKey.
func (c *callCtx) Value(key any) any {
	switch key.(type) {
	case callKey:
		return &c.st
	case callInfoKey:
		return nil
	}
	return c.Context.Value(key)
}

// callState holds the notes of one observed call, taken on the call's
// goroutine as it goes (the leader of in-process duplicates runs on its
// own caller's goroutine).
type callState struct {
	c     *Client
	key   string
	info  *CallInfo
	start time.Time

	outcome   EventKind // once a step decided it; 0 while undecided
	attempt   int64
	waitStart time.Time     // zero unless waiting now
	waited    bool          // the call waited for another owner
	waitedFor int64         // the attempt it waited for, when known
	wait      time.Duration // waited in all
	waitedAt  time.Duration // since start, when the wait ended
	tookOver  bool          // the call claimed an attempt above 1
	tookAt    time.Duration // since start, when it did
	ownStart  time.Time
	owned     time.Duration
	age       time.Duration // of the record a replay read from Redis; 0 unknown
}

// notes returns the notes of the observed call of key that ctx belongs to,
// or nil.
func (c *Client) notes(ctx context.Context, key string) *callState {
	if len(c.cfg.observers) == 0 && !callInfoUsed.Load() {
		return nil
	}
	st, _ := ctx.Value(callKey{}).(*callState)
	if st == nil || st.c != c || st.key != key {
		return nil // not observed, or a call made inside another's fn
	}
	return st
}

func (st *callState) endWait(now time.Time) {
	if st.waitStart.IsZero() {
		return
	}
	st.waited = true
	st.wait += now.Sub(st.waitStart)
	st.waitedAt = now.Sub(st.start)
	st.waitStart = time.Time{}
}

// observeClaim notes the reply to a claim: kind and n as in claimReply.
func (c *Client) observeClaim(ctx context.Context, key string, kind byte, n int64, age time.Duration) {
	st := c.notes(ctx, key)
	if st == nil {
		return
	}
	now := time.Now()
	st.outcome = 0
	if kind == 'b' {
		if st.waitStart.IsZero() {
			st.waitStart = now
		}
		st.attempt, st.waitedFor = n, n
		return
	}
	st.endWait(now)
	switch kind {
	case 'c':
		st.attempt, st.ownStart = n, now
		if n > 1 {
			st.tookOver, st.tookAt = true, now.Sub(st.start)
		}
	case 'd', 'f':
		st.outcome, st.attempt, st.age = EventReplayed, 0, age
	case 'x':
		st.outcome, st.attempt = EventConflict, 0
	case 't':
		st.outcome, st.attempt = EventLateRetry, 0
	default:
		st.outcome, st.attempt = EventError, 0
	}
}

// observeFollow notes that the call waits for a concurrent call with the
// same key in this process.
func (c *Client) observeFollow(ctx context.Context, key string) {
	if st := c.notes(ctx, key); st != nil && st.waitStart.IsZero() {
		st.waitStart = time.Now()
	}
}

// observeRelease notes that the owner gives its claim back after fn
// failed or panicked; fctx is fn's context, whose cause tells whether the
// lease was lost meanwhile.
func (c *Client) observeRelease(fctx context.Context, key string) {
	st := c.notes(fctx, key)
	if st == nil {
		return
	}
	st.owned = time.Since(st.ownStart)
	st.outcome = EventReleased
	if errors.Is(context.Cause(fctx), ErrLeaseLost) {
		st.outcome = EventLeaseLost
	}
}

// observeStored notes how recording fn's outcome ended: serr is the
// error of complete, err fn's permanent failure or nil.
func (c *Client) observeStored(ctx context.Context, key string, serr, err error) {
	st := c.notes(ctx, key)
	if st == nil {
		return
	}
	st.owned = time.Since(st.ownStart)
	switch {
	case errors.Is(serr, ErrLeaseLost):
		st.outcome = EventLeaseLost
	case serr != nil:
		st.outcome = EventNotRecorded
	case err != nil:
		st.outcome = EventFailed
	default:
		st.outcome = EventExecuted
	}
}

// observeLedger notes an outcome that the ledger decided: this call's own
// commit (mine; a stored failure when failed), or an earlier attempt's,
// replayed.
func (c *Client) observeLedger(ctx context.Context, key string, mine, failed bool) {
	st := c.notes(ctx, key)
	if st == nil {
		return
	}
	switch {
	case !mine:
		st.outcome, st.attempt = EventReplayed, 0
	case failed:
		st.owned, st.outcome = time.Since(st.ownStart), EventFailed
	default:
		st.owned, st.outcome = time.Since(st.ownStart), EventExecuted
	}
}

// errNoReturn is the Err of the outcome of a call that did not return:
// fn panicked (the panic goes on in the caller) or called runtime.Goexit.
var errNoReturn = errors.New("idem: the call did not return: fn panicked or called runtime.Goexit")

// report sends the events of a call that ended with err (returned is false
// when it panicked) and fills in the caller's CallInfo.
func (c *Client) report(ctx context.Context, st *callState, err error, returned bool) {
	now := time.Now()
	st.endWait(now) // a wait that ended without a claim
	outcome := st.outcome
	switch {
	case !returned:
		if outcome != EventReleased && outcome != EventLeaseLost {
			outcome = EventError
		}
		err = errNoReturn
	case outcome == 0:
		outcome = outcomeOf(err)
	}
	if outcome == EventReplayed && !IsPermanent(err) {
		err = nil
	}
	e := Event{Kind: outcome, Attempt: st.attempt, Duration: now.Sub(st.start), Wait: st.wait, Err: err}
	if outcome == EventReplayed && st.age > 0 {
		e.Age = st.age
	}
	if outcome.Ran() {
		e.Owned = st.owned
	}
	if info := st.info; info != nil {
		*info = CallInfo{Outcome: outcome, Attempt: e.Attempt, Duration: e.Duration, Wait: e.Wait}
	}
	if len(c.cfg.observers) == 0 {
		return
	}
	e.Key = c.eventKey(st.key)
	e.Err = c.redact(st.key, e.Key, err)
	if c.cfg.rawEventKeys {
		e.RawKey = st.key
	}
	if st.waited {
		w := e
		w.Kind, w.Attempt, w.Duration, w.Wait, w.Owned, w.Err = EventWaited, st.waitedFor, st.waitedAt, st.wait, 0, nil
		c.emit(ctx, w)
	}
	if st.tookOver {
		t := e
		t.Kind, t.Duration, t.Wait, t.Owned, t.Err = EventTookOver, st.tookAt, 0, 0, nil
		c.emit(ctx, t)
	}
	c.emit(ctx, e)
}

// outcomeOf tells the outcome of a call that no step decided: it failed
// before it reached Redis, or shared the outcome of a concurrent call in
// this process, or its wait ended.
func outcomeOf(err error) EventKind {
	switch {
	case err == nil, IsPermanent(err):
		return EventReplayed
	case errors.Is(err, ErrConflict):
		return EventConflict
	case errors.Is(err, ErrInProgress):
		return EventInProgress
	case errors.Is(err, ErrLateRetry):
		return EventLateRetry
	}
	return EventError
}

func (c *Client) emit(ctx context.Context, e Event) {
	for _, o := range c.cfg.observers {
		o.Observe(ctx, e)
	}
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

// LogObserver returns an Observer that logs events to l: lost leases and
// unrecorded outcomes at Error (fn acted and its outcome is not stored),
// takeovers, errors and calls that ran out of wait at Warn, the rest at
// Debug. Each record carries the kind, the key's digest, the attempt, the
// durations and the error, whose message names the key by its digest (the
// key itself only with WithRawEventKeys(true), as Client.LogAttrs says).
func LogObserver(l *slog.Logger) Observer {
	return ObserverFunc(func(ctx context.Context, e Event) {
		level := slog.LevelDebug
		switch e.Kind {
		case EventLeaseLost, EventNotRecorded:
			level = slog.LevelError
		case EventTookOver, EventError, EventInProgress:
			level = slog.LevelWarn
		}
		if !l.Enabled(ctx, level) {
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
		if e.Err != nil {
			attrs = append(attrs, slog.Any("error", e.Err))
		}
		l.LogAttrs(ctx, level, "idem: "+strings.ReplaceAll(e.Kind.String(), "_", " "), attrs...)
	})
}
