package idemsql

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ledgertest/dbtest"
)

// mariadbLedger returns a migrated MySQL ledger in a new database of the
// shared MariaDB, opened with the DSN's parameters params ("" for none).
func mariadbLedger(t *testing.T, params string) *Ledger {
	t.Helper()
	m := dbtest.SharedMariaDB(t)
	dsn := m.NewDatabase(t)
	if params != "" {
		dsn += "&" + params
	}
	l := New(m.Open(t, dsn), MySQL)
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate with %q: %v", params, err)
	}
	return l
}

// commitEntry runs the ledger's side of a Commit of e in a new tx.
func commitEntry(ctx context.Context, l *Ledger, e idem.Entry) (idem.Entry, bool, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return idem.Entry{}, false, err
	}
	return (&txn{l: l, tx: tx}).Commit(ctx, e)
}

// The DSN's other settings change nothing: clientFoundRows (which makes an
// ON DUPLICATE KEY UPDATE that changes nothing report a row), client-side
// interpolation of parameters (keys as escaped literals), a session time
// zone far from UTC.
func TestMySQLDSNParameters(t *testing.T) {
	for _, params := range []string{"", "clientFoundRows=true", "interpolateParams=true", "time_zone=%27%2B09%3A00%27", "parseTime=false&loc=Local"} {
		t.Run(params, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l := mariadbLedger(t, params)
			key := "k\x00\xff\xfe'\"\\ " // NUL, invalid UTF-8, quotes, a trailing space
			first := idem.Entry{Key: key, FingerprintDigest: "\x00\xfffp", Attempt: 1, Value: []byte("\x00first")}
			if _, found, err := commitEntry(ctx, l, first); err != nil || found {
				t.Fatalf("first Commit: found %v, %v; want the row added", found, err)
			}
			got, found, err := commitEntry(ctx, l, idem.Entry{Key: key, Attempt: 2, Value: []byte("second")})
			if err != nil || !found {
				t.Fatalf("second Commit of the key: found %v, %v; want the first row found", found, err)
			}
			if got.Attempt != 1 || !bytes.Equal(got.Value, first.Value) || got.FingerprintDigest != first.FingerprintDigest {
				t.Errorf("second Commit found %+v; want the first row %+v", got, first)
			}
			if got.Age < 0 || got.Age > time.Minute {
				t.Errorf("Age %v of a row recorded just now", got.Age)
			}
			for _, other := range []string{"k\x00\xff\xfe'\"\\", "K\x00\xff\xfe'\"\\ "} {
				if _, ok, err := l.Lookup(ctx, other); ok || err != nil {
					t.Errorf("Lookup %q: %v, %v; want no row (keys are bytes)", other, ok, err)
				}
			}
		})
	}
}

