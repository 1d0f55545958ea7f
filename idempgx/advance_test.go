package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// eventsDB is a database with a migrated ledger and a business table,
// state, that holds the last version applied to each entity.
type eventsDB struct {
	dsn    string
	pool   *pgxpool.Pool
	ledger *idempgx.Ledger
	ctx    context.Context // carries the ledger
}

func newEventsDB(t *testing.T) *eventsDB {
	t.Helper()
	dsn := dbtest.SharedPostgres(t).NewDatabase(t)
	pool, _ := openPool(t, dsn, 0)
	l := idempgx.New(pool)
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE state (entity text PRIMARY KEY, last bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for i := range entities {
		if _, err := pool.Exec(ctx, "INSERT INTO state (entity, last) VALUES ($1, 0)", fmt.Sprintf("order-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	return &eventsDB{dsn: dsn, pool: pool, ledger: l, ctx: idempgx.NewContext(ctx, l)}
}

type event struct {
	entity  string
	version int64
}

// apply applies ev in one transaction through advance: the state row moves
// to ev's version, from version-1 for AdvanceInOrder, from below it for
// Advance. It returns advance's error, or an error of the database;
// outOfOrder counts the events whose state row was elsewhere: the guard
// let through an event it should have refused.
func (e *eventsDB) apply(ev event, inOrder bool, outOfOrder *atomic.Int64) error {
	ctx := e.ctx
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	advance := idempgx.Advance
	cond := "last < $1"
	if inOrder {
		advance, cond = idempgx.AdvanceInOrder, "last = $1 - 1"
	}
	if err := advance(ctx, tx, ev.entity, ev.version); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, "UPDATE state SET last = $1 WHERE entity = $2 AND "+cond, ev.version, ev.entity)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		outOfOrder.Add(1)
	}
	return tx.Commit(ctx)
}

func (e *eventsDB) last(t *testing.T, entity string) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), "SELECT last FROM state WHERE entity = $1", entity).Scan(&n); err != nil {
		t.Fatalf("state of %s: %v", entity, err)
	}
	return n
}

const (
	entities    = 10
	versions    = 100
	advanceRuns = 4 // goroutines
)

// shuffledEvents returns every version of every entity twice, shuffled.
func shuffledEvents(seed uint64) []event {
	var evs []event
	for copy := 0; copy < 2; copy++ {
		for i := range entities {
			for v := int64(1); v <= versions; v++ {
				evs = append(evs, event{entity: fmt.Sprintf("order-%d", i), version: v})
			}
		}
	}
	r := rand.New(rand.NewPCG(seed, 36))
	r.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	return evs
}

// inbox is what a consumer of a stream does with the events that
// AdvanceInOrder refused with ErrGap: it holds them, and redelivers an
// entity's held events (lowest version first) once the entity moved.
type inbox struct {
	mu       sync.Mutex
	cond     *sync.Cond
	queue    []event
	held     map[string][]event
	moved    map[string]int // how often each entity moved
	inFlight int
}

