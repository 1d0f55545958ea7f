package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// An outcome that the ledger decided, not Redis, is an event of its own
// (ledger_replayed), with the call's attempt and the row's age: a
// takeover's lookup that finds the dead owner's commit, a commit that
// meets the row after Redis lost the record, and a lookup of
// WithLedgerLookups after Redis lost it. Plain replays from Redis stay
// "replayed".
func TestEventLedgerReplayed(t *testing.T) {
	t.Parallel()
	const lease = 500 * time.Millisecond
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	l.age.Store(int64(90 * time.Second))
	c, rec := observed(t, b, idem.WithLedger(l), idem.WithLease(lease), idem.WithWait(0))
	commitV := func(v string) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			return []byte(v), commit(ctx, l, []byte(v))
		}
	}
	want := func(what string, ev []idem.Event, kinds string, attempt int64) {
		t.Helper()
		mustKinds(t, ev, kinds)
		last := ev[len(ev)-1]
		if last.Attempt != attempt || last.Age != 90*time.Second || last.Err != nil || last.Kind.Ran() {
			t.Fatalf("%s: %+v; want attempt %d, age 90s, no error, Ran false", what, last, attempt)
		}
	}

	// A takeover's lookup finds what a dead owner committed.
	l.mu.Lock()
	l.entries["dead"] = idem.Entry{Key: "dead", FingerprintDigest: "", Attempt: 1, Value: []byte("receipt")}
	l.mu.Unlock()
	b.Do(t, "SET", "idem:{dead}", idemtest.InProgress("dead-owner", 1, time.Hour, lease), "PX", time.Hour.Milliseconds())
	b.Advance(t, lease+100*time.Millisecond)
	if got, err := c.Do(ctx, "dead", "fp", l.fnFails(t)); err != nil || string(got) != "receipt" {
		t.Fatalf("takeover: %q, %v", got, err)
	}
	want("takeover", rec.take(), "took_over,ledger_replayed", 2)

	// Then a replay from Redis is a plain replay.
	if _, err := c.Do(ctx, "dead", "fp", l.fnFails(t)); err != nil {
		t.Fatal(err)
	}
	mustKinds(t, rec.take(), "replayed")

	// Redis lost the record; the next attempt's commit meets the row.
	if _, err := c.Do(ctx, "lost", "fp", commitV("first")); err != nil {
		t.Fatal(err)
	}
	mustKinds(t, rec.take(), "executed")
	b.Do(t, "FLUSHALL")
	if got, err := c.Do(ctx, "lost", "fp", commitV("second")); err != nil || string(got) != "first" {
		t.Fatalf("after FLUSHALL: %q, %v", got, err)
	}
	want("commit met the row", rec.take(), "ledger_replayed", 1)

	// With lookups on every claim, the lookup finds it before fn runs.
	lk, lrec := observed(t, b, idem.WithLedger(l), idem.WithLease(lease), idem.WithLedgerLookups(true))
	b.Do(t, "FLUSHALL")
	if got, err := lk.Do(ctx, "lost", "fp", l.fnFails(t)); err != nil || string(got) != "first" {
		t.Fatalf("lookup after FLUSHALL: %q, %v", got, err)
	}
	want("lookup", lrec.take(), "ledger_replayed", 1)

	// A recorded failure, found by a commit: ledger_replayed, with the
	// *StoredError that Do returned.
	if _, err := c.Do(ctx, "declined", "fp", func(ctx context.Context) ([]byte, error) {
		return nil, commitFailure(ctx, l, errors.New("declined"))
	}); err == nil {
		t.Fatal("the committed failure: no error")
	}
	rec.take()
	b.Do(t, "FLUSHALL")
	_, err := c.Do(ctx, "declined", "fp", commitV("w"))
	var se *idem.StoredError
	if !errors.As(err, &se) {
		t.Fatalf("the recorded failure after FLUSHALL: %v; want a *StoredError", err)
	}
	ev := rec.take()
	mustKinds(t, ev, "ledger_replayed")
	if !errors.As(ev[0].Err, &se) {
		t.Fatalf("event error %v; want the *StoredError", ev[0].Err)
	}
}

// LogObserver logs a ledger_replayed outcome at Warn: Redis lost or never
// finished the record, and the ledger saved the call.
func TestEventLedgerReplayedLogged(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := b.Idem(t, idem.WithLedger(l), idem.WithObserver(idem.LogObserver(logger)))
	fn := func(v string) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) { return []byte(v), commit(ctx, l, []byte(v)) }
	}
	if _, err := c.Do(ctx, "k", "fp", fn("first")); err != nil {
		t.Fatal(err)
	}
	b.Do(t, "FLUSHALL")
	if _, err := c.Do(ctx, "k", "fp", fn("second")); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "level=WARN") || !strings.Contains(got, "event=ledger_replayed") {
		t.Fatalf("log %q; want one Warn line for ledger_replayed", got)
	}
}
