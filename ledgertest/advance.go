// advance.go: ExerciseAdvance, the scenarios of a driver's entity versions
// (Advance and AdvanceInOrder), which keep each entity's events applied
// once, forward only or in order.

package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// AdvanceDriver is a driver's Advance and AdvanceInOrder under test.
type AdvanceDriver struct {
	// Name names the driver in the subtests' names, such as "idempgx".
	Name string

	// Open returns a Versions on a new database that the driver has
	// migrated, whose business rows of the entities AdvanceEntities names
	// are at version 0. What it opens is closed when tb ends. The suite
	// calls it once per scenario.
	Open func(tb testing.TB) Versions

	// ErrStale and ErrGap are the driver's sentinels (idemsql.ErrStale
	// and idemsql.ErrGap), matched with errors.Is.
	ErrStale, ErrGap error
}

// Versions is one database as the advance scenarios drive it: each entity
// has a business row that holds the last version applied to it.
type Versions interface {
	// Apply applies entity's event of version in one transaction: the
	// driver's AdvanceInOrder (with inOrder) or Advance, then the
	// business row moved to version where it is at version-1 (with
	// inOrder) or below version (without), then the commit. It returns
	// Advance's error or the database's; moved reports whether the
	// business row moved (a guard that let through an event it should
	// have refused leaves it where it was).
	Apply(ctx context.Context, entity string, version int64, inOrder bool) (moved bool, err error)

	// Last returns the version of entity's business row.
	Last(ctx context.Context, entity string) (int64, error)
}

// AdvanceEntities returns the entities whose business rows Open creates:
// "order-0" to "order-9".
func AdvanceEntities() []string {
	names := make([]string, advanceEntities)
	for i := range names {
		names[i] = fmt.Sprintf("order-%d", i)
	}
	return names
}

const (
	advanceEntities = 10
	advanceVersions = 100
	advanceRuns     = 4 // goroutines
	advanceRacers   = 8 // transactions advancing one entity at once
)

// ExerciseAdvance runs the advance scenarios on d, each as a subtest of t
// on a database of its own:
//
//   - every version of 10 entities × 100 versions twice, shuffled, through
//     AdvanceInOrder by 4 goroutines that hold back an event refused with
//     ErrGap (transient) until its entity moved: each version applied once,
//     in order; every second copy refused with ErrStale (permanent);
//   - the same through Advance: stale events refused and counted, the
//     entity only ever moved forward, every entity at its last version;
//   - 8 transactions advancing one entity to one version at once: one
//     applies, the others are refused as stale.
func ExerciseAdvance(t *testing.T, d AdvanceDriver) {
	t.Helper()
	if d.Open == nil || d.ErrStale == nil || d.ErrGap == nil {
		t.Fatal("ledgertest: AdvanceDriver needs Open, ErrStale and ErrGap")
	}
	for _, s := range []struct {
		name string
		run  func(t *testing.T, d AdvanceDriver, v Versions)
	}{
		{"InOrderShuffled", advanceInOrderShuffled},
		{"ForwardShuffled", advanceShuffled},
		{"Concurrent", advanceConcurrent},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			s.run(t, d, d.Open(t))
		})
	}
}

type versionedEvent struct {
	entity  string
	version int64
}

