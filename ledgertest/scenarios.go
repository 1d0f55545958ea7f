// scenarios.go: the suite's scenarios. Each states the promise it checks;
// each runs on a backend and a redis-server of its own.

package ledgertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

type scenario struct {
	name string
	run  func(t *testing.T, e *env)
}

var scenarios = []scenario{
	{"ConcurrentCallsOneKey", concurrentCallsOneKey},
	{"ConcurrentOwnersOneKey", concurrentOwnersOneKey},
	{"TwoLiveOwners/EarlierCommitsFirst", func(t *testing.T, e *env) { twoLiveOwners(t, e, true) }},
	{"TwoLiveOwners/LaterCommitsFirst", func(t *testing.T, e *env) { twoLiveOwners(t, e, false) }},
	{"TwoLiveOwners/OtherFingerprint", twoOwnersConflict},
	{"RedisFlushedAfterCompletion", redisFlushedAfterCompletion},
	{"TakeoverFindsTheRow/RetentionHolds", takeoverAndRetention},
	{"Outcomes/Typed", typedOutcome},
	{"Outcomes/Raw", rawOutcome},
	{"Outcomes/CommitError", commitErrorOutcome},
	{"Refusals/ClosedTx", closedTx},
	{"Refusals/OtherDatabase", otherDatabase},
	{"Refusals/UnencodableValue", unencodableValue},
	{"Refusals/OutsideDo", outsideDo},
	{"Refusals/CommitTwice", commitTwice},
	{"Keys/AsBytes", keysAsBytes},
	{"Keys/Limit", keyLimit},
}

// 30 concurrent calls with one key through one Client: one change, one
// row, one receipt for all.
func concurrentCallsOneKey(t *testing.T, e *env) {
	c := e.client()
	const n = 30
	var wg sync.WaitGroup
	got := make([][]byte, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			receipt := []byte(fmt.Sprintf("receipt-%d", i))
			got[i], errs[i] = c.Do(context.Background(), "k", "fp", raw(receipt, e.debit("a", receipt)))
		})
	}
	wg.Wait()
	e.checkOne(t, "k", "a", got, errs)
}

// 30 concurrent calls with one key through 30 Clients that do not share
// their Redis records (each its own prefix: as many live owners as when
// Redis lost a record under load): the ledger alone decides. One change,
// one row, and every caller gets the winner's receipt.
func concurrentOwnersOneKey(t *testing.T, e *env) {
	const n = 30
	clients := make([]*idem.Client, n)
	for i := range clients {
		clients[i] = e.client()
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	got := make([][]byte, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			receipt := []byte(fmt.Sprintf("receipt-%d", i))
			got[i], errs[i] = clients[i].Do(context.Background(), "k", "fp", raw(receipt, e.debit("a", receipt)))
		})
	}
	close(start)
	wg.Wait()
	e.checkOne(t, "k", "a", got, errs)
}

// checkOne checks that every call returned the ledger's one entry for key,
// and that account moved once.
func (e *env) checkOne(t *testing.T, key, account string, got [][]byte, errs []error) {
	t.Helper()
	en, ok := e.lookup(key)
	if !ok {
		t.Fatalf("no ledger entry for %q after %d calls", key, len(got))
	}
	for i := range got {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
		} else if !bytes.Equal(got[i], en.Value) {
			t.Errorf("call %d returned %q; the ledger holds %q", i, got[i], en.Value)
		}
	}
	if m := e.movements(account); m != 1 {
		t.Fatalf("%d movements of %q; want 1", m, account)
	}
}

