package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// A service's ledger, on SQLite and PostgreSQL: what status and forget
// say of a key whose outcome it holds, and of one it does not.

// ledgerSetup is a service with a ledger: its Redis, its database and the
// -ledger DSN that names it.
type ledgerSetup struct {
	rdb    *redis.Client
	addr   string
	db     *sql.DB
	ledger *idemsql.Ledger
	dsn    string
}

// eachLedger runs f on a SQLite and a PostgreSQL ledger (skipped where
// PostgreSQL is not installed, unless IDEM_REQUIRE_REDIS=1).
func eachLedger(t *testing.T, f func(t *testing.T, s ledgerSetup)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "app.db")
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		withLedger(t, db, idemsql.SQLite, "sqlite:"+path, f)
	})
	t.Run("postgres", func(t *testing.T) {
		pg := dbtest.SharedPostgres(t)
		dsn := pg.NewDatabase(t)
		withLedger(t, pg.Open(t, dsn), idemsql.Postgres, dsn, f)
	})
	t.Run("mariadb", func(t *testing.T) {
		m := dbtest.SharedMariaDB(t)
		dsn := m.NewDatabase(t)
		// The DSN as an operator gives it: mysql://user@host:port/db.
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		withLedger(t, m.Open(t, dsn), idemsql.MySQL, "mysql://"+cfg.User+"@"+cfg.Addr+"/"+cfg.DBName, f)
	})
}

func withLedger(t *testing.T, db *sql.DB, d idemsql.Dialect, dsn string, f func(t *testing.T, s ledgerSetup)) {
	l := idemsql.New(db, d)
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t, redistest.Config{})
	f(t, ledgerSetup{rdb: srv.Client(t), addr: srv.Addr(), db: db, ledger: l, dsn: dsn})
}

// debit runs one call with key that commits "receipt" in the ledger.
func (s ledgerSetup) debit(t *testing.T, key string) {
	t.Helper()
	c := idem.New(s.rdb, idem.WithLedger(s.ledger), idem.WithLogger(nil))
	defer c.Close()
	_, err := c.Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		return []byte("receipt"), idemsql.Commit(ctx, tx, []byte("receipt"))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStatusLedger(t *testing.T) {
	eachLedger(t, func(t *testing.T, s ledgerSetup) {
		s.debit(t, "order-1")
		s.rdb.FlushAll(context.Background()) // Redis lost the record; the ledger holds it

		r := idemctl(t, "status", "order-1", "-redis", s.addr, "-ledger", s.dsn)
		r.mustExit(t, 0)
		for _, want := range []string{
			"state:    absent",
			"ledger:   holds a result (7 B) of attempt 1 in idem_ledger, recorded ",
			"next:     the next call runs the operation as attempt 1, but its ledger commit meets the row",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Fatalf("status does not say %q:\n%s", want, r.stdout)
			}
		}
		if strings.Contains(r.stdout, "-ledger DSN") {
			t.Fatalf("status with -ledger asks for -ledger:\n%s", r.stdout)
		}

		r = idemctl(t, "status", "order-1", "-redis", s.addr, "-ledger", s.dsn, "-json")
		r.mustExit(t, 0)
		var j statusJSON
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatalf("%v:\n%s", err, r.stdout)
		}
		lj := j.Ledger
		if !lj.Looked || !lj.Found || lj.Failed || lj.Attempt != 1 || lj.ValueBytes != 7 || !lj.Fingerprint || lj.RecordedAt == nil || lj.AgeSeconds < 0 {
			t.Fatalf("ledger %+v", lj)
		}
		// recorded_at is now less the row's age on the database's clock,
		// the same machine's here: within the test's own run.
		if d := time.Since(*lj.RecordedAt); d < -time.Second || d > time.Minute {
			t.Fatalf("recorded_at %v is %v ago", lj.RecordedAt, d)
		}

		// A key the ledger does not hold, and the record of one it does.
		r = idemctl(t, "status", "order-2", "-redis", s.addr, "-ledger", s.dsn)
		r.mustExit(t, 0)
		if !strings.Contains(r.stdout, "ledger:   no outcome of the key in idem_ledger") || !strings.Contains(r.stdout, "next:     the next call runs the operation as attempt 1\n") {
			t.Fatalf("status of a key the ledger lacks:\n%s", r.stdout)
		}
		s.debit(t, "order-3")
		r = idemctl(t, "status", "order-3", "-redis", s.addr, "-ledger", s.dsn)
		r.mustExit(t, 0)
		if !strings.Contains(r.stdout, "state:    done") || !strings.Contains(r.stdout, "ledger:   holds a result") {
			t.Fatalf("status of a done key:\n%s", r.stdout)
		}

		// Without -ledger it says it did not look.
		r = idemctl(t, "status", "order-1", "-redis", s.addr, "-json")
		r.mustExit(t, 0)
		j = statusJSON{}
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatal(err)
		}
		if j.Ledger.Looked || j.Ledger.Found || !strings.Contains(j.Next, "-ledger DSN tells") {
			t.Fatalf("without -ledger: ledger %+v, next %q", j.Ledger, j.Next)
		}
		r = idemctl(t, "status", "order-1", "-redis", s.addr)
		if !strings.Contains(r.stdout, "ledger:   not looked at (-ledger DSN reads the service's ledger)") {
			t.Fatalf("without -ledger:\n%s", r.stdout)
		}
	})
}

