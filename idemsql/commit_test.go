package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// 30 concurrent calls with one key, through two Clients: one business
// change, one ledger row, and every caller gets the same receipt.
func TestConcurrentCallersOneChange(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		clients := []*idem.Client{b.client(t), b.client(t)}
		const callers = 30
		var (
			start sync.WaitGroup
			wg    sync.WaitGroup
			got   [callers]Receipt
			errs  [callers]error
		)
		start.Add(1)
		for i := range callers {
			wg.Go(func() {
				start.Wait()
				got[i], errs[i] = idem.Do(ctx, clients[i%2], "op-1", fingerprint("op-1", 25), b.debit("op-1", 25))
			})
		}
		start.Done()
		wg.Wait()
		for i := range callers {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			if got[i] != got[0] {
				t.Errorf("caller %d got %v, caller 0 %v: want one receipt", i, got[i], got[0])
			}
		}
		if got[0].Balance != opening-25 {
			t.Errorf("receipt %v, want balance %d", got[0], opening-25)
		}
		if n := b.movements(t, "op-1"); n != 1 {
			t.Errorf("%d movements, want 1", n)
		}
		if n := b.balance(t); n != opening-25 {
			t.Errorf("balance %d, want %d", n, opening-25)
		}
		if n := b.rows(t); n != 1 {
			t.Errorf("%d ledger rows, want 1", n)
		}
	})
}

// Redis loses its records after a completion (FLUSHALL): the next call runs
// fn, whose commit meets the ledger's row; Do returns the recorded outcome
// and the change stays applied once. Another fingerprint gets ErrConflict,
// from the ledger or, once the record is back in Redis, from Redis.
func TestRedisFlushedAfterCompletion(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		c := b.client(t)
		first, err := idem.Do(ctx, c, "op-1", fingerprint("op-1", 10), b.debit("op-1", 10))
		if err != nil {
			t.Fatal(err)
		}
		b.flush(t)
		again, err := idem.Do(ctx, c, "op-1", fingerprint("op-1", 10), b.debit("op-1", 10))
		if err != nil || again != first {
			t.Fatalf("after FLUSHALL: %v, %v; want the recorded %v", again, err, first)
		}
		if n := b.runs.Load(); n != 2 {
			t.Errorf("fn ran %d times, want 2 (the second rolled back)", n)
		}
		// The record is back in Redis: a replay, fn not run.
		if r, err := idem.Do(ctx, c, "op-1", fingerprint("op-1", 10), b.debit("op-1", 10)); err != nil || r != first || b.runs.Load() != 2 {
			t.Errorf("replay: %v, %v, %d runs; want %v from Redis", r, err, b.runs.Load(), first)
		}
		if _, err := idem.Do(ctx, c, "op-1", fingerprint("op-1", 99), b.debit("op-1", 99)); !errors.Is(err, idem.ErrConflict) {
			t.Errorf("other parameters, record in Redis: %v, want ErrConflict", err)
		}
		b.flush(t)
		if _, err := idem.Do(ctx, c, "op-1", fingerprint("op-1", 99), b.debit("op-1", 99)); !errors.Is(err, idem.ErrConflict) {
			t.Errorf("other parameters after FLUSHALL: %v, want ErrConflict", err)
		}
		if n := b.movements(t, "op-1"); n != 1 {
			t.Errorf("%d movements, want 1", n)
		}
		if n := b.balance(t); n != opening-10 {
			t.Errorf("balance %d, want %d", n, opening-10)
		}
		// With lookups before every fn, fn does not even start.
		b.flush(t)
		runs := b.runs.Load()
		cl := b.client(t, idem.WithLedgerLookups(true))
		if r, err := idem.Do(ctx, cl, "op-1", fingerprint("op-1", 10), b.debit("op-1", 10)); err != nil || r != first {
			t.Errorf("after FLUSHALL, with lookups: %v, %v; want %v", r, err, first)
		}
		if n := b.runs.Load() - runs; n != 0 {
			t.Errorf("with lookups, fn ran %d times after FLUSHALL, want 0", n)
		}
		if n := b.movements(t, "op-1"); n != 1 {
			t.Errorf("%d movements, want 1", n)
		}
	})
}

