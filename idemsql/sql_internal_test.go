package idemsql

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql/internal/servertest"
)

// backend is one database system under test.
type backend struct {
	servertest.Backend
	dialect Dialect
}

func backends() []backend {
	var bs []backend
	for _, b := range servertest.Backends() {
		bs = append(bs, backend{b, map[string]Dialect{"postgres": Postgres, "sqlite": SQLite, "mariadb": MySQL}[b.Name]})
	}
	return bs
}

// eachBackend runs test once per database system, in parallel.
func eachBackend(t *testing.T, test func(t *testing.T, b backend)) {
	for _, b := range backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

func migrated(t testing.TB, b backend, opts ...Option) *Ledger {
	db, _ := b.Open(t)
	l := New(db, b.dialect, opts...)
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

// insertRow adds r in a transaction of its own, as Commit would.
func insertRow(t testing.TB, l *Ledger, r row) bool {
	t.Helper()
	ctx := context.Background()
	id, err := l.databaseID(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	added, err := l.insert(ctx, tx, r, id)
	if err != nil {
		tx.Rollback()
		t.Fatalf("insert %q: %v", r.key, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return added
}

func TestInsertAndLookup(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := migrated(t, b)
		// Keys and values are bytes: NUL, invalid UTF-8, empty values.
		rows := []row{
			{key: "plain", fingerprint: "0123456789abcdef", attempt: 1, outcome: []byte("receipt")},
			{key: "nul\x00and\xffbytes", fingerprint: "\x00\xff\x00\xff\x00\xff\x00\xff\x00\xff\x00\xff\x00\xff\x00\xff", attempt: 7, failed: true, outcome: []byte{0, 1, 2}},
			{key: "empty", attempt: 2, outcome: []byte{}},
			{key: "nil outcome", attempt: 3},
		}
		for _, r := range rows {
			if !insertRow(t, l, r) {
				t.Fatalf("insert %q: not added", r.key)
			}
		}
		for _, r := range rows {
			got, ok, err := l.lookup(ctx, r.key)
			if err != nil || !ok {
				t.Fatalf("lookup %q: %v, %v", r.key, ok, err)
			}
			if got.key != r.key || got.fingerprint != r.fingerprint || got.attempt != r.attempt || got.failed != r.failed || !bytes.Equal(got.outcome, r.outcome) || got.outcome == nil {
				t.Errorf("lookup %q = %+v, want %+v", r.key, got, r)
			}
		}
		// The key decides: a second row is not added, the first stays.
		if insertRow(t, l, row{key: "plain", attempt: 9, outcome: []byte("other")}) {
			t.Error("a second row for a key was added")
		}
		if got, _, _ := l.lookup(ctx, "plain"); got.attempt != 1 || string(got.outcome) != "receipt" {
			t.Errorf("after a second insert: %+v, want the first row", got)
		}
		if _, ok, err := l.lookup(ctx, "absent"); ok || err != nil {
			t.Errorf("lookup of an absent key: %v, %v", ok, err)
		}
		// A key that differs only by a trailing NUL or case is another key.
		for _, k := range []string{"plain\x00", "PLAIN", "plain "} {
			if _, ok, _ := l.lookup(ctx, k); ok {
				t.Errorf("lookup %q found the row of \"plain\"", k)
			}
		}
	})
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db, _ := b.Open(t)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() { errs[i] = New(db, b.dialect).Migrate(ctx) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("concurrent Migrates: %v", err)
		}
		l := New(db, b.dialect)
		id, err := l.databaseID(ctx, false)
		if err != nil || len(id) != 16 {
			t.Fatalf("database id after Migrate: %x, %v", id, err)
		}
		insertRow(t, l, row{key: "k", attempt: 1, outcome: []byte("v")})
		// Migrate again: the row and the id stay.
		if err := New(db, b.dialect).Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := New(db, b.dialect)
		id2, _ := l2.databaseID(ctx, false)
		if !bytes.Equal(id, id2) {
			t.Errorf("Migrate changed the database id: %x, then %x", id, id2)
		}
		if _, ok, _ := l2.lookup(ctx, "k"); !ok {
			t.Error("Migrate lost a row")
		}
	})
}

func TestTableOption(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db, _ := b.Open(t)
		a, c := New(db, b.dialect, WithTable("ledger_a")), New(db, b.dialect, WithTable("Ledger_B"))
		for _, l := range []*Ledger{a, c} {
			if err := l.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
		}
		insertRow(t, a, row{key: "k", attempt: 1, outcome: []byte("a")})
		if _, ok, _ := c.lookup(ctx, "k"); ok {
			t.Error("a row of table ledger_a was found in Ledger_B")
		}
		if got, ok, _ := a.lookup(ctx, "k"); !ok || string(got.outcome) != "a" {
			t.Errorf("lookup in ledger_a: %+v, %v", got, ok)
		}
	})
}