// Two live owners of one key (two Clients whose Redis records differ, as
// after a lost record): both run fn at once, both move the account in a
// transaction of their own; the first COMMIT wins, the other's transaction rolls back
// with its movement, its Commit says ErrRecorded, and its Do returns the
// winner's receipt.
func twoLiveOwners(t *testing.T, e *env, earlierFirst bool) {
	ctx := context.Background()
	early, late := e.client(), e.client()
	type owner struct {
		c        *idem.Client
		name     string
		moved    chan struct{}
		go_      chan struct{}
		commit   error
		got      []byte
		err      error
		finished chan struct{}
	}
	run := func(o *owner) {
		defer close(o.finished)
		receipt := []byte("receipt of " + o.name)
		o.got, o.err = o.c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			close(o.moved)
			<-o.go_
			// The transaction begins only now: a database with one writer
			// (SQLite) cannot hold both owners' transactions open at once.
			// ConcurrentOwnersOneKey has them overlap where the database
			// can.
			tx, err := e.b.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if err := tx.Move(ctx, "a"); err != nil {
				_ = tx.Rollback(ctx)
				return nil, err
			}
			o.commit = tx.Commit(ctx, receipt)
			return receipt, o.commit
		})
	}
	mk := func(c *idem.Client, name string) *owner {
		return &owner{c: c, name: name, moved: make(chan struct{}), go_: make(chan struct{}), finished: make(chan struct{})}
	}
	a, b := mk(early, "early"), mk(late, "late")
	go run(a)
	<-a.moved
	go run(b)
	<-b.moved
	first, second := a, b
	if !earlierFirst {
		first, second = b, a
	}
	close(first.go_)
	<-first.finished
	close(second.go_)
	<-second.finished

	if first.err != nil || first.commit != nil {
		t.Fatalf("the first to commit (%s): Commit %v, Do %v; want both nil", first.name, first.commit, first.err)
	}
	if !errors.Is(second.commit, idem.ErrRecorded) {
		t.Fatalf("the second to commit (%s): Commit returned %v; want ErrRecorded", second.name, second.commit)
	}
	if second.err != nil || !bytes.Equal(second.got, first.got) {
		t.Fatalf("the second to commit (%s): Do returned %q, %v; want the first's %q", second.name, second.got, second.err, first.got)
	}
	if en, _ := e.lookup("k"); !bytes.Equal(en.Value, first.got) {
		t.Fatalf("the ledger holds %q; want the first commit's %q", en.Value, first.got)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1 (the second owner's rolled back)", m)
	}
	// Each Client now replays the winner's receipt.
	for _, c := range []*idem.Client{early, late} {
		if got, err := c.Do(ctx, "k", "fp", e.mustNotRun("the key is done")); err != nil || !bytes.Equal(got, first.got) {
			t.Fatalf("a retry: %q, %v; want %q", got, err, first.got)
		}
	}
}

// Two live owners with other fingerprints: the second to commit gets
// ErrConflict from Commit and from Do, and nothing of it commits.
func twoOwnersConflict(t *testing.T, e *env) {
	ctx := context.Background()
	c1, c2 := e.client(), e.client()
	if _, err := c1.Do(ctx, "k", "debit 100", raw([]byte("r1"), e.debit("a", []byte("r1")))); err != nil {
		t.Fatal(err)
	}
	var commitErr error
	_, err := c2.Do(ctx, "k", "debit 999", func(ctx context.Context) ([]byte, error) {
		commitErr = e.debit("a", []byte("r2"))(ctx)
		return []byte("r2"), commitErr
	})
	if !errors.Is(commitErr, idem.ErrConflict) || !errors.Is(err, idem.ErrConflict) {
		t.Fatalf("a commit of other parameters: Commit %v, Do %v; want ErrConflict from both", commitErr, err)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1", m)
	}
}

// Redis loses every record after a completion: a retry with the same
// parameters gets the recorded outcome (its fn's transaction rolls back),
// a retry with others gets ErrConflict.
func redisFlushedAfterCompletion(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client()
	if _, err := c.Do(ctx, "k", "fp", raw([]byte("receipt"), e.debit("a", []byte("receipt")))); err != nil {
		t.Fatal(err)
	}
	e.flush()
	got, err := c.Do(ctx, "k", "fp", raw([]byte("second"), e.debit("a", []byte("second"))))
	if err != nil || string(got) != "receipt" {
		t.Fatalf("a retry after FLUSHALL: %q, %v; want the recorded receipt", got, err)
	}
	e.flush()
	if _, err := c.Do(ctx, "k", "other", raw([]byte("third"), e.debit("a", []byte("third")))); !errors.Is(err, idem.ErrConflict) {
		t.Fatalf("a retry after FLUSHALL with other parameters: %v; want ErrConflict", err)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1", m)
	}
}

