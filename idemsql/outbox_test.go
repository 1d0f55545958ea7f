package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/ledgertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// outboxDB is a database with a migrated ledger, and for the tests of
// this package a redis-server.
type outboxDB struct {
	name   string
	db     *sql.DB
	ledger *idemsql.Ledger
	ctx    context.Context // carries the ledger
	redis  *dbtest.Redis
}

func newOutboxDB(t testing.TB, be servertest.Backend) *outboxDB {
	db, _ := be.Open(t)
	l := idemsql.New(db, dialects[be.Name])
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &outboxDB{name: be.Name, db: db, ledger: l, ctx: idemsql.NewContext(context.Background(), l)}
}

// publish commits n events to stream, with fields n (0, 1, ...) from
// first, in transactions of per events each; it returns their ids.
func (o *outboxDB) publish(t *testing.T, stream string, first, n, per int) []string {
	t.Helper()
	var ids []string
	for i := first; i < first+n; i += per {
		tx, err := o.db.BeginTx(o.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j := i; j < min(i+per, first+n); j++ {
			id, err := idemsql.Publish(o.ctx, tx, stream, map[string]any{"n": j})
			if err != nil {
				tx.Rollback()
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// outboxRows returns how many rows the outbox holds.
func (o *outboxDB) outboxRows(t *testing.T) int {
	t.Helper()
	n, err := o.Rows(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The drivers' outbox scenarios, on every backend; two relays at once on
// PostgreSQL and MariaDB, which claim with SKIP LOCKED.
func TestOutbox(t *testing.T) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			ledgertest.ExerciseOutbox(t, ledgertest.OutboxDriver{Name: "idemsql/" + be.Name,
				Open:         func(tb testing.TB) ledgertest.Outbox { return newOutboxBackend(tb, be) },
				EventIDField: idemsql.EventIDField, SharedRelays: be.Name != "sqlite"})
		})
	}
}

// outboxBackend is an outbox that is also the suite's Backend on the same
// database: the consumers of ledgertest's RelayRedisRestarted apply the
// events through its ledger, as movements.
type outboxBackend struct {
	*outboxDB
	*suiteBackend
}

func newOutboxBackend(tb testing.TB, be servertest.Backend) outboxBackend {
	o := newOutboxDB(tb, be)
	if _, err := o.db.Exec("CREATE TABLE suite_movements (account TEXT NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return outboxBackend{o, &suiteBackend{tb: tb, be: be, db: o.db, l: o.ledger}}
}

// Publish is ledgertest.Outbox's.
func (o *outboxDB) Publish(ctx context.Context, stream string, fields []map[string]any, rollback bool) ([]string, error) {
	ctx = idemsql.NewContext(ctx, o.ledger)
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var ids []string
	for _, f := range fields {
		id, err := idemsql.Publish(ctx, tx, stream, f)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if rollback {
		return ids, tx.Rollback()
	}
	return ids, tx.Commit()
}

// Relay is ledgertest.Outbox's.
func (o *outboxDB) Relay(ctx context.Context, rdb redis.UniversalClient, batch int, observe func(ledgertest.RelayCounts)) error {
	opts := []idemsql.RelayOption{idemsql.WithRelayPoll(10 * time.Millisecond), idemsql.WithRelayBackoff(200 * time.Millisecond)}
	if batch > 0 {
		opts = append(opts, idemsql.WithRelayBatch(batch))
	}
	if observe != nil {
		opts = append(opts, idemsql.WithRelayObserver(func(s idemsql.RelayStats) {
			observe(ledgertest.RelayCounts{Published: s.Published, Failures: s.Failures, Lag: s.Lag, Err: s.Err})
		}))
	}
	return o.ledger.Relay(ctx, rdb, opts...)
}

// Rows is ledgertest.Outbox's.
func (o *outboxDB) Rows(ctx context.Context) (int, error) {
	var n int
	err := o.db.QueryRowContext(ctx, "SELECT count(*) FROM "+o.ledger.Table()+"_outbox").Scan(&n)
	return n, err
}

// Inside an idem call, a re-run of fn publishes the same ids; another key,
// other ids.
func TestPublishIDsInDo(t *testing.T) {
	b := newBank(t, backendNamed("sqlite"))
	c := b.client(t)
	ctx := context.Background()
	var runs [][]string
	fn := func(ctx context.Context) (int, error) {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		var ids []string
		for i := range 3 {
			id, err := idemsql.Publish(ctx, tx, "orders", map[string]any{"i": i})
			if err != nil {
				return 0, err
			}
			ids = append(ids, id)
		}
		runs = append(runs, ids)
		if len(runs) == 1 {
			return 0, errors.New("transient: try again")
		}
		return len(ids), idemsql.Commit(ctx, tx, len(ids))
	}
	if _, err := idem.Do(ctx, c, "order-1", "", fn); err == nil {
		t.Fatal("first attempt: no error")
	}
	if _, err := idem.Do(ctx, c, "order-1", "", fn); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, c, "order-2", "", fn); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
	if fmt.Sprint(runs[0]) != fmt.Sprint(runs[1]) {
		t.Errorf("the re-run published %v, the first run %v: want the same ids", runs[1], runs[0])
	}
	all := map[string]bool{}
	for _, id := range append(runs[1], runs[2]...) {
		all[id] = true
	}
	if len(all) != 6 {
		t.Errorf("ids of two keys %v, %v: want 6 distinct", runs[1], runs[2])
	}
	var rows int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.ledger.Table() + "_outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 6 {
		t.Errorf("%d outbox rows, want 6 (the failed attempt's rolled back)", rows)
	}
}

// Fields of other types, and the relay's own field, are refused; outside
// an idem call, ids are random and distinct.
func TestPublishRefuses(t *testing.T) {
	o := newOutboxDB(t, backendNamed("sqlite"))
	tx, err := o.db.BeginTx(o.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, f := range []map[string]any{
		{"ok": "x", "paid": true},
		{"at": time.Now()},
		{"nil": nil},
		{idemsql.EventIDField: "mine"},
	} {
		if _, err := idemsql.Publish(o.ctx, tx, "orders", f); err == nil {
			t.Errorf("Publish(%v): no error", f)
		} else if !strings.Contains(err.Error(), "idemsql: Publish") {
			t.Errorf("Publish(%v): %v, want an error naming Publish", f, err)
		}
	}
	if _, err := idemsql.Publish(o.ctx, tx, "", nil); err == nil {
		t.Error("Publish to an empty stream name: no error")
	}
	if _, err := idemsql.Publish(context.Background(), tx, "orders", nil); err == nil || !strings.Contains(err.Error(), "NewContext") {
		t.Errorf("Publish without a ledger: %v, want an error naming NewContext", err)
	}
	a, err := idemsql.Publish(o.ctx, tx, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := idemsql.Publish(o.ctx, tx, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != 32 {
		t.Errorf("ids outside a call %q, %q: want two random ones", a, b)
	}
}

// Relay refuses bad options and a missing table.
func TestRelayRefuses(t *testing.T) {
	o := newOutboxDB(t, backendNamed("sqlite"))
	rdb := dbtest.StartRedis(t).Client(t)
	ctx := context.Background()
	for _, opt := range []idemsql.RelayOption{idemsql.WithRelayBatch(0), idemsql.WithRelayPoll(0), idemsql.WithRelayBackoff(-1)} {
		if err := o.ledger.Relay(ctx, rdb, opt); err == nil {
			t.Error("Relay with a bad option: no error")
		}
	}
	other := idemsql.New(o.db, idemsql.SQLite, idemsql.WithTable("never_migrated"))
	if err := other.Relay(ctx, rdb); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Relay without its table: %v, want an error naming Migrate", err)
	}
}