// Migrate says what is wrong with a DSN that cannot work, and how to fix
// it.
func TestMySQLMigrateRefusesUnfitSessions(t *testing.T) {
	m := dbtest.SharedMariaDB(t)
	ctx := context.Background()
	for _, tc := range []struct{ name, dsn, want string }{
		{"no database", m.DSN(""), "names no database"},
		{"sql_mode not strict", m.NewDatabase(t) + "&sql_mode=%27NO_ENGINE_SUBSTITUTION%27", "STRICT_TRANS_TABLES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := New(m.Open(t, tc.dsn), MySQL).Migrate(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Migrate: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}

// A row the database refuses every time is a permanent error; a
// deadlock and a lock wait timeout are not.
func TestMySQLPermanentErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("key too long", func(t *testing.T) {
		t.Parallel()
		l := mariadbLedger(t, "")
		long := make([]byte, MySQL.d.maxKeyLen+1)
		_, _ = rand.Read(long)
		_, _, err := commitEntry(ctx, l, idem.Entry{Key: string(long), Attempt: 1, Value: []byte("v")})
		if !idem.IsPermanent(err) || mysqlErrno(err) != 1406 {
			t.Fatalf("a key of %d bytes: %v (error %d); want a permanent ER_DATA_TOO_LONG", len(long), err, mysqlErrno(err))
		}
	})
	t.Run("outcome over the server's max_allowed_packet", func(t *testing.T) {
		t.Parallel()
		l := mariadbLedger(t, "")
		var max int
		if err := l.db.QueryRow("SELECT @@max_allowed_packet").Scan(&max); err != nil {
			t.Fatal(err)
		}
		_, _, err := commitEntry(ctx, l, idem.Entry{Key: "k", Attempt: 1, Value: make([]byte, max+1)})
		t.Logf("an outcome over the server's max_allowed_packet: %v", err)
		if errors.Is(err, driver.ErrBadConn) {
			// The server may close the connection before the driver reads
			// its error: then the error is a lost connection, transient.
			t.Skip("the server closed the connection before its ER_NET_PACKET_TOO_LARGE was read")
		}
		if !idem.IsPermanent(err) {
			t.Fatalf("an outcome of %d bytes, over the server's max_allowed_packet: %v (error %d); want a permanent error", max+1, err, mysqlErrno(err))
		}
	})
	t.Run("lock wait timeout", func(t *testing.T) {
		t.Parallel()
		l := mariadbLedger(t, "innodb_lock_wait_timeout=1")
		holder := holdKey(t, l, "k")
		defer holder.Rollback()
		_, _, err := commitEntry(ctx, l, idem.Entry{Key: "k", Attempt: 2, Value: []byte("v")})
		if err == nil || idem.IsPermanent(err) || mysqlErrno(err) != 1205 {
			t.Fatalf("Commit behind another transaction's row: %v (error %d); want a transient ER_LOCK_WAIT_TIMEOUT", err, mysqlErrno(err))
		}
	})
	t.Run("deadlock", func(t *testing.T) {
		t.Parallel()
		l := mariadbLedger(t, "")
		// Two INSERTs of a key wait behind a third's; when it rolls back,
		// each holds a shared lock on the key and wants the exclusive one:
		// InnoDB ends one of them (ER_LOCK_DEADLOCK).
		holder := holdKey(t, l, "k")
		id, _ := l.databaseID(ctx, false)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				tx, err := l.db.BeginTx(ctx, nil)
				if err != nil {
					errs[i] = err
					return
				}
				defer tx.Rollback()
				if _, errs[i] = l.insert(ctx, tx, row{key: "k", attempt: int64(i + 2), outcome: []byte("v")}, id); errs[i] == nil {
					errs[i] = tx.Commit()
				}
			})
		}
		waitForInserts(t, l, 2)
		holder.Rollback()
		wg.Wait()
		var deadlock error
		for _, err := range errs {
			if mysqlErrno(err) == 1213 {
				deadlock = err
			} else if err != nil {
				t.Errorf("the other INSERT: %v; want it added", err)
			}
		}
		if deadlock == nil {
			t.Fatalf("errors %v; want one ER_LOCK_DEADLOCK", errs)
		}
		if _, found, err := l.insertFailed(ctx, "absent", deadlock); found || err == nil || idem.IsPermanent(err) {
			t.Errorf("a deadlock: found %v, %v; want a transient error", found, err)
		}
	})
}

// holdKey inserts key's row in a transaction that it leaves open.
func holdKey(t *testing.T, l *Ledger, key string) *sql.Tx {
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
	if added, err := l.insert(ctx, tx, row{key: key, attempt: 1, outcome: []byte("held")}, id); err != nil || !added {
		tx.Rollback()
		t.Fatalf("insert %q: %v, %v", key, added, err)
	}
	return tx
}

// waitForInserts waits until n connections to db's database run an
// INSERT into the ledger, and half a second more: they wait for a lock
// (InnoDB's lock tables in information_schema do not show such waits on
// MariaDB 10.11).
func waitForInserts(t *testing.T, l *Ledger, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var running int
		err := l.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND COMMAND = 'Execute' AND INFO LIKE ?", "INSERT INTO "+l.table+" %").Scan(&running)
		if err != nil {
			t.Fatal(err)
		}
		if running >= n {
			time.Sleep(500 * time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d INSERTs run after 30s; want %d", running, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// At every isolation level, a Commit whose INSERT meets a row committed
// after its transaction's snapshot returns that row: under REPEATABLE
// READ (InnoDB's default) a plain SELECT would read the snapshot, which
// lacks it.
func TestMySQLCommitMeetsARowCommittedAfterItsSnapshot(t *testing.T) {
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l := mariadbLedger(t, "")
			if _, err := l.db.Exec("CREATE TABLE business (n BIGINT)"); err != nil {
				t.Fatal(err)
			}
			tx, err := l.db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var n int
			if err := tx.QueryRow("SELECT COUNT(*) FROM business").Scan(&n); err != nil { // the snapshot
				t.Fatal(err)
			}
			if _, found, err := commitEntry(ctx, l, idem.Entry{Key: "k", Attempt: 1, Value: []byte("first")}); err != nil || found {
				t.Fatalf("the other Commit: found %v, %v", found, err)
			}
			if _, err := tx.Exec("INSERT INTO business (n) VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			got, found, err := (&txn{l: l, tx: tx}).Commit(ctx, idem.Entry{Key: "k", Attempt: 2, Value: []byte("second")})
			if err != nil || !found || string(got.Value) != "first" {
				t.Fatalf("Commit after the other: %+v, found %v, %v; want the first row", got, found, err)
			}
			if err := l.db.QueryRow("SELECT COUNT(*) FROM business").Scan(&n); err != nil || n != 0 {
				t.Errorf("%d business rows, %v; want the change rolled back", n, err)
			}
		})
	}
}