// The review's scenario. Retention 3 s, lease 0.5 s. An owner commits,
// then its process dies before Redis hears the outcome; 2.5 s after the
// commit a takeover finds the row and finishes the record from it. The
// record must live no longer than the row is kept under the documented
// Prune rule (Prune(now - retention)): while the row is inside the
// retention, a retry after FLUSHALL gets the recorded outcome; once Prune
// has removed the row, Redis holds no record of the key that a retry
// could trust instead of the row.
func takeoverAndRetention(t *testing.T, e *env) {
	const retention, lease = 3 * time.Second, 500 * time.Millisecond
	ctx := context.Background()
	opts := []idem.Option{idem.WithRetention(retention), idem.WithLease(lease), idem.WithStoreTimeout(200 * time.Millisecond)}
	prefix := e.prefix()
	cutRdb, cut := e.cutRedis()
	dying := e.clientAt(cutRdb, prefix, opts...)
	var committed time.Time
	_, _ = dying.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		if err := e.debit("a", []byte("receipt"))(ctx); err != nil {
			return nil, err
		}
		committed = time.Now() // the row is at least this old from here on
		cut()
		return []byte("receipt"), nil
	})
	if committed.IsZero() {
		t.Fatal("the first owner did not commit")
	}
	c := e.clientAt(e.redis, prefix, opts...)
	ttl := func() time.Duration {
		t.Helper()
		st, err := c.Status(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateAbsent {
			return 0
		}
		now, err := e.redis.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return st.Expires.Sub(now)
	}

	time.Sleep(time.Until(committed.Add(2500 * time.Millisecond)))
	if got, err := c.Do(ctx, "k", "fp", e.mustNotRun("the ledger holds the outcome")); err != nil || string(got) != "receipt" {
		t.Fatalf("the takeover: %q, %v; want the committed receipt", got, err)
	}
	// The row is at least 2.5 s old: the record has at most 0.5 s left
	// (1 s allows for a slow machine), not a retention of its own.
	if left := ttl(); left > retention-2*time.Second {
		t.Fatalf("a record finished from a 2.5 s old row expires in %v; want at most %v, what the row has left of the retention", left, retention-2*time.Second)
	}
	// Inside the retention, the documented Prune keeps the row, and a
	// retry after Redis lost the record gets the outcome.
	if _, err := e.b.Prune(ctx, time.Now().Add(-retention)); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.lookup("k"); !ok {
		if time.Since(committed) < retention-200*time.Millisecond {
			t.Fatalf("Prune(now - retention) removed a row %v old; want it kept for the retention", time.Since(committed))
		}
		t.Skipf("the machine is too slow for this scenario: %v passed since the commit", time.Since(committed))
	}
	e.flush()
	if got, err := c.Do(ctx, "k", "fp", raw([]byte("again"), e.debit("a", []byte("again")))); err != nil || string(got) != "receipt" {
		t.Fatalf("a retry after FLUSHALL inside the retention: %q, %v; want the receipt", got, err)
	}
	if left := ttl(); left > retention-2*time.Second {
		t.Fatalf("a record finished from a commit that met an old row expires in %v; want at most %v", left, retention-2*time.Second)
	}
	// Past the retention, Prune removes the row: the record must be gone
	// too, or a retry that Redis still answers could run again once Redis
	// loses it.
	time.Sleep(time.Until(committed.Add(retention + 300*time.Millisecond)))
	n, err := e.b.Prune(ctx, time.Now().Add(-retention))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.lookup("k"); ok || n < 1 {
		t.Fatalf("Prune(now - retention) %v after the commit deleted %d rows and the row is still there; want it deleted", time.Since(committed), n)
	}
	if left := ttl(); left > 0 {
		t.Fatalf("the row is pruned but Redis keeps the record %v longer: a retry then is a new operation to the ledger", left)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1", m)
	}
}

type receipt struct {
	ID     string
	Amount int64
	Lines  []string
}

// Do[T] records a typed result; after Redis lost it, a retry gets it back
// from the ledger, decoded.
func typedOutcome(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client()
	want := receipt{ID: "r-1", Amount: -100, Lines: []string{"debit", ""}}
	fn := func(r receipt) func(ctx context.Context) (receipt, error) {
		return func(ctx context.Context) (receipt, error) { return r, e.debit("a", r)(ctx) }
	}
	if got, err := idem.Do(ctx, c, "k", "fp", fn(want)); err != nil || !equalReceipt(got, want) {
		t.Fatalf("the first call: %+v, %v", got, err)
	}
	e.flush()
	got, err := idem.Do(ctx, c, "k", "fp", fn(receipt{ID: "r-2"}))
	if err != nil || !equalReceipt(got, want) {
		t.Fatalf("a retry after FLUSHALL: %+v, %v; want %+v", got, err, want)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1", m)
	}
}