func TestNewRefusesBadArguments(t *testing.T) {
	db := servertest.OpenSQLite(t, servertest.SQLiteDSN(t))
	for _, tc := range []struct {
		name string
		new  func()
		want string
	}{
		{"nil db", func() { New(nil, SQLite) }, "db is nil"},
		{"zero dialect", func() { New(db, Dialect{}) }, "zero Dialect"},
		{"empty table", func() { New(db, SQLite, WithTable("")) }, `WithTable("")`},
		{"quoted table", func() { New(db, SQLite, WithTable(`x"; DROP TABLE y; --`)) }, "WithTable"},
		{"schema", func() { New(db, SQLite, WithTable("public.ledger")) }, "WithTable"},
		{"digit first", func() { New(db, SQLite, WithTable("1ledger")) }, "WithTable"},
		{"too long", func() { New(db, SQLite, WithTable(strings.Repeat("x", 49))) }, "WithTable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, tc.want) || !strings.HasPrefix(s, "idemsql: New: ") {
					t.Errorf("panic %v, want one naming %q", r, tc.want)
				}
			}()
			tc.new()
		})
	}
	New(db, SQLite, WithTable(strings.Repeat("x", 48))) // the longest name is fine
}

func TestUnmigrated(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db, _ := b.Open(t)
		l := New(db, b.dialect)
		if _, _, err := l.lookup(ctx, "k"); err == nil || !strings.Contains(err.Error(), "call Migrate") {
			t.Errorf("lookup before Migrate: %v, want an error saying to call Migrate", err)
		}
		if _, err := l.databaseID(ctx, false); err == nil || !strings.Contains(err.Error(), "call Migrate") {
			t.Errorf("database id before Migrate: %v, want an error saying to call Migrate", err)
		}
		if _, err := l.Prune(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "call Migrate") {
			t.Errorf("Prune before Migrate: %v, want an error saying to call Migrate", err)
		}
	})
}

func TestPrune(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := migrated(t, b)
		// 2,500 rows two hours old (more than two batches), 10 rows
		// 59 minutes old and 10 new ones, dated by the database's clock.
		const old = 2*pruneBatch + 500
		insert := "INSERT INTO " + l.table + " (idem_key, fingerprint, attempt, failed, outcome, recorded_at) VALUES (" +
			l.dialect.placeholder(1, l.dialect.blob) + ", " + l.dialect.placeholder(2, l.dialect.blob) + ", 1, " +
			l.dialect.placeholder(3, l.dialect.boolean) + ", " + l.dialect.placeholder(4, l.dialect.blob) + ", " +
			l.dialect.before(l.dialect.placeholder(5, l.dialect.integer)) + ")"
		tx, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range old + 20 {
			age := 2 * time.Hour
			switch {
			case i >= old+10:
				age = 0
			case i >= old:
				age = 59 * time.Minute
			}
			if _, err := tx.ExecContext(ctx, insert, []byte(fmt.Sprint("k", i)), []byte{}, false, []byte("v"), age.Microseconds()); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Prune(ctx, time.Time{}); err == nil {
			t.Error("Prune with the zero time did not fail")
		}
		n, err := l.Prune(ctx, time.Now().Add(-time.Hour))
		if err != nil || n != old {
			t.Fatalf("Prune of rows over an hour old = %d, %v; want %d", n, err, old)
		}
		if n, err := l.Prune(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Errorf("second Prune = %d, %v; want 0", n, err)
		}
		if n, err := l.Prune(ctx, time.Now().Add(-30*time.Minute)); err != nil || n != 10 {
			t.Errorf("Prune of rows over 30 minutes old = %d, %v; want the 10 of 59 minutes", n, err)
		}
		if n, err := l.Prune(ctx, time.Now().Add(time.Minute)); err != nil || n != 10 {
			t.Errorf("Prune of everything = %d, %v; want the 10 new rows", n, err)
		}
	})
}