// shuffledEvents returns every version of every entity twice, shuffled.
func shuffledEvents(seed uint64) []versionedEvent {
	var evs []versionedEvent
	for range 2 {
		for _, entity := range AdvanceEntities() {
			for v := int64(1); v <= advanceVersions; v++ {
				evs = append(evs, versionedEvent{entity: entity, version: v})
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
	mu       sync.Mutex // guards the fields below
	cond     *sync.Cond
	queue    []versionedEvent
	held     map[string][]versionedEvent
	moved    map[string]int // how often each entity moved
	inFlight int
}

func newInbox(evs []versionedEvent) *inbox {
	b := &inbox{queue: evs, held: map[string][]versionedEvent{}, moved: map[string]int{}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// next returns the next event and its entity's move count, or false when
// every event is done.
func (b *inbox) next() (versionedEvent, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) == 0 {
		if b.inFlight == 0 {
			return versionedEvent{}, 0, false
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
func (b *inbox) done(ev versionedEvent, applied, gap bool, seen int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight--
	switch {
	case applied:
		b.moved[ev.entity]++
		h := b.held[ev.entity]
		delete(b.held, ev.entity)
		slices.SortFunc(h, func(x, y versionedEvent) int { return int(x.version - y.version) })
		b.queue = append(h, b.queue...)
	case gap && b.moved[ev.entity] != seen:
		b.queue = append([]versionedEvent{ev}, b.queue...) // it moved meanwhile
	case gap:
		b.held[ev.entity] = append(b.held[ev.entity], ev)
	}
	b.cond.Broadcast()
}

// apply is v.Apply, counting in outOfOrder the events applied where the
// business row was elsewhere.
func apply(v Versions, ev versionedEvent, inOrder bool, outOfOrder *atomic.Int64) error {
	moved, err := v.Apply(context.Background(), ev.entity, ev.version, inOrder)
	if err == nil && !moved {
		outOfOrder.Add(1)
	}
	return err
}

// checkLast fails t unless every entity is at its last version.
func checkLast(t *testing.T, v Versions) {
	t.Helper()
	for _, entity := range AdvanceEntities() {
		got, err := v.Last(context.Background(), entity)
		if err != nil {
			t.Fatalf("state of %s: %v", entity, err)
		}
		if got != advanceVersions {
			t.Errorf("%s at %d, want %d", entity, got, advanceVersions)
		}
	}
}

// Every event twice, shuffled, through AdvanceInOrder by several
// goroutines: each version is applied once, in order, and every copy
// after the first is refused as stale.
func advanceInOrderShuffled(t *testing.T, d AdvanceDriver, v Versions) {
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
				err := apply(v, ev, true, &outOfOrder)
				switch {
				case err == nil:
					applied.Add(1)
				case errors.Is(err, d.ErrStale):
					if !idem.IsPermanent(err) {
						errs <- fmt.Errorf("ErrStale not permanent: %v", err)
						box.done(ev, false, false, seen)
						return
					}
					stale.Add(1)
				case errors.Is(err, d.ErrGap):
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
				box.done(ev, err == nil, errors.Is(err, d.ErrGap), seen)
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
	if got, want := applied.Load(), int64(advanceEntities*advanceVersions); got != want {
		t.Errorf("applied %d events, want %d", got, want)
	}
	if got, want := stale.Load(), int64(advanceEntities*advanceVersions); got != want {
		t.Errorf("refused %d as stale, want %d (one copy of each)", got, want)
	}
	if n := outOfOrder.Load(); n != 0 {
		t.Errorf("%d events applied out of order", n)
	}
	checkLast(t, v)
	t.Logf("applied %d, stale %d, gaps %d, transient retries %d", applied.Load(), stale.Load(), gaps.Load(), retried.Load())
}

// With Advance, a version at or below the recorded one is refused and
// counted; every applied version is above the one before it.
func advanceShuffled(t *testing.T, d AdvanceDriver, v Versions) {
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
					err := apply(v, evs[i], false, &outOfOrder)
					switch {
					case err == nil:
						applied.Add(1)
					case errors.Is(err, d.ErrStale) && idem.IsPermanent(err):
						stale.Add(1)
					case errors.Is(err, d.ErrGap):
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
	if stale.Load() < int64(advanceEntities*advanceVersions) {
		t.Errorf("stale %d, want at least %d (every second copy)", stale.Load(), advanceEntities*advanceVersions)
	}
	// Apply moves the row only forward: an applied event at or below the
	// row's version leaves it where it was, and counts.
	if n := outOfOrder.Load(); n != 0 {
		t.Errorf("%d events applied at or below the entity's state", n)
	}
	checkLast(t, v)
	t.Logf("applied %d, stale %d, transient retries %d", applied.Load(), stale.Load(), retried.Load())
}

// Many transactions advance one entity to one version at once: one
// succeeds, the others see its version and are refused as stale.
func advanceConcurrent(t *testing.T, d AdvanceDriver, v Versions) {
	for version := int64(1); version <= 5; version++ {
		var applied, stale, outOfOrder atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range advanceRacers {
			wg.Go(func() {
				<-start
				for {
					err := apply(v, versionedEvent{entity: "order-0", version: version}, false, &outOfOrder)
					switch {
					case err == nil:
						applied.Add(1)
					case errors.Is(err, d.ErrStale):
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
		if applied.Load() != 1 || stale.Load() != advanceRacers-1 || outOfOrder.Load() != 0 {
			t.Errorf("version %d: applied %d, stale %d, out of order %d; want 1, %d, 0",
				version, applied.Load(), stale.Load(), outOfOrder.Load(), advanceRacers-1)
		}
	}
}
