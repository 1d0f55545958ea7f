package idemsql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest/dbtest"
)

// pgBank returns a bank on PostgreSQL.
func pgBank(t *testing.T) *bank {
	return newBank(t, backendNamed("postgres"))
}

// sqlState returns the SQLSTATE code in err's chain, or "".
func sqlState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// expectTransient checks that a Do that failed at the commit reported no
// success, a transient error, and left the key released for attempt 2.
func expectTransient(t *testing.T, c *idem.Client, key string, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("Do returned success for a commit that failed")
	}
	if idem.IsPermanent(err) {
		t.Errorf("Do: %v is permanent, want a transient error", err)
	}
	st, serr := c.Status(context.Background(), key)
	if serr != nil || st.State != idem.StateReleased || st.Attempt != 1 {
		t.Errorf("status after the failed commit: %+v, %v; want released at attempt 1", st, serr)
	}
}

// The Postgres backend is killed (pg_terminate_backend) while it runs the
// COMMIT: nothing is committed, Do reports a transient error, and the next
// call runs fn again and commits once.
func TestBackendKilledAtCommit(t *testing.T) {
	t.Parallel()
	b := pgBank(t)
	ctx := context.Background()
	// A deferred trigger makes the COMMIT of a 'slow' movement sleep.
	for _, q := range []string{
		`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.kind = 'slow' THEN PERFORM pg_sleep(60); END IF;
			RETURN NULL;
		END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON movements
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`,
	} {
		if _, err := b.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	c := b.client(t)
	fn := func(ctx context.Context) (Receipt, error) {
		a, _ := idem.AttemptFrom(ctx)
		kind := "debit"
		if a.Number == 1 {
			kind = "slow"
		}
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback()
		r, err := b.change(ctx, tx, "op", 10, kind)
		if err != nil {
			return Receipt{}, err
		}
		return r, idemsql.Commit(ctx, tx, r)
	}
	killed := make(chan error, 1)
	go func() {
		killed <- func() error {
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				err := b.db.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE wait_event = 'PgSleep' AND datname = current_database()`).Scan(&n)
				if err != nil {
					return err
				}
				if n > 0 {
					return nil
				}
				time.Sleep(20 * time.Millisecond)
			}
			return errors.New("no backend sleeping in its COMMIT within 30s")
		}()
	}()
	_, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	if kerr := <-killed; kerr != nil {
		t.Fatal(kerr)
	}
	t.Logf("Do with the backend killed at COMMIT: %v", err)
	expectTransient(t, c, "op", err)
	if _, ok, _ := b.ledger.Lookup(ctx, "op"); ok {
		t.Error("the ledger holds the outcome of the killed commit")
	}
	if n := b.movements(t, "op"); n != 0 {
		t.Errorf("%d movements after the killed commit, want 0", n)
	}
	r, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	if err != nil || r.Attempt != 2 {
		t.Fatalf("next call: %v, %v; want a receipt of attempt 2", r, err)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Errorf("%d movements, want 1", n)
	}
	if n := b.balance(t); n != opening-10 {
		t.Errorf("balance %d, want %d", n, opening-10)
	}
}

// The connection is lost after COMMIT was sent, and the commit lands: the
// reply never reaches the client. Do reports a transient error, not a
// success; the next call's lookup finds the committed outcome and returns
// it without running fn.
func TestCommitReplyLost(t *testing.T) {
	t.Parallel()
	b := pgBank(t)
	ctx := context.Background()
	p := newCommitProxy(t, b.dsn)
	viaProxy := openPostgres(t, p.dsn)
	c := b.client(t)
	var runs atomic.Int64
	fn := func(ctx context.Context) (Receipt, error) {
		runs.Add(1)
		tx, err := viaProxy.BeginTx(ctx, nil)
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback()
		r, err := b.change(ctx, tx, "op", 10, "debit")
		if err != nil {
			return Receipt{}, err
		}
		p.armed.Store(true)
		return r, idemsql.Commit(ctx, tx, r)
	}
	_, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	if !p.dropped.Load() {
		t.Fatal("the proxy saw no COMMIT")
	}
	t.Logf("Do with the COMMIT's reply lost: %v", err)
	expectTransient(t, c, "op", err)
	select {
	case <-p.landed:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not answer the COMMIT within 30s")
	}
	e := b.entry(t, "op") // the commit landed
	if n := b.movements(t, "op"); n != 1 {
		t.Fatalf("%d movements, want the 1 committed", n)
	}
	p.armed.Store(false)
	r, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	if err != nil || r.Attempt != 1 || r.Balance != opening-10 {
		t.Fatalf("next call: %v, %v; want the committed receipt of attempt 1", r, err)
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times, want 1: the lookup should find the commit", runs.Load())
	}
	if e.Attempt != 1 {
		t.Errorf("ledger entry of attempt %d, want 1", e.Attempt)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Errorf("%d movements, want 1", n)
	}
}

// A serialization failure (SERIALIZABLE, write skew with another
// transaction that commits first) fails the commit: Do reports it as the
// transient error it is, nothing is recorded, and the next call commits.
func TestSerializationFailureStaysTransient(t *testing.T) {
	t.Parallel()
	b := pgBank(t)
	ctx := context.Background()
	if _, err := b.db.Exec("INSERT INTO accounts (id, balance) VALUES ('other', 0)"); err != nil {
		t.Fatal(err)
	}
	c := b.client(t)
	fn := func(ctx context.Context) (Receipt, error) {
		a, _ := idem.AttemptFrom(ctx)
		tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback()
		var sum int64
		if err := tx.QueryRowContext(ctx, "SELECT sum(balance) FROM accounts").Scan(&sum); err != nil {
			return Receipt{}, err
		}
		r, err := b.change(ctx, tx, "op", 10, "debit")
		if err != nil {
			return Receipt{}, err
		}
		if a.Number == 1 {
			// Another transaction reads what this one wrote and writes
			// what it read, and commits first.
			other, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
			if err != nil {
				return Receipt{}, err
			}
			defer other.Rollback()
			if err := other.QueryRowContext(ctx, "SELECT sum(balance) FROM accounts").Scan(&sum); err != nil {
				return Receipt{}, err
			}
			if _, err := other.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 'other'"); err != nil {
				return Receipt{}, err
			}
			if err := other.Commit(); err != nil {
				return Receipt{}, err
			}
		}
		return r, idemsql.Commit(ctx, tx, r)
	}
	_, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	t.Logf("Do with a serialization failure: %v", err)
	if s := sqlState(err); s != "40001" {
		t.Errorf("Do: %v (SQLSTATE %q), want the serialization failure 40001", err, s)
	}
	expectTransient(t, c, "op", err)
	if _, ok, _ := b.ledger.Lookup(ctx, "op"); ok {
		t.Error("the ledger holds the outcome of the failed commit")
	}
	r, err := idem.Do(ctx, c, "op", fingerprint("op", 10), fn)
	if err != nil || r.Attempt != 2 {
		t.Fatalf("next call: %v, %v; want a receipt of attempt 2", r, err)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Errorf("%d movements, want 1", n)
	}
}

// commitProxy forwards connections to a Postgres server; once armed, it
// passes the first client message that holds a COMMIT to the server and
// then cuts the client off, so that the commit runs but its reply is lost.
// landed is closed when the server has answered that COMMIT.
type commitProxy struct {
	dsn     string
	armed   atomic.Bool
	dropped atomic.Bool
	landed  chan struct{}
}

func newCommitProxy(t *testing.T, dsn string) *commitProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(dsn, "@")
	server, db, _ := strings.Cut(rest, "/")
	p := &commitProxy{dsn: "postgres://postgres@" + l.Addr().String() + "/" + db, landed: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			cc, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(cc, server) })
		}
	})
	return p
}

// serve forwards one connection both ways until either side closes it.
func (p *commitProxy) serve(client net.Conn, server string) {
	defer client.Close()
	sc, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer sc.Close()
	var cut atomic.Bool // the client was cut off after its COMMIT
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer client.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := sc.Read(buf)
			if n > 0 && cut.Load() {
				// The COMMIT's CommandComplete: the commit landed.
				if bytes.Contains(buf[:n], []byte("COMMIT\x00")) {
					close(p.landed)
					return
				}
				continue
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			commit := p.armed.Load() && bytes.Contains(bytes.ToLower(buf[:n]), []byte("commit"))
			if commit && p.dropped.CompareAndSwap(false, true) {
				cut.Store(true)
				client.Close()
				_, _ = sc.Write(buf[:n])
				<-done // the server's reply, unforwarded
				return
			}
			if _, werr := sc.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	sc.Close()
	<-done
}

// Under REPEATABLE READ, an INSERT that meets a ledger row committed after
// the transaction's snapshot fails with a serialization error instead of
// doing nothing. Commit reads the row and returns the recorded outcome all
// the same. Here another Client, on a Redis of its own (as if the first
// had lost its records), commits the key while the first's fn holds its
// snapshot.
func TestCommitUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	b := pgBank(t)
	ctx := context.Background()
	first := b.client(t)
	other := &bank{name: b.name, db: b.db, dialect: b.dialect, ledger: b.ledger, redis: dbtest.StartRedis(t)}
	second := other.client(t)
	fp := fingerprint("op", 10)
	var (
		recorded  Receipt
		commitErr error
	)
	got, err := idem.Do(ctx, first, "op", fp, func(ctx context.Context) (Receipt, error) {
		tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			return Receipt{}, err
		}
		defer tx.Rollback()
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM movements").Scan(&n); err != nil { // the snapshot
			return Receipt{}, err
		}
		if recorded, err = idem.Do(ctx, second, "op", fp, b.debit("op", 10)); err != nil {
			return Receipt{}, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO movements (op, amount, attempt, kind) VALUES ('op', 10, 1, 'debit')"); err != nil {
			return Receipt{}, err
		}
		commitErr = idemsql.Commit(ctx, tx, Receipt{Op: "op", Amount: 10, Attempt: 1})
		return Receipt{}, commitErr
	})
	if !errors.Is(commitErr, idem.ErrRecorded) {
		t.Errorf("Commit under REPEATABLE READ after another commit: %v, want ErrRecorded", commitErr)
	}
	if err != nil || got != recorded {
		t.Errorf("Do: %v, %v; want the recorded %v", got, err, recorded)
	}
	if n := b.movements(t, "op"); n != 1 {
		t.Errorf("%d movements, want 1", n)
	}
}