func newInbox(evs []event) *inbox {
	b := &inbox{queue: evs, held: map[string][]event{}, moved: map[string]int{}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// next returns the next event and its entity's move count, or false when
// every event is done.
func (b *inbox) next() (event, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) == 0 {
		if b.inFlight == 0 {
			return event{}, 0, false
		}
		b.cond.Wait()
	}
	ev := b.queue[0]
	b.queue = b.queue[1:]
	b.inFlight++
	return ev, b.moved[ev.entity], true
}

// done reports ev's fate: applied (the entity moved), held (ErrGap; seen
// is the entity's move count when ev was taken), or finished otherwise.
func (b *inbox) done(ev event, applied, gap bool, seen int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight--
	switch {
	case applied:
		b.moved[ev.entity]++
		h := b.held[ev.entity]
		delete(b.held, ev.entity)
		slices.SortFunc(h, func(x, y event) int { return int(x.version - y.version) })
		b.queue = append(h, b.queue...)
	case gap && b.moved[ev.entity] != seen:
		b.queue = append([]event{ev}, b.queue...) // it moved meanwhile
	case gap:
		b.held[ev.entity] = append(b.held[ev.entity], ev)
	}
	b.cond.Broadcast()
}

// Every event twice, shuffled, through AdvanceInOrder by several
// goroutines: each version is applied once, in order, and every copy
// after the first is refused as stale.
func TestAdvanceInOrderShuffled(t *testing.T) {
	t.Parallel()
	e := newEventsDB(t)
	box := newInbox(shuffledEvents(1))
	var applied, stale, gaps, retried, outOfOrder atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, advanceRuns)
	for range advanceRuns {
		wg.Go(func() {
			for {
				ev, seen, ok := box.next()
				if !ok {
					return
				}
				err := e.apply(ev, true, &outOfOrder)
				switch {
				case err == nil:
					applied.Add(1)
				case errors.Is(err, idempgx.ErrStale):
					if !idem.IsPermanent(err) {
						errs <- fmt.Errorf("ErrStale not permanent: %v", err)
						box.done(ev, false, false, seen)
						return
					}
					stale.Add(1)
				case errors.Is(err, idempgx.ErrGap):
					if idem.IsPermanent(err) {
						errs <- fmt.Errorf("ErrGap permanent: %v", err)
					}
					gaps.Add(1)
				default:
					// A deadlock or a busy database: transient, as a
					// consumer would see it. Deliver the event again.
					retried.Add(1)
					box.done(ev, false, true, -1)
					continue
				}
				box.done(ev, err == nil, errors.Is(err, idempgx.ErrGap), seen)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(box.held); n != 0 {
		t.Errorf("%d entities have events held for ever: %v", n, box.held)
	}
	if got, want := applied.Load(), int64(entities*versions); got != want {
		t.Errorf("applied %d events, want %d", got, want)
	}
	if got, want := stale.Load(), int64(entities*versions); got != want {
		t.Errorf("refused %d as stale, want %d (one copy of each)", got, want)
	}
	if n := outOfOrder.Load(); n != 0 {
		t.Errorf("%d events applied out of order", n)
	}
	for i := range entities {
		if got := e.last(t, fmt.Sprintf("order-%d", i)); got != versions {
			t.Errorf("order-%d at %d, want %d", i, got, versions)
		}
	}
	t.Logf("applied %d, stale %d, gaps %d, transient retries %d", applied.Load(), stale.Load(), gaps.Load(), retried.Load())
}

// With Advance, a version at or below the recorded one is refused and
// counted; every applied version is above the one before it.
func TestAdvanceShuffled(t *testing.T) {
	t.Parallel()
	e := newEventsDB(t)
	evs := shuffledEvents(2)
	var next atomic.Int64
	var applied, stale, retried, outOfOrder atomic.Int64
	var wg sync.WaitGroup
	for range advanceRuns {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(evs)) {
					return
				}
				for {
					err := e.apply(evs[i], false, &outOfOrder)
					switch {
					case err == nil:
						applied.Add(1)
					case errors.Is(err, idempgx.ErrStale) && idem.IsPermanent(err):
						stale.Add(1)
					case errors.Is(err, idempgx.ErrGap):
						t.Errorf("Advance returned ErrGap: %v", err)
					default:
						retried.Add(1)
						continue
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if got := applied.Load() + stale.Load(); got != int64(len(evs)) {
		t.Errorf("applied %d + stale %d = %d, want %d", applied.Load(), stale.Load(), got, len(evs))
	}
	if stale.Load() < int64(entities*versions) {
		t.Errorf("stale %d, want at least %d (every second copy)", stale.Load(), entities*versions)
	}
	// apply's UPDATE moves the state only forward: an applied event at
	// or below the state leaves it where it was, and counts.
	if n := outOfOrder.Load(); n != 0 {
		t.Errorf("%d events applied at or below the entity's state", n)
	}
	for i := range entities {
		if got := e.last(t, fmt.Sprintf("order-%d", i)); got != versions {
			t.Errorf("order-%d at %d, want %d", i, got, versions)
		}
	}
	t.Logf("applied %d, stale %d, transient retries %d", applied.Load(), stale.Load(), retried.Load())
}

// Many transactions advance one entity to one version at once: one
// succeeds, the others see its version and are refused as stale.
func TestAdvanceConcurrent(t *testing.T) {
	t.Parallel()
	e := newEventsDB(t)
	const racers = 8
	for v := int64(1); v <= 5; v++ {
		var applied, stale, outOfOrder atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range racers {
			wg.Go(func() {
				<-start
				for {
					err := e.apply(event{entity: "order-0", version: v}, false, &outOfOrder)
					switch {
					case err == nil:
						applied.Add(1)
					case errors.Is(err, idempgx.ErrStale):
						stale.Add(1)
					default:
						continue // a deadlock, a busy database: again
					}
					return
				}
			})
		}
		close(start)
		wg.Wait()
		if applied.Load() != 1 || stale.Load() != racers-1 || outOfOrder.Load() != 0 {
			t.Errorf("version %d: applied %d, stale %d, out of order %d; want 1, %d, 0", v, applied.Load(), stale.Load(), outOfOrder.Load(), racers-1)
		}
	}
}

// Advance needs a ledger: an idem call's, or NewContext's; versions start
// at 1; a missing table names Migrate.
func TestAdvanceRefuses(t *testing.T) {
	t.Parallel()
	e := newEventsDB(t)
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	err = idempgx.Advance(context.Background(), tx, "order-1", 1)
	if err == nil || !strings.Contains(err.Error(), "NewContext") {
		t.Errorf("Advance without a ledger: %v, want an error naming NewContext", err)
	}
	if err := idempgx.Advance(e.ctx, tx, "order-1", 0); err == nil || !idem.IsPermanent(err) {
		t.Errorf("Advance to version 0: %v, want a permanent error", err)
	}
	other := idempgx.NewContext(e.ctx, idempgx.New(e.pool, idempgx.WithTable("never_migrated")))
	if err := idempgx.Advance(other, tx, "order-1", 1); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("Advance without its table: %v, want an error naming Migrate", err)
	}
}

// ErrStale and ErrGap are idemsql's: a consumer's errors.Is check holds
// whichever driver applied the event; and idemsql's Advance continues
// from the version that idempgx's recorded, in the same table.
func TestAdvanceAsIdemsql(t *testing.T) {
	t.Parallel()
	e := newEventsDB(t)
	ctx := e.ctx
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := idempgx.AdvanceInOrder(ctx, tx, "order-1", 1); err != nil {
		t.Fatal(err)
	}
	stale := idempgx.Advance(ctx, tx, "order-1", 1)
	gap := idempgx.AdvanceInOrder(ctx, tx, "order-1", 3)
	if !errors.Is(stale, idemsql.ErrStale) || !errors.Is(gap, idemsql.ErrGap) || errors.Is(gap, idemsql.ErrStale) {
		t.Errorf("stale %v, gap %v: want idemsql's ErrStale and ErrGap", stale, gap)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	db := dbtest.SharedPostgres(t).Open(t, e.dsn)
	sqlLedger := idemsql.New(db, idemsql.Postgres)
	sqlCtx := idemsql.NewContext(context.Background(), sqlLedger)
	stx, err := db.BeginTx(sqlCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stx.Rollback()
	if err := idemsql.AdvanceInOrder(sqlCtx, stx, "order-1", 1); !errors.Is(err, idempgx.ErrStale) {
		t.Errorf("idemsql's AdvanceInOrder to the version idempgx recorded: %v, want ErrStale", err)
	}
	if err := idemsql.AdvanceInOrder(sqlCtx, stx, "order-1", 2); err != nil {
		t.Errorf("idemsql's AdvanceInOrder to the next version: %v", err)
	}
}