// The outcome the ledger records is the one Redis stores: a typed result
// that replays from Redis, then from the ledger, equal each time; raw
// bytes through Client.Do; and a permanent failure whose own change (the
// declined payment's row) sticks, through CommitError.
func TestOutcomes(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		c := b.client(t)

		t.Run("typed", func(t *testing.T) {
			type Detail struct {
				Lines []string
				Tags  map[string]int
				At    time.Time
				Ptr   *int64
			}
			seven := int64(7)
			want := Detail{Lines: []string{"a", ""}, Tags: map[string]int{"x": 1}, At: time.UnixMilli(1_700_000_000_123), Ptr: &seven}
			fn := func(ctx context.Context) (Detail, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return Detail{}, err
				}
				defer tx.Rollback()
				if _, err := b.change(ctx, tx, "typed", 1, "debit"); err != nil {
					return Detail{}, err
				}
				return want, idemsql.Commit(ctx, tx, want)
			}
			check := func(when string, got Detail, err error) {
				t.Helper()
				if err != nil || got.Lines[1] != "" || len(got.Lines) != 2 || got.Tags["x"] != 1 || !got.At.Equal(want.At) || *got.Ptr != 7 {
					t.Errorf("%s: %+v, %v; want %+v", when, got, err, want)
				}
			}
			got, err := idem.Do(ctx, c, "typed", "fp", fn)
			check("owner", got, err)
			got, err = idem.Do(ctx, c, "typed", "fp", fn)
			check("replay from Redis", got, err)
			b.flush(t)
			got, err = idem.Do(ctx, c, "typed", "fp", fn)
			check("replay from the ledger", got, err)
			if n := b.movements(t, "typed"); n != 1 {
				t.Errorf("%d movements, want 1", n)
			}
			var e idem.Entry = b.entry(t, "typed")
			if e.Failed || e.Attempt != 1 || len(e.FingerprintDigest) != 16 {
				t.Errorf("ledger entry %+v, want attempt 1, a 16-byte fingerprint, not failed", e)
			}
		})

		t.Run("bytes", func(t *testing.T) {
			want := []byte("raw\x00receipt\xff")
			fn := func(ctx context.Context) ([]byte, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback()
				if _, err := b.change(ctx, tx, "bytes", 1, "debit"); err != nil {
					return nil, err
				}
				return want, idemsql.Commit(ctx, tx, want)
			}
			for _, when := range []string{"owner", "replay", "flushed"} {
				if when == "flushed" {
					b.flush(t)
				}
				if got, err := c.Do(ctx, "bytes", "", fn); err != nil || string(got) != string(want) {
					t.Errorf("%s: %q, %v; want %q", when, got, err, want)
				}
			}
			if e := b.entry(t, "bytes"); string(e.Value) != string(want) || e.FingerprintDigest != "" {
				t.Errorf("ledger entry %+v, want the raw bytes and no fingerprint", e)
			}
			if n := b.movements(t, "bytes"); n != 1 {
				t.Errorf("%d movements, want 1", n)
			}
		})

		t.Run("CommitError", func(t *testing.T) {
			declined := errors.New("card declined")
			fn := func(ctx context.Context) (Receipt, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return Receipt{}, err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, b.q("INSERT INTO movements (op, amount, attempt, kind) VALUES (?, 0, 1, 'declined')"), "declined"); err != nil {
					return Receipt{}, err
				}
				return Receipt{}, idemsql.CommitError(ctx, tx, idem.PermanentCode("card_declined", declined))
			}
			_, err := idem.Do(ctx, c, "declined", "fp", fn)
			if !errors.Is(err, declined) || !idem.IsPermanent(err) {
				t.Errorf("owner: %v, want its own permanent error", err)
			}
			for _, when := range []string{"replay", "flushed"} {
				if when == "flushed" {
					b.flush(t)
				}
				_, err := idem.Do(ctx, c, "declined", "fp", fn)
				var se *idem.StoredError
				if !errors.As(err, &se) || se.Code != "card_declined" || !strings.Contains(se.Error(), "card declined") {
					t.Errorf("%s: %v, want the stored failure with its code", when, err)
				}
			}
			if n := b.movements(t, "declined"); n != 1 {
				t.Errorf("%d declined rows, want 1", n)
			}
			if e := b.entry(t, "declined"); !e.Failed {
				t.Errorf("ledger entry %+v, want a failure", e)
			}
		})
	})
}

// A ledger under another table name works the same.
func TestWithTable(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		b.ledger = idemsql.New(b.db, b.dialect, idemsql.WithTable("payments_ledger"))
		if err := b.ledger.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		c := b.client(t)
		r, err := idem.Do(ctx, c, "op", fingerprint("op", 3), b.debit("op", 3))
		if err != nil {
			t.Fatal(err)
		}
		if e := b.entry(t, "op"); e.Attempt != r.Attempt {
			t.Errorf("entry %+v, want attempt %d", e, r.Attempt)
		}
		var n int
		if err := b.db.QueryRow("SELECT count(*) FROM idem_ledger").Scan(&n); err != nil || n != 0 {
			t.Errorf("default table: %d rows, %v; want 0", n, err)
		}
	})
}

// committed reports whether a business change made in tx reached the
// database: a refused Commit must have rolled tx back.
func committedRows(t *testing.T, b *bank, op string) int { return b.movements(t, op) }