func equalReceipt(a, b receipt) bool {
	return a.ID == b.ID && a.Amount == b.Amount && strings.Join(a.Lines, "\x00") == strings.Join(b.Lines, "\x00") && len(a.Lines) == len(b.Lines)
}

// Client.Do records raw bytes as they are, including an empty result and
// bytes that are not text.
func rawOutcome(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client()
	for key, v := range map[string][]byte{"bin": {0, 0xff, 0xfe, '\n', 0}, "empty": {}} {
		if _, err := c.Do(ctx, key, "fp", raw(v, e.debit(key, v))); err != nil {
			t.Fatal(err)
		}
		if en, ok := e.lookup(key); !ok || !bytes.Equal(en.Value, v) || en.Failed {
			t.Fatalf("%s: the ledger holds %+v, %v; want %q", key, en, ok, v)
		}
		e.flush()
		got, err := c.Do(ctx, key, "fp", raw([]byte("other"), e.debit(key, []byte("other"))))
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%s: a retry after FLUSHALL: %q, %v; want %q", key, got, err, v)
		}
		if m := e.movements(key); m != 1 {
			t.Fatalf("%s: %d movements; want 1", key, m)
		}
	}
}

// CommitError records a failure whose changes stick (the row of a
// declined payment): the owner's Do returns it, permanent; after Redis lost
// the record, a retry gets it as a *StoredError and changes nothing.
func commitErrorOutcome(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client()
	declined := errors.New("card declined")
	_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		tx, err := e.b.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := tx.Move(ctx, "a"); err != nil {
			_ = tx.Rollback(ctx)
			return nil, err
		}
		return nil, tx.CommitError(ctx, declined)
	})
	if !errors.Is(err, declined) || !idem.IsPermanent(err) {
		t.Fatalf("the owner's Do: %v; want the declined error, permanent", err)
	}
	if en, ok := e.lookup("k"); !ok || !en.Failed {
		t.Fatalf("the ledger holds %+v, %v; want a failure", en, ok)
	}
	e.flush()
	_, err = c.Do(ctx, "k", "fp", raw([]byte("ok"), e.debit("a", []byte("ok"))))
	var se *idem.StoredError
	if !errors.As(err, &se) || se.Message != declined.Error() {
		t.Fatalf("a retry after FLUSHALL: %v; want the stored failure %q", err, declined)
	}
	if m := e.movements("a"); m != 1 {
		t.Fatalf("%d movements; want 1 (the declined payment's row)", m)
	}
}

// refused runs fn in a Do and checks that its commit failed without
// recording: no ledger entry, no movement of account.
func (e *env) refused(t *testing.T, what, key, account string, commit func(ctx context.Context) error) {
	t.Helper()
	var commitErr error
	_, _ = e.client().Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
		commitErr = commit(ctx)
		return []byte("r"), commitErr
	})
	if commitErr == nil {
		t.Fatalf("%s: Commit returned nil; want an error", what)
	}
	if errors.Is(commitErr, idem.ErrRecorded) {
		t.Fatalf("%s: Commit returned %v; nothing was recorded before", what, commitErr)
	}
	if _, ok := e.lookup(key); ok {
		t.Fatalf("%s: the ledger recorded the key", what)
	}
	if m := e.movements(account); m != 0 {
		t.Fatalf("%s: %d movements committed; want none", what, m)
	}
}