// recorded_at and Lookup's Age come from the database's clock, not the
// host's: a row recorded now is a few milliseconds old, whatever the host
// says the time is.
func TestAgeByTheDatabasesClock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := migrated(t, b)
		id, err := l.databaseID(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.insert(ctx, tx, row{key: "k", attempt: 1, outcome: []byte("v")}, id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		e, ok, err := l.Lookup(ctx, "k")
		if err != nil || !ok {
			t.Fatalf("Lookup: %v, %v", ok, err)
		}
		if e.Age < 10*time.Millisecond || e.Age > time.Minute {
			t.Fatalf("Age %v of a row recorded 20 ms ago; want about that", e.Age)
		}
	})
}

func TestOtherDatabase(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		l := migrated(t, b)
		other := migrated(t, b) // another database with a ledger of its own
		id, _ := l.databaseID(ctx, false)
		tx, err := other.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		added, err := l.insert(ctx, tx, row{key: "k", attempt: 1, outcome: []byte("v")}, id)
		if err != nil || added {
			t.Fatalf("insert into another migrated database: added %v, %v; want nothing added", added, err)
		}
		if err := l.checkDatabase(ctx, tx, id); !errors.Is(err, errOtherDatabase) {
			t.Errorf("checkDatabase of another database: %v, want errOtherDatabase", err)
		}
		tx2, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		if err := l.checkDatabase(ctx, tx2, id); err != nil {
			t.Errorf("checkDatabase of the ledger's own database: %v", err)
		}
	})
}

// With one connection in the pool, fn's transaction holds it: Commit must
// not need another. Migrate reads the database's id for it.
func TestCommitNeedsNoSecondConnection(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		db, _ := b.Open(t)
		if err := New(db, b.dialect).Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		l := New(db, b.dialect)
		if err := l.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		id, err := l.databaseID(ctx, false)
		if err != nil {
			t.Fatalf("database id while a transaction holds the only connection: %v", err)
		}
		if added, err := l.insert(ctx, tx, row{key: "k", attempt: 1, outcome: []byte("v")}, id); err != nil || !added {
			t.Fatalf("insert: %v, %v", added, err)
		}
	})
}

// An error the database will repeat whatever the attempt (a key too large
// for PostgreSQL's B-tree, SQLSTATE 54000) is permanent: the outcome is a
// stored failure, not a transient error retried at every attempt. The
// Client's key limit (MaxKeyLen) keeps such keys out; this is the ledger's
// answer when one reaches it all the same.
func TestRepeatedDatabaseErrorIsPermanent(t *testing.T) {
	for _, b := range backends() {
		if b.Name != "postgres" {
			continue
		}
		ctx := context.Background()
		l := migrated(t, b)
		tx, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		long := make([]byte, 6000)
		_, _ = rand.Read(long)
		_, _, err = (&txn{l: l, tx: tx}).Commit(ctx, idem.Entry{Key: string(long), Attempt: 1, Value: []byte("v")})
		if !idem.IsPermanent(err) || sqlState(err) != "54000" {
			t.Fatalf("a 6000-byte key: %v (SQLSTATE %q); want a permanent error of SQLSTATE 54000", err, sqlState(err))
		}
		// Transient errors stay transient: a transaction already done.
		_, _, err = (&txn{l: l, tx: tx}).Commit(ctx, idem.Entry{Key: "k", Attempt: 1, Value: []byte("v")})
		if err == nil || idem.IsPermanent(err) {
			t.Fatalf("Commit on a finished tx: %v; want a transient error", err)
		}
	}
}