// Bad input gets a clear error, and nothing is committed: tx is rolled
// back, its business change gone, and the ledger holds no row.
func TestCommitRefuses(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		ctx := context.Background()
		c := b.client(t)

		// tryCommit begins a transaction on db, writes a movement for op,
		// and calls commit.
		tryCommit := func(ctx context.Context, db *sql.DB, op string, commit func(context.Context, *sql.Tx) error) (*sql.Tx, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, b.q("INSERT INTO movements (op, amount, attempt, kind) VALUES (?, 1, 1, 'debit')"), op); err != nil {
				t.Fatal(err)
			}
			return tx, commit(ctx, tx)
		}
		rolledBack := func(t *testing.T, tx *sql.Tx, op string) {
			t.Helper()
			if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
				t.Errorf("tx after a refused Commit: Commit() = %v, want ErrTxDone (rolled back)", err)
			}
			if n := committedRows(t, b, op); n != 0 {
				t.Errorf("%d movements of %s committed, want 0", n, op)
			}
			if _, ok, _ := b.ledger.Lookup(context.Background(), op); ok {
				t.Errorf("the ledger holds %s", op)
			}
		}

		t.Run("outside an idem call", func(t *testing.T) {
			tx, err := tryCommit(ctx, b.db, "outside", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 1) })
			if !errors.Is(err, idem.ErrNoLedger) || !strings.Contains(err.Error(), "not inside the fn") {
				t.Errorf("Commit outside Do: %v, want ErrNoLedger saying so", err)
			}
			rolledBack(t, tx, "outside")
		})

		t.Run("Client without a ledger", func(t *testing.T) {
			plain := idem.New(b.redis.Client(t))
			defer plain.Close()
			var tx *sql.Tx
			_, err := idem.Do(ctx, plain, "noledger", "", func(ctx context.Context) (int, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "noledger", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 1) })
				return 1, err
			})
			if !errors.Is(err, idem.ErrNoLedger) || !strings.Contains(err.Error(), "no ledger") {
				t.Errorf("Commit with a Client without a ledger: %v, want ErrNoLedger saying so", err)
			}
			rolledBack(t, tx, "noledger")
		})

		t.Run("closed tx", func(t *testing.T) {
			for _, end := range []string{"committed", "rolled back"} {
				op := "closed-" + strings.ReplaceAll(end, " ", "")
				_, err := idem.Do(ctx, c, op, "", func(ctx context.Context) (int, error) {
					tx, err := b.db.BeginTx(ctx, nil)
					if err != nil {
						return 0, err
					}
					if end == "committed" {
						err = tx.Commit()
					} else {
						err = tx.Rollback()
					}
					if err != nil {
						return 0, err
					}
					return 1, idemsql.Commit(ctx, tx, 1)
				})
				if !errors.Is(err, sql.ErrTxDone) || !strings.Contains(err.Error(), "already committed or rolled back") {
					t.Errorf("Commit of a tx already %s: %v, want ErrTxDone explained", end, err)
				}
				if idem.IsPermanent(err) {
					t.Errorf("Commit of a tx already %s: a permanent error, want a transient one", end)
				}
				if _, ok, _ := b.ledger.Lookup(ctx, op); ok {
					t.Errorf("the ledger holds %s", op)
				}
			}
		})

		t.Run("nil tx", func(t *testing.T) {
			_, err := idem.Do(ctx, c, "niltx", "", func(ctx context.Context) (int, error) {
				return 1, idemsql.Commit(ctx, nil, 1)
			})
			if err == nil || !strings.Contains(err.Error(), "nil tx") {
				t.Errorf("Commit with a nil tx: %v, want an error naming it", err)
			}
		})

		t.Run("tx of another database", func(t *testing.T) {
			for _, kind := range []string{"without a ledger", "with a ledger of its own"} {
				other := newBank(t, backendNamed(b.name))
				if kind == "without a ledger" {
					if _, err := other.db.Exec("DROP TABLE " + other.ledger.Table() + "_meta"); err != nil {
						t.Fatal(err)
					}
					if _, err := other.db.Exec("DROP TABLE " + other.ledger.Table()); err != nil {
						t.Fatal(err)
					}
				}
				op := "other-" + strings.ReplaceAll(kind, " ", "")
				var tx *sql.Tx
				_, err := idem.Do(ctx, c, op, "", func(ctx context.Context) (int, error) {
					var err error
					tx, err = tryCommit(ctx, other.db, op, func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 1) })
					return 1, err
				})
				if err == nil || !strings.Contains(err.Error(), "database") || !strings.Contains(err.Error(), "nothing committed") {
					t.Errorf("Commit of a tx of another database %s: %v, want an error saying so", kind, err)
				}
				if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
					t.Errorf("tx: Commit() = %v, want ErrTxDone (rolled back)", err)
				}
				if n := other.movements(t, op); n != 0 {
					t.Errorf("%d movements committed in the other database, want 0", n)
				}
				if kind == "with a ledger of its own" {
					if n := other.rows(t); n != 0 {
						t.Errorf("%d rows in the other database's ledger, want 0", n)
					}
				}
				if _, ok, _ := b.ledger.Lookup(ctx, op); ok {
					t.Errorf("the ledger holds %s", op)
				}
			}
		})

		t.Run("value that cannot be encoded", func(t *testing.T) {
			var tx *sql.Tx
			_, err := idem.Do(ctx, c, "unencodable", "", func(ctx context.Context) (badText, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "unencodable", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, badText{}) })
				return badText{}, err
			})
			if !errors.Is(err, idem.ErrEncode) || !strings.Contains(err.Error(), "nothing committed") {
				t.Errorf("Commit of a value that cannot be encoded: %v, want ErrEncode", err)
			}
			rolledBack(t, tx, "unencodable")
		})

		t.Run("value of another type", func(t *testing.T) {
			var tx *sql.Tx
			_, err := idem.Do(ctx, c, "othertype", "", func(ctx context.Context) (int, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "othertype", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, "a string") })
				return 1, err
			})
			if !errors.Is(err, idem.ErrEncode) || !strings.Contains(err.Error(), "string") {
				t.Errorf("Commit of a string in Do[int]: %v, want ErrEncode naming the types", err)
			}
			rolledBack(t, tx, "othertype")
			_, err = c.Do(ctx, "othertype-raw", "", func(ctx context.Context) ([]byte, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "othertype-raw", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 1) })
				return nil, err
			})
			if !errors.Is(err, idem.ErrEncode) {
				t.Errorf("Commit of an int in Client.Do: %v, want ErrEncode", err)
			}
			rolledBack(t, tx, "othertype-raw")
		})

		t.Run("second commit", func(t *testing.T) {
			var second error
			var tx2 *sql.Tx
			got, err := idem.Do(ctx, c, "twice", "", func(ctx context.Context) (int, error) {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return 0, err
				}
				if err := idemsql.Commit(ctx, tx, 1); err != nil {
					return 0, err
				}
				tx2, second = tryCommit(ctx, b.db, "twice-2", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 2) })
				return 2, second
			})
			if err != nil || got != 1 {
				t.Errorf("Do: %v, %v; want the first commit's 1", got, err)
			}
			if !errors.Is(second, idem.ErrNoLedger) {
				t.Errorf("second Commit: %v, want ErrNoLedger", second)
			}
			rolledBack(t, tx2, "twice-2")
		})

		t.Run("CommitError with nil", func(t *testing.T) {
			var tx *sql.Tx
			_, err := idem.Do(ctx, c, "nilerr", "", func(ctx context.Context) (int, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "nilerr", func(ctx context.Context, tx *sql.Tx) error { return idemsql.CommitError(ctx, tx, nil) })
				return 0, err
			})
			if err == nil || !strings.Contains(err.Error(), "nil error") {
				t.Errorf("CommitError(nil): %v, want an error naming it", err)
			}
			rolledBack(t, tx, "nilerr")
		})

		t.Run("ledger of another kind", func(t *testing.T) {
			other := b.clientOn(t, b.redis.Client(t), idem.WithLedger(fakeLedger{}))
			var tx *sql.Tx
			_, err := idem.Do(ctx, other, "otherkind", "", func(ctx context.Context) (int, error) {
				var err error
				tx, err = tryCommit(ctx, b.db, "otherkind", func(ctx context.Context, tx *sql.Tx) error { return idemsql.Commit(ctx, tx, 1) })
				return 0, err
			})
			if err == nil || !strings.Contains(err.Error(), "idemsql_test.fakeLedger") {
				t.Errorf("Commit with a Client whose ledger is not idemsql's: %v, want an error naming its type", err)
			}
			rolledBack(t, tx, "otherkind")
		})

		t.Run("key never used", func(t *testing.T) {
			if _, ok, err := b.ledger.Lookup(ctx, "never"); ok || err != nil {
				t.Errorf("Lookup of a key never used: %v, %v", ok, err)
			}
		})
	})
}

// badText cannot be encoded: its marshaler fails.
type badText struct{}

func (badText) MarshalText() ([]byte, error) { return nil, errors.New("badText cannot be marshaled") }
func (*badText) UnmarshalText([]byte) error  { return nil }

type fakeLedger struct{}

func (fakeLedger) Lookup(context.Context, string) (idem.Entry, bool, error) {
	return idem.Entry{}, false, nil
}

func (fakeLedger) MaxKeyLen() int { return 0 }