// A transaction already rolled back cannot record.
func closedTx(t *testing.T, e *env) {
	e.refused(t, "a closed tx", "k", "a", func(ctx context.Context) error {
		tx, err := e.b.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tx.Move(ctx, "a"); err != nil {
			return err
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		return tx.Commit(ctx, []byte("r"))
	})
}

// A transaction of another database than the ledger's is refused, and its
// business change does not commit.
func otherDatabase(t *testing.T, e *env) {
	o, ok := e.b.(OtherDatabase)
	if !ok {
		t.Skip("the backend does not implement OtherDatabase")
	}
	var count func(ctx context.Context, account string) (int, error)
	e.refused(t, "a tx of another database", "k", "a", func(ctx context.Context) error {
		tx, n, err := o.BeginOther(ctx)
		if err != nil {
			t.Fatal(err)
		}
		count = n
		if err := tx.Move(ctx, "a"); err != nil {
			return err
		}
		return tx.Commit(ctx, []byte("r"))
	})
	if n, err := count(context.Background(), "a"); err != nil || n != 0 {
		t.Fatalf("the other database's movements: %d, %v; want none committed", n, err)
	}
}

// A value Do cannot store (not the []byte of Client.Do, not the T of
// Do[T]) is refused, and the transaction rolls back.
func unencodableValue(t *testing.T, e *env) {
	e.refused(t, "a string for Client.Do", "k", "a", e.debit("a", "not bytes"))
	var commitErr error
	_, _ = idem.Do(context.Background(), e.client(), "t", "fp", func(ctx context.Context) (receipt, error) {
		commitErr = e.debit("b", 42)(ctx)
		return receipt{}, commitErr
	})
	if commitErr == nil {
		t.Fatal("an int for Do[receipt]: Commit returned nil; want an error")
	}
	if _, ok := e.lookup("t"); ok || e.movements("b") != 0 {
		t.Fatal("an int for Do[receipt]: something committed")
	}
}

// Outside a Do there is no call to record: ErrNoLedger, and the
// transaction rolls back.
func outsideDo(t *testing.T, e *env) {
	ctx := context.Background()
	if err := e.debit("a", []byte("r"))(ctx); !errors.Is(err, idem.ErrNoLedger) {
		t.Fatalf("Commit outside Do: %v; want ErrNoLedger", err)
	}
	if m := e.movements("a"); m != 0 {
		t.Fatalf("%d movements committed outside Do; want none", m)
	}
}

// The first commit decides the call; a second one is refused with
// ErrNoLedger and its transaction rolls back.
func commitTwice(t *testing.T, e *env) {
	var second error
	got, err := e.client().Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
		if err := e.debit("a", []byte("first"))(ctx); err != nil {
			return nil, err
		}
		second = e.debit("b", []byte("second"))(ctx)
		return []byte("first"), nil
	})
	if err != nil || string(got) != "first" {
		t.Fatalf("Do: %q, %v", got, err)
	}
	if !errors.Is(second, idem.ErrNoLedger) {
		t.Fatalf("a second Commit: %v; want ErrNoLedger", second)
	}
	if a, b := e.movements("a"), e.movements("b"); a != 1 || b != 0 {
		t.Fatalf("movements: %d of the first commit, %d of the second; want 1 and 0", a, b)
	}
}

// Keys are bytes: keys that a collation, a trim or a text encoding would
// merge are different operations, each with its own row.
func keysAsBytes(t *testing.T, e *env) {
	ctx := context.Background()
	c := e.client()
	keys := []string{"k", "K", "k ", " k", "k\x00", "k\x00x", "\xff\xfe", "é", "e\u0301", "ǩ"}
	for i, k := range keys {
		v := []byte(fmt.Sprintf("receipt %d", i))
		if _, err := c.Do(ctx, k, "fp", raw(v, e.debit(fmt.Sprint("acct", i), v))); err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	e.flush()
	for i, k := range keys {
		want := fmt.Sprintf("receipt %d", i)
		if en, ok := e.lookup(k); !ok || string(en.Value) != want {
			t.Fatalf("key %q: the ledger holds %q, %v; want %q", k, en.Value, ok, want)
		}
		if m := e.movements(fmt.Sprint("acct", i)); m != 1 {
			t.Fatalf("key %q: %d movements; want 1", k, m)
		}
	}
}

// A key the ledger cannot index is refused before fn runs (ErrInvalidKey),
// and the longest one it can is recorded.
func keyLimit(t *testing.T, e *env) {
	max := e.b.Ledger().MaxKeyLen()
	if max <= 0 {
		t.Skip("the ledger sets no key limit")
	}
	if max > 64<<10 {
		max = 64 << 10
	}
	ctx := context.Background()
	c := e.client(idem.WithMaxKeyLen(max))
	long := strings.Repeat("\xff", max)
	if _, err := c.Do(ctx, long, "fp", raw([]byte("r"), e.debit("a", []byte("r")))); err != nil {
		t.Fatalf("a key of the ledger's MaxKeyLen (%d bytes): %v", max, err)
	}
	if en, ok := e.lookup(long); !ok || string(en.Value) != "r" {
		t.Fatalf("a key of %d bytes: not recorded", max)
	}
	if _, err := c.Do(ctx, long+"x", "fp", e.mustNotRun("the key is too long for the ledger")); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("a key of %d bytes: %v; want ErrInvalidKey", max+1, err)
	}
	// A Client with the default limit stays under the ledger's.
	if d := e.client().MaxKeyLen(); d > max {
		t.Fatalf("a Client's key limit %d is above the ledger's %d", d, max)
	}
}
