package otelidem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
)

// ledger is an idem.Ledger in memory, and ledgerTx a transaction of it: a
// commit adds the key's entry unless it has one.
type ledger struct {
	mu      sync.Mutex
	entries map[string]idem.Entry
}

func (l *ledger) Lookup(_ context.Context, key string) (idem.Entry, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	e.Age = time.Minute
	return e, ok, nil
}

func (l *ledger) MaxKeyLen() int { return 0 }

type ledgerTx struct{ l *ledger }

func (tx ledgerTx) Commit(_ context.Context, e idem.Entry) (idem.Entry, bool, error) {
	tx.l.mu.Lock()
	defer tx.l.mu.Unlock()
	if old, ok := tx.l.entries[e.Key]; ok {
		old.Age = time.Minute
		return old, true, nil
	}
	tx.l.entries[e.Key] = e
	return idem.Entry{}, false, nil
}

func (ledgerTx) Rollback(context.Context) error { return nil }

// An outcome that the ledger gave after Redis lost the record is counted
// under idem.outcome="ledger_replayed", not "replayed", with the row's age
// in idem.replay.age, and so is the span's outcome.
func TestLedgerReplayedOutcome(t *testing.T) {
	l := &ledger{entries: map[string]idem.Entry{}}
	c, mr, reader, spans := setup(t, idem.WithLedger(l))
	ctx := context.Background()
	fn := func(v string) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			return []byte(v), idem.Commit(ctx, ledgerTx{l}, []byte(v))
		}
	}
	if _, err := c.Do(ctx, "order-1", "a", fn("first")); err != nil {
		t.Fatal(err)
	}
	mr.FlushAll() // Redis lost the record
	if got, err := c.Do(ctx, "order-1", "a", fn("second")); err != nil || string(got) != "first" {
		t.Fatalf("after FLUSHALL: %q, %v; want the ledger's first", got, err)
	}
	if _, err := c.Do(ctx, "order-1", "a", fn("third")); err != nil { // from Redis again
		t.Fatal(err)
	}
	sums, hists := collect(t, reader)
	for k, want := range map[string]int64{"executed": 1, "ledger_replayed": 1, "replayed": 1} {
		if got := sums["idem.calls/"+k]; got != want {
			t.Errorf("idem.calls{%s} = %d, want %d (all: %v)", k, got, want, sums)
		}
	}
	if hists["idem.replay.age/"] != 2 { // the ledger row's, then the Redis record's
		t.Errorf("idem.replay.age has %d samples, want 2: the ledger row's age and the Redis record's (all: %v)", hists["idem.replay.age/"], hists)
	}
	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	a := attrs(ended[1].Attributes())
	if got := a[otelidem.AttrOutcome].AsString(); got != "ledger_replayed" || a[otelidem.AttrReplayAge].AsFloat64() != 60 {
		t.Errorf("span after FLUSHALL: %v; want outcome ledger_replayed, replay age 60", ended[1].Attributes())
	}
}
