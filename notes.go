// notes.go: the notes an observed call takes on its way (the observe
// methods that the call's steps call), and the events they make when it
// ends (report).

package idem

import (
	"context"
	"errors"
	"time"
)

// observed reports whether c's calls take notes: whether it has observers.
func (c *Client) observed() bool { return c != nil && len(c.cfg.observers) > 0 }

// startNotes starts taking notes of the call for the Client's observers:
// it tells the CallStarters, and returns the context the call runs with.
func (cl *call) startNotes(ctx context.Context) context.Context {
	for _, o := range cl.c.cfg.observers {
		if s, ok := o.(CallStarter); ok {
			ctx = s.StartCall(ctx)
		}
	}
	cl.notes = &callNotes{start: time.Now()}
	return ctx
}

// callNotes holds the notes of one observed call, taken on the call's
// goroutine as it goes (the leader of in-process duplicates runs on its
// own caller's goroutine).
type callNotes struct {
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
	settled   []reconciled  // the checked steps' reconciliations, in order
}

func (st *callNotes) endWait(now time.Time) {
	if st.waitStart.IsZero() {
		return
	}
	st.waited = true
	st.wait += now.Sub(st.waitStart)
	st.waitedAt = now.Sub(st.start)
	st.waitStart = time.Time{}
}

// observeClaim notes the reply to a claim: kind and n as in claimReply.
func (cl *call) observeClaim(kind replyKind, n int64, age time.Duration) {
	st := cl.notes
	if st == nil {
		return
	}
	now := time.Now()
	st.outcome = 0
	if kind == replyBusy {
		if st.waitStart.IsZero() {
			st.waitStart = now
		}
		st.attempt, st.waitedFor = n, n
		return
	}
	st.endWait(now)
	switch kind {
	case replyClaimed:
		st.attempt, st.ownStart = n, now
		if n > 1 {
			st.tookOver, st.tookAt = true, now.Sub(st.start)
		}
	case replyDone, replyFailed:
		st.outcome, st.attempt, st.age = EventReplayed, 0, age
	case replyConflict:
		st.outcome, st.attempt = EventConflict, 0
	case replyLateRetry:
		st.outcome, st.attempt = EventLateRetry, 0
	default:
		st.outcome, st.attempt = EventError, 0
	}
}

// observeFollow notes that the call waits for a concurrent call with the
// same key in this process.
func (cl *call) observeFollow() {
	if st := cl.notes; st != nil && st.waitStart.IsZero() {
		st.waitStart = time.Now()
	}
}

// observeRelease notes that the owner gives its claim back after fn
// failed or panicked; fctx is fn's context, whose cause tells whether the
// lease was lost meanwhile.
func (cl *call) observeRelease(fctx context.Context) {
	st := cl.notes
	if st == nil {
		return
	}
	st.owned = time.Since(st.ownStart)
	st.outcome = EventReleased
	if errors.Is(context.Cause(fctx), ErrLeaseLost) {
		st.outcome = EventLeaseLost
	}
}

// observeReconciled notes the reconciliations of the attempt's checked
// steps, once fn returned (or panicked).
func (cl *call) observeReconciled(s *steps) {
	if st := cl.notes; st != nil {
		st.settled = append(st.settled, s.reconciliations()...)
	}
}

// observeParked notes that the attempt ends with a checked step parked:
// the claim given back for an operator.
func (cl *call) observeParked() {
	st := cl.notes
	if st == nil {
		return
	}
	st.owned = time.Since(st.ownStart)
	st.outcome = EventParked
}

// observeStored notes how recording fn's outcome ended: serr is the
// error of complete, err fn's permanent failure or nil.
func (cl *call) observeStored(serr, err error) {
	st := cl.notes
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
// replayed (age is its row's), or a conflict with it (another
// fingerprint's).
func (cl *call) observeLedger(mine, failed, conflict bool, age time.Duration) {
	st := cl.notes
	if st == nil {
		return
	}
	switch {
	case conflict:
		st.outcome, st.attempt = EventConflict, 0
	case !mine:
		st.outcome, st.age = EventLedgerReplayed, age
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
// when it panicked).
func (cl *call) report(ctx context.Context, err error, returned bool) {
	c, st := cl.c, cl.notes
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
	if (outcome == EventReplayed || outcome == EventLedgerReplayed) && !IsPermanent(err) {
		err = nil
	}
	e := Event{Kind: outcome, Attempt: st.attempt, Duration: now.Sub(st.start), Wait: st.wait, Err: err}
	if (outcome == EventReplayed || outcome == EventLedgerReplayed) && st.age > 0 {
		e.Age = st.age
	}
	if outcome.Ran() {
		e.Owned = st.owned
	}
	e.Key = c.eventKey(cl.key)
	e.Err = c.redact(cl.key, e.Key, err)
	if c.cfg.rawEventKeys {
		e.RawKey = cl.key
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
	for _, r := range st.settled {
		x := e
		x.Kind, x.Duration, x.Wait, x.Owned, x.Err = EventReconciled, r.at.Sub(st.start), 0, 0, nil
		x.Step, x.Check = r.name, r.check
		c.emit(ctx, x)
	}
	c.emit(ctx, e)
}

// outcomeOf tells the outcome of a call that no step decided: it failed
// before it reached Redis, or shared the outcome of a concurrent call in
// this process, or its wait ended.
func outcomeOf(err error) EventKind {
	switch VerdictOf(err) {
	case VerdictOutcome, VerdictFailure, VerdictTooLarge:
		return EventReplayed
	case VerdictConflict:
		return EventConflict
	case VerdictInProgress:
		return EventInProgress
	case VerdictLateRetry:
		return EventLateRetry
	}
	return EventError
}

func (c *Client) emit(ctx context.Context, e Event) {
	for _, o := range c.cfg.observers {
		o.Observe(ctx, e)
	}
}
