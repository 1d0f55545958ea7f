package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// outboxDB is a database with a migrated ledger.
type outboxDB struct {
	dsn    string
	pool   *pgxpool.Pool
	ledger *idempgx.Ledger
	ctx    context.Context // carries the ledger
}

func newOutboxDB(t testing.TB) *outboxDB {
	t.Helper()
	dsn := dbtest.SharedPostgres(t).NewDatabase(t)
	pool, _ := openPool(t, dsn, 0)
	l := idempgx.New(pool)
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &outboxDB{dsn: dsn, pool: pool, ledger: l, ctx: idempgx.NewContext(context.Background(), l)}
}

// publish commits n events to stream, with fields n (first, first+1, ...),
// in transactions of per events each; it returns their ids.
func (o *outboxDB) publish(t *testing.T, stream string, first, n, per int) []string {
	t.Helper()
	var ids []string
	for i := first; i < first+n; i += per {
		tx, err := o.pool.Begin(o.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for j := i; j < min(i+per, first+n); j++ {
			id, err := idempgx.Publish(o.ctx, tx, stream, map[string]any{"n": j})
			if err != nil {
				_ = tx.Rollback(o.ctx)
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(o.ctx); err != nil {
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

// relay runs Relay with opts (after a 10ms poll and a 200ms backoff) until
// stop is called, which checks that it returned ctx's error.
func (o *outboxDB) relay(t *testing.T, rdb redis.UniversalClient, opts ...idempgx.RelayOption) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts = append([]idempgx.RelayOption{idempgx.WithRelayPoll(10 * time.Millisecond), idempgx.WithRelayBackoff(200 * time.Millisecond)}, opts...)
	go func() { done <- o.ledger.Relay(ctx, rdb, opts...) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Relay returned %v, want context.Canceled", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// The drivers' outbox scenarios, two relays at once among them.
func TestOutbox(t *testing.T) {
	t.Parallel()
	ledgertest.ExerciseOutbox(t, ledgertest.OutboxDriver{Name: "idempgx",
		Open:         func(tb testing.TB) ledgertest.Outbox { return newOutboxBackend(tb) },
		EventIDField: idempgx.EventIDField, SharedRelays: true})
}

// outboxBackend is an outbox that is also the suite's Backend on the same
// database: the consumers of ledgertest's RelayRedisRestarted apply the
// events through its ledger, as movements.
type outboxBackend struct {
	*outboxDB
	*suiteBackend
}

func newOutboxBackend(tb testing.TB) outboxBackend {
	o := newOutboxDB(tb)
	if _, err := o.pool.Exec(context.Background(), "CREATE TABLE suite_movements (account text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	return outboxBackend{o, &suiteBackend{tb: tb, pool: o.pool, l: o.ledger, dsn: o.dsn}}
}

// Publish is ledgertest.Outbox's.
func (o *outboxDB) Publish(ctx context.Context, stream string, fields []map[string]any, rollback bool) ([]string, error) {
	ctx = idempgx.NewContext(ctx, o.ledger)
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	var ids []string
	for _, f := range fields {
		id, err := idempgx.Publish(ctx, tx, stream, f)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if rollback {
		return ids, tx.Rollback(ctx)
	}
	return ids, tx.Commit(ctx)
}

// Relay is ledgertest.Outbox's.
func (o *outboxDB) Relay(ctx context.Context, rdb redis.UniversalClient, batch int, observe func(ledgertest.RelayCounts)) error {
	opts := []idempgx.RelayOption{idempgx.WithRelayPoll(10 * time.Millisecond), idempgx.WithRelayBackoff(200 * time.Millisecond)}
	if batch > 0 {
		opts = append(opts, idempgx.WithRelayBatch(batch))
	}
	if observe != nil {
		opts = append(opts, idempgx.WithRelayObserver(func(s idempgx.RelayStats) {
			observe(ledgertest.RelayCounts{Published: s.Published, Failures: s.Failures, Lag: s.Lag, Err: s.Err})
		}))
	}
	return o.ledger.Relay(ctx, rdb, opts...)
}

// Rows is ledgertest.Outbox's.
func (o *outboxDB) Rows(ctx context.Context) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.ledger.Table()+"_outbox").Scan(&n)
	return n, err
}

// Inside an idem call, a re-run of fn publishes the same ids; another key,
// other ids. A Publish rolled back to a savepoint gives its ordinal back.
func TestPublishIDsInDo(t *testing.T) {
	t.Parallel()
	b := newBank(t, 0)
	c := b.client(t)
	ctx := context.Background()
	var runs [][]string
	fn := func(ctx context.Context) (int, error) {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		var ids []string
		for i := range 3 {
			if i == 1 {
				// A savepoint whose Publish is rolled back.
				sp, err := tx.Begin(ctx)
				if err != nil {
					return 0, err
				}
				if _, err := idempgx.Publish(ctx, sp, "orders", map[string]any{"i": "gone"}); err != nil {
					return 0, err
				}
				if err := sp.Rollback(ctx); err != nil {
					return 0, err
				}
			}
			id, err := idempgx.Publish(ctx, tx, "orders", map[string]any{"i": i})
			if err != nil {
				return 0, err
			}
			ids = append(ids, id)
		}
		runs = append(runs, ids)
		if len(runs) == 1 {
			return 0, errors.New("transient: try again")
		}
		return len(ids), idempgx.Commit(ctx, tx, len(ids))
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
	for _, ids := range runs {
		for i, id := range ids {
			if !strings.HasSuffix(id, "-"+strconv.Itoa(i+1)) {
				t.Errorf("id %d is %s, want the ordinal %d", i, id, i+1)
			}
		}
	}
	all := map[string]bool{}
	for _, id := range append(runs[1], runs[2]...) {
		all[id] = true
	}
	if len(all) != 6 {
		t.Errorf("ids of two keys %v, %v: want 6 distinct", runs[1], runs[2])
	}
	var rows int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.ledger.Table()+"_outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 6 {
		t.Errorf("%d outbox rows, want 6 (the failed attempt's rolled back)", rows)
	}
}

// An event published through idempgx and one through idemsql, under the
// same key and ordinal, are the same row: the same id, stream and fields
// (in two ledgers of one database, as the ids would collide in one). And
// either driver's relay moves the other's rows.
func TestPublishAsIdemsql(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBank(t, 0)
	db := dbtest.SharedPostgres(t).Open(t, b.dsn)
	pgxLedger := idempgx.New(b.pool, idempgx.WithTable("pgx_ledger"))
	sqlLedger := idemsql.New(db, idemsql.Postgres, idemsql.WithTable("sql_ledger"))
	for _, m := range []interface{ Migrate(context.Context) error }{pgxLedger, sqlLedger} {
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pgxClient := idem.New(b.redis, idem.WithLedger(pgxLedger), idem.WithPrefix("pgx"), idem.WithLogger(nil))
	sqlClient := idem.New(b.redis, idem.WithLedger(sqlLedger), idem.WithPrefix("sql"), idem.WithLogger(nil))
	t.Cleanup(func() { pgxClient.Close(); sqlClient.Close() })
	fields := func(i int) map[string]any {
		return map[string]any{"order": "o-1", "i": i, "rate": 0.25, "big": 1e21, "small": float32(1.5e-7), "raw": []byte{0, 0xff}, "": "empty key"}
	}
	_, err := idem.Do(ctx, pgxClient, "order-1", "", func(ctx context.Context) (int, error) {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		for i := range 3 {
			if _, err := idempgx.Publish(ctx, tx, "orders", fields(i)); err != nil {
				return 0, err
			}
		}
		// In a step, the step's name joins the key.
		if _, err := idem.Step(ctx, "notify", func(ctx context.Context) (int, error) {
			_, err := idempgx.Publish(ctx, tx, "orders", fields(9))
			return 0, err
		}); err != nil {
			return 0, err
		}
		return 0, idempgx.Commit(ctx, tx, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, sqlClient, "order-1", "", func(ctx context.Context) (int, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		for i := range 3 {
			if _, err := idemsql.Publish(ctx, tx, "orders", fields(i)); err != nil {
				return 0, err
			}
		}
		if _, err := idem.Step(ctx, "notify", func(ctx context.Context) (int, error) {
			_, err := idemsql.Publish(ctx, tx, "orders", fields(9))
			return 0, err
		}); err != nil {
			return 0, err
		}
		return 0, idemsql.Commit(ctx, tx, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	got, want := outboxDump(t, b.pool, "pgx_ledger"), outboxDump(t, b.pool, "sql_ledger")
	if len(want) != 4 {
		t.Fatalf("idemsql's outbox: %q, want 4 rows", want)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("idempgx's outbox:\n%s\nidemsql's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Each driver's relay moves the other's rows (one table, random ids).
	rdb := b.redis
	o := &outboxDB{pool: b.pool, ledger: b.ledger, ctx: idempgx.NewContext(ctx, b.ledger)}
	sqlDefault := idemsql.New(db, idemsql.Postgres)
	if err := sqlDefault.Migrate(ctx); err != nil { // finds idempgx's tables
		t.Fatal(err)
	}
	pgxIDs := o.publish(t, "cross", 0, 5, 5)
	relayCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sqlDefault.Relay(relayCtx, rdb, idemsql.WithRelayPoll(10*time.Millisecond))
	}()
	ledgertest.WaitUntil(t, "idemsql's relay to move idempgx's rows", func() bool { return o.outboxRows(t) == 0 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("idemsql's Relay: %v", err)
	}
	sqlCtx := idemsql.NewContext(ctx, sqlDefault)
	tx, err := db.BeginTx(sqlCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sqlIDs []string
	for i := range 5 {
		id, err := idemsql.Publish(sqlCtx, tx, "cross", map[string]any{"n": 5 + i})
		if err != nil {
			t.Fatal(err)
		}
		sqlIDs = append(sqlIDs, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	o.relay(t, rdb)
	ledgertest.WaitUntil(t, "idempgx's relay to move idemsql's rows", func() bool { return o.outboxRows(t) == 0 })
	msgs := ledgertest.StreamEntries(t, rdb, "cross")
	for i, m := range msgs {
		if m.Values["n"] != strconv.Itoa(i) {
			t.Errorf("entry %d: %v, want n=%d", i, m.Values, i)
		}
	}
	seen := ledgertest.CountIDs(msgs, idempgx.EventIDField)
	for _, id := range append(pgxIDs, sqlIDs...) {
		if seen[id] != 1 {
			t.Errorf("id %s published %d times, want 1", id, seen[id])
		}
	}
}

// outboxDump returns the outbox rows of table's ledger, in order: id,
// stream and fields, in hex.
func outboxDump(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT encode(event_id, 'escape'), encode(stream, 'hex'), encode(fields, 'hex') FROM "+table+"_outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id, stream, fields string
		err := r.Scan(&id, &stream, &fields)
		return id + " " + stream + " " + fields, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// Fields of other types, and the relay's own field, are refused; outside
// an idem call, ids are random and distinct.
func TestPublishRefuses(t *testing.T) {
	t.Parallel()
	o := newOutboxDB(t)
	tx, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(o.ctx)
	for _, f := range []map[string]any{
		{"ok": "x", "paid": true},
		{"at": time.Now()},
		{"nil": nil},
		{idempgx.EventIDField: "mine"},
	} {
		if _, err := idempgx.Publish(o.ctx, tx, "orders", f); err == nil {
			t.Errorf("Publish(%v): no error", f)
		} else if !strings.Contains(err.Error(), "idempgx: Publish") {
			t.Errorf("Publish(%v): %v, want an error naming Publish", f, err)
		}
	}
	if _, err := idempgx.Publish(o.ctx, tx, "", nil); err == nil {
		t.Error("Publish to an empty stream name: no error")
	}
	if _, err := idempgx.Publish(context.Background(), tx, "orders", nil); err == nil || !strings.Contains(err.Error(), "NewContext") {
		t.Errorf("Publish without a ledger: %v, want an error naming NewContext", err)
	}
	a, err := idempgx.Publish(o.ctx, tx, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := idempgx.Publish(o.ctx, tx, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != 32 {
		t.Errorf("ids outside a call %q, %q: want two random ones", a, b)
	}
	other := idempgx.NewContext(o.ctx, idempgx.New(o.pool, idempgx.WithTable("never_migrated")))
	if _, err := idempgx.Publish(other, tx, "orders", nil); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Publish without its table: %v, want an error naming Migrate", err)
	}
}

// Relay refuses bad options and a missing table.
func TestRelayRefuses(t *testing.T) {
	t.Parallel()
	o := newOutboxDB(t)
	rdb := dbtest.StartRedis(t).Client(t)
	ctx := context.Background()
	for _, opt := range []idempgx.RelayOption{idempgx.WithRelayBatch(0), idempgx.WithRelayBatch(10_001), idempgx.WithRelayPoll(0), idempgx.WithRelayBackoff(-1)} {
		if err := o.ledger.Relay(ctx, rdb, opt); err == nil {
			t.Error("Relay with a bad option: no error")
		}
	}
	if err := o.ledger.Relay(ctx, nil); err == nil {
		t.Error("Relay with a nil client: no error")
	}
	other := idempgx.New(o.pool, idempgx.WithTable("never_migrated"))
	if err := other.Relay(ctx, rdb); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Relay without its table: %v, want an error naming Migrate", err)
	}
}