func TestForgetLedger(t *testing.T) {
	eachLedger(t, func(t *testing.T, s ledgerSetup) {
		s.debit(t, "order-1")
		r := idemctl(t, "forget", "order-1", "-yes", "-redis", s.addr, "-ledger", s.dsn)
		r.mustExit(t, 0)
		if !strings.Contains(r.stdout, `forgot key "order-1" (it was done, attempt 1)`) ||
			!strings.Contains(r.stdout, "ledger: holds a result (7 B) of attempt 1") ||
			!strings.Contains(r.stdout, "next:   the next call runs the operation as attempt 1, but its ledger commit meets the row") {
			t.Fatalf("forget of a key the ledger holds:\n%s", r.stdout)
		}
		// The ledger is only read: the row is still there.
		if _, ok, err := s.ledger.Lookup(context.Background(), "order-1"); err != nil || !ok {
			t.Fatalf("the row after forget: %v, %v", ok, err)
		}
		// Nothing left in Redis: nothing to forget, and the ledger's row
		// still decides the next call.
		r = idemctl(t, "forget", "order-1", "-yes", "-redis", s.addr, "-ledger", s.dsn, "-json")
		r.mustExit(t, 0)
		var j struct {
			Forgotten bool       `json:"forgotten"`
			Ledger    ledgerJSON `json:"ledger"`
			Next      string     `json:"next"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
			t.Fatalf("%v:\n%s", err, r.stdout)
		}
		if j.Forgotten || !j.Ledger.Found || !strings.Contains(j.Next, "meets the row") {
			t.Fatalf("second forget: %+v", j)
		}
		// A key with a record but no row: the next call runs again.
		c := idem.New(s.rdb, idem.WithLogger(nil))
		defer c.Close()
		if _, err := c.Do(context.Background(), "order-9", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		r = idemctl(t, "forget", "order-9", "-yes", "-redis", s.addr, "-ledger", s.dsn)
		r.mustExit(t, 0)
		if !strings.Contains(r.stdout, "ledger: no outcome of the key in idem_ledger\nnext:   the next call runs the operation as attempt 1\n") {
			t.Fatalf("forget of a key the ledger lacks:\n%s", r.stdout)
		}
	})
}

// A -ledger that idemctl cannot use is refused before Redis is touched:
// bad usage (exit 2) for a DSN of no known kind, a failure (exit 1) for a
// database it cannot read, and a password never shows in what it says.
func TestLedgerBadDSN(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	addr := srv.Addr()
	dir := t.TempDir()
	for _, tc := range []struct {
		dsn  string
		code int
		says string
	}{
		{"oracle://scott:tiger@db/x", 2, `want postgres://user@host:port/db, sqlite:PATH or mysql://`},
		{"mysql://root:s3cret@127.0.0.1:1/db?timeout=2s", 1, "ledger mysql://root:xxxxx@127.0.0.1:1/db"},
		{"mysql://root@127.0.0.1:1", 2, "want mysql://user:password@host:port/db"},
		{"mysql:root:s3cret@tcp(127.0.0.1:1)/db?timeout=2s", 1, "ledger mysql:root@tcp(127.0.0.1:1)/db"},
		{"sqlite:", 2, "names no file"},
		{"sqlite:" + filepath.Join(dir, "missing.db"), 1, "idemctl reads an existing ledger; it creates none"},
		{"postgres://alice:s3cret@127.0.0.1:1/db?connect_timeout=2", 1, "ledger postgres://alice:xxxxx@127.0.0.1:1/db"},
	} {
		r := idemctl(t, "status", "k", "-redis", addr, "-ledger", tc.dsn)
		r.mustExit(t, tc.code, tc.says)
		if strings.Contains(r.stderr, "s3cret") || strings.Contains(r.stderr, "tiger") {
			t.Fatalf("%s: the password shows:\n%s", tc.dsn, r.stderr)
		}
	}
	r := idemctl(t, "stats", "-redis", addr, "-ledger", "sqlite:x.db")
	r.mustExit(t, 2, "-ledger is read by status and forget")
	r = idemctl(t, "status", "k", "-redis", addr, "-ledger", "sqlite:x.db", "-ledger-table", "x;drop")
	r.mustExit(t, 2, "-ledger-table")

	// A database without the ledger's table (Migrate never ran there, or
	// -ledger-table is wrong): a failure that says so.
	path := filepath.Join(dir, "empty.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	r = idemctl(t, "status", "k", "-redis", addr, "-ledger", "sqlite:"+path)
	r.mustExit(t, 1, "the table idem_ledger is missing")
	r = idemctl(t, "forget", "k", "-yes", "-redis", addr, "-ledger", "sqlite:"+path)
	r.mustExit(t, 1, "nothing was forgotten")
}

// Issue 38, item 2: forget of a key whose record is gone and whose
// tombstone is left (idem.WithTombstones) forgets the tombstone, so that
// the next call runs the operation instead of getting ErrLateRetry; status
// names the tombstone, and a second forget has nothing to forget.
func TestForgetTombstone(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	const retention = time.Second
	svc := idem.New(srv.Client(t), idem.WithLease(500*time.Millisecond), idem.WithRetention(retention), idem.WithTombstones(time.Hour), idem.WithLogger(nil))
	defer svc.Close()
	runs := 0
	fn := func(context.Context) ([]byte, error) { runs++; return []byte("r"), nil }
	if _, err := svc.Do(ctx, "k", "fp", fn); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := svc.Do(ctx, "k", "fp", fn)
		if errors.Is(err, idem.ErrLateRetry) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("waiting for the retention to end: %v", err)
		}
		time.Sleep(retention / 4)
	}
	r := idemctl(t, "status", "k", "-redis", srv.Addr(), "-json")
	r.mustExit(t, 0)
	var j statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if j.State != "absent" || !j.Tombstone || !strings.Contains(j.Next, "refused with idem.ErrLateRetry") || len(j.Elsewhere) != 0 {
		t.Fatalf("status of a tombstoned key: %+v", j)
	}
	r = idemctl(t, "forget", "k", "-yes", "-redis", srv.Addr())
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `forgot key "k" (it was a tombstone)`) || !strings.Contains(r.stdout, "next:   the next call runs the operation as attempt 1") {
		t.Fatalf("forget of a tombstoned key:\n%s", r.stdout)
	}
	if got, err := svc.Do(ctx, "k", "fp", fn); err != nil || string(got) != "r" || runs != 2 {
		t.Fatalf("the call after forget: %q, %v, runs %d; want the operation run again", got, err, runs)
	}
	r = idemctl(t, "forget", "k", "-yes", "-redis", srv.Addr())
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `forgot key "k" (it was done, attempt 1)`) {
		t.Fatalf("forget of the new record:\n%s", r.stdout)
	}
	r = idemctl(t, "forget", "k", "-yes", "-redis", srv.Addr())
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `key "k" has no record and no tombstone: nothing to forget`) {
		t.Fatalf("forget of a forgotten key:\n%s", r.stdout)
	}
}
