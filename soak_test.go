package idem_test

// The soak test: many concurrent Do calls from three service instances on
// a real redis-server, with faults at random times, checked against the
// ledger invariant. Off by default; run it with
//
//	go test -run 'TestSoak$' -soak 5m -v -timeout 20m .
//
// or IDEM_SOAK=5m. TestSoakShort runs the same code for three seconds in
// every go test that is not -short, so that CI exercises it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var soak = flag.Duration("soak", 0, "run TestSoak for this long (also IDEM_SOAK=60s); 0 skips it")

// soakDuration is -soak, or else IDEM_SOAK, or else 0.
func soakDuration(t *testing.T) time.Duration {
	if *soak > 0 {
		return *soak
	}
	if s := os.Getenv("IDEM_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("IDEM_SOAK=%q: %v", s, err)
		}
		return d
	}
	return 0
}

func TestSoak(t *testing.T) {
	d := soakDuration(t)
	if d <= 0 {
		t.Skip("soak: off by default; run with -soak 60s")
	}
	runSoak(t, d)
}

// TestSoakShort is the soak for three seconds: every fault once at least,
// one kill -9 and restart. It keeps the soak's code working in CI; -short
// skips it.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped in -short")
	}
	if soakDuration(t) > 0 {
		t.Skip("soak: TestSoak runs the long soak")
	}
	runSoak(t, 3*time.Second)
}

const (
	soakClients  = 3                      // service instances, each with its own go-redis pool
	soakWorkers  = 96                     // concurrent callers
	soakWindow   = 150                    // keys in play at once
	soakPerKey   = 12                     // calls per key, on average, before the window moves on
	soakLease    = 2 * time.Second        // longer than any pause of the server
	soakMaxPause = 400 * time.Millisecond // the longest SIGSTOP of the server
	soakCooldown = 1500 * time.Millisecond
)

// soakRun is the state of one soak: the ledger of executions and final
// outcomes by key, and the counters of the summary.
type soakRun struct {
	seq    atomic.Int64 // orders executions and returns
	execID atomic.Int64

	calls, execs, takeovers, faults             atomic.Int64
	transients, panics, permanents, cancels     atomic.Int64
	inProgress, claimFailed, notRecorded, other atomic.Int64
	serverFaults                                sync.Map // kind -> *atomic.Int64

	mu   sync.Mutex
	keys map[string]*soakKey

	problemsMu sync.Mutex
	problems   []string
}

type soakKey struct {
	execs []*soakExec
	final *soakFinal // the first final outcome any Do returned
	dups  map[int64]bool
}

type soakExec struct {
	id, seq, attempt int64
	outcome          string // "" while running
	payload          string
}

type soakFinal struct {
	seq     int64
	kind    byte // 'd' result, 'f' permanent error
	payload string
	exec    *soakExec
}

type soakPanic string

func (r *soakRun) problem(format string, args ...any) {
	r.problemsMu.Lock()
	defer r.problemsMu.Unlock()
	if len(r.problems) < 50 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *soakRun) key(k string) *soakKey {
	sk := r.keys[k]
	if sk == nil {
		sk = &soakKey{dups: map[int64]bool{}}
		r.keys[k] = sk
	}
	return sk
}

// duplicate marks e as an execution that should not have happened. r.mu
// is held.
func (r *soakRun) duplicate(key string, sk *soakKey, e *soakExec, why string) {
	if !sk.dups[e.id] {
		sk.dups[e.id] = true
		r.problem("DUPLICATE: key %q: attempt %d ran %s", key, e.attempt, why)
	}
}

// fn returns the fn of one call: what it does is drawn by the caller.
func (r *soakRun) fn(key, behavior string, slow time.Duration) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		a, ok := idem.AttemptFrom(ctx)
		if !ok || a.Key != key {
			r.problem("fn for key %q ran with attempt %+v, %v", key, a, ok)
		}
		r.execs.Add(1)
		if a.Number > 1 {
			r.takeovers.Add(1)
		}
		e := &soakExec{id: r.execID.Add(1), seq: r.seq.Add(1), attempt: a.Number}
		r.mu.Lock()
		sk := r.key(key)
		for _, p := range sk.execs {
			if p.attempt == e.attempt {
				r.problem("key %q: attempt %d ran twice", key, e.attempt)
			}
		}
		if sk.final != nil {
			r.duplicate(key, sk, e, "after a final outcome was returned")
		}
		sk.execs = append(sk.execs, e)
		r.mu.Unlock()

		if slow > 0 {
			time.Sleep(slow) // a side effect that ignores the context
		}
		payload := fmt.Sprintf("%s|attempt=%d|exec=%d", key, a.Number, e.id)
		if behavior == "permanent" {
			payload = "declined " + payload
		}
		r.mu.Lock()
		e.outcome, e.payload = behavior, payload
		r.mu.Unlock()
		switch behavior {
		case "transient":
			r.transients.Add(1)
			return nil, errors.New("transient " + payload)
		case "panic":
			r.panics.Add(1)
			panic(soakPanic(payload))
		case "permanent":
			r.permanents.Add(1)
			return nil, idem.Permanent(errors.New(payload))
		}
		return []byte(payload), nil
	}
}

// final notes a final outcome returned by a Do for key.
func (r *soakRun) final(key string, kind byte, payload string) {
	seq := r.seq.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	sk := r.key(key)
	var from *soakExec
	for _, e := range sk.execs {
		if e.payload == payload && e.outcome != "" {
			from = e
		}
	}
	if from == nil || (kind == 'd') != (from.outcome == "ok" || from.outcome == "slow") || (kind == 'f') != (from.outcome == "permanent") {
		r.problem("key %q: Do returned the outcome %c %q, which no execution produced so", key, kind, payload)
		return
	}
	if sk.final == nil {
		sk.final = &soakFinal{seq: seq, kind: kind, payload: payload, exec: from}
		for _, e := range sk.execs {
			if e.attempt > from.attempt {
				r.duplicate(key, sk, e, fmt.Sprintf("although attempt %d's outcome is the final one", from.attempt))
			}
		}
		return
	}
	if sk.final.kind != kind || sk.final.payload != payload {
		r.problem("key %q: Do returned %c %q, but %c %q before", key, kind, payload, sk.final.kind, sk.final.payload)
	}
}

// call makes one Do call with drawn parameters and checks its answer.
func (r *soakRun) call(c *idem.Client, key string, rng *rand.Rand) {
	var behavior string
	var slow time.Duration
	switch p := rng.IntN(100); {
	case p < 66:
		behavior = "ok"
		slow = time.Duration(rng.IntN(5)) * time.Millisecond
	case p < 76:
		behavior, slow = "slow", time.Duration(50+rng.IntN(450))*time.Millisecond
	case p < 88:
		behavior = "transient"
	case p < 93:
		behavior = "panic"
	default:
		behavior = "permanent"
	}
	timeout := 5 * time.Second
	switch p := rng.IntN(100); {
	case p < 10:
		timeout = time.Duration(5+rng.IntN(95)) * time.Millisecond
	case p < 35:
		timeout = time.Duration(100+rng.IntN(900)) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	r.calls.Add(1)
	var (
		res      []byte
		err      error
		panicked any
	)
	func() {
		defer func() { panicked = recover() }()
		res, err = c.Do(ctx, key, "fp", r.fn(key, behavior, slow))
	}()
	if ctx.Err() != nil {
		r.cancels.Add(1)
	}
	var se *idem.StoredError
	switch {
	case panicked != nil:
		if _, ok := panicked.(soakPanic); !ok || behavior != "panic" {
			r.problem("key %q: Do panicked with %v (fn was %s)", key, panicked, behavior)
		}
	case err == nil:
		r.final(key, 'd', string(res))
	case errors.As(err, &se):
		r.final(key, 'f', se.Message)
	case idem.IsPermanent(err) && !errors.Is(err, idem.ErrNotRecorded) && !errors.Is(err, idem.ErrLeaseLost):
		r.final(key, 'f', err.Error())
	case strings.HasPrefix(err.Error(), "transient "):
	case errors.Is(err, idem.ErrInProgress):
		r.inProgress.Add(1)
	case errors.Is(err, idem.ErrNotRecorded), errors.Is(err, idem.ErrLeaseLost):
		// fn ran but its outcome could not be stored: Redis was down
		// longer than the lease or the store timeout (a restart that
		// loads a large AOF answers LOADING for a while). Allowed, and
		// counted.
		r.notRecorded.Add(1)
	case strings.Contains(err.Error(), "idem: claim key"):
		// Redis unreachable, restarting or paused at the claim: fail
		// closed.
		r.claimFailed.Add(1)
	case errors.Is(err, idem.ErrCorrupt), errors.Is(err, idem.ErrConflict), errors.Is(err, idem.ErrExpired):
		r.problem("key %q: %v", key, err)
	default:
		r.other.Add(1)
		r.problem("key %q: unexpected error: %v", key, err)
	}
}

func (r *soakRun) serverFault(kind string) {
	r.faults.Add(1)
	v, _ := r.serverFaults.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func runSoak(t *testing.T, d time.Duration) {
	srv := redistest.Start(t, redistest.Config{AppendOnly: true})
	r := &soakRun{keys: make(map[string]*soakKey)}
	var clients []*idem.Client
	for range soakClients {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 256})
		c := idem.New(rdb, idem.WithLease(soakLease), idem.WithWait(3*time.Second),
			idem.WithPollInterval(100*time.Millisecond), idem.WithStoreTimeout(5*time.Second))
		clients = append(clients, c)
		t.Cleanup(func() {
			_ = c.Close()
			_ = rdb.Close()
		})
	}

	start := time.Now()
	deadline := start.Add(d)
	var calls atomic.Int64 // calls started: moves the window of keys
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for time.Now().Before(deadline) {
				n := calls.Add(1)
				base := n / soakPerKey // the window moves on by one key every soakPerKey calls
				key := fmt.Sprintf("k%d", base+int64(rng.IntN(soakWindow)))
				r.call(clients[rng.IntN(len(clients))], key, rng)
			}
		})
	}

	// Server faults, from the test's goroutine: every kind once first (the
	// restart early), then at random; none in the last soakCooldown, so
	// that the end is checked on a settled server.
	rng := rand.New(rand.NewPCG(1, uint64(start.UnixNano())))
	kinds := []string{"restart", "pubsub", "flush", "pause"}
	rng.Shuffle(len(kinds)-1, func(i, j int) { kinds[i+1], kinds[j+1] = kinds[j+1], kinds[i+1] })
	quiet := deadline.Add(-soakCooldown)
	var maxDown time.Duration // the longest restart, until the AOF was loaded
	gap := func() time.Duration {
		g := time.Duration(200+rng.IntN(1300)) * time.Millisecond
		if d < 30*time.Second {
			g = time.Duration(100+rng.IntN(200)) * time.Millisecond
		}
		return g
	}
	for i := 0; ; i++ {
		time.Sleep(gap())
		if time.Now().After(quiet) {
			break
		}
		kind := ""
		if i < len(kinds) {
			kind = kinds[i]
		} else {
			switch p := rng.IntN(100); {
			case p < 30:
				kind = "pubsub"
			case p < 60:
				kind = "flush"
			case p < 90:
				kind = "pause"
			default:
				kind = "restart"
			}
		}
		switch kind {
		case "pubsub":
			srv.KillPubSub(t)
		case "flush":
			srv.Do(t, "SCRIPT", "FLUSH")
		case "pause":
			srv.Pause()
			time.Sleep(time.Duration(50+rng.IntN(int(soakMaxPause/time.Millisecond)-50)) * time.Millisecond)
			srv.Resume()
		case "restart":
			t0 := time.Now()
			srv.Restart(t) // kill -9, then start on the same AOF
			maxDown = max(maxDown, time.Since(t0))
		}
		r.serverFault(kind)
	}
	wg.Wait()
	elapsed := time.Since(start)

	// Every key with a final outcome must still give it, from every
	// instance; an fn that runs now is a duplicate.
	r.mu.Lock()
	var finals []string
	for k, sk := range r.keys {
		if sk.final != nil {
			finals = append(finals, k)
		}
	}
	r.mu.Unlock()
	sort.Strings(finals)
	var lost atomic.Int64
	work := make(chan string)
	var checkers sync.WaitGroup
	for i := range 16 {
		checkers.Go(func() {
			for k := range work {
				r.mu.Lock()
				want := *r.keys[k].final
				r.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, err := clients[i%len(clients)].Do(ctx, k, "fp", r.fn(k, "ok", 0))
				cancel()
				var se *idem.StoredError
				ok := (want.kind == 'd' && err == nil && string(res) == want.payload) ||
					(want.kind == 'f' && errors.As(err, &se) && se.Message == want.payload)
				if !ok {
					lost.Add(1)
					r.problem("LOST: key %q: replay gave (%q, %v), want %c %q", k, res, err, want.kind, want.payload)
				}
			}
		})
	}
	for _, k := range finals {
		work <- k
	}
	close(work)
	checkers.Wait()

	duplicates := 0
	r.mu.Lock()
	for _, sk := range r.keys {
		duplicates += len(sk.dups)
	}
	keys := len(r.keys)
	r.mu.Unlock()
	faults := r.faults.Load() + r.transients.Load() + r.panics.Load() + r.cancels.Load()
	fmt.Printf("soak: calls=%d faults=%d takeovers=%d fn_executions=%d duplicates=%d lost_results=%d duration=%v\n",
		r.calls.Load(), faults, r.takeovers.Load(), r.execs.Load(), duplicates, lost.Load(), elapsed.Round(time.Millisecond))
	var sf []string
	r.serverFaults.Range(func(k, v any) bool {
		sf = append(sf, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(sf)
	t.Logf("soak: keys=%d finals=%d server faults: %s (longest restart %v); fn transient=%d panic=%d permanent=%d; calls ended by their context=%d; errors: in progress=%d, claim failed=%d, not recorded=%d, other=%d",
		keys, len(finals), strings.Join(sf, " "), maxDown.Round(time.Millisecond), r.transients.Load(), r.panics.Load(), r.permanents.Load(), r.cancels.Load(),
		r.inProgress.Load(), r.claimFailed.Load(), r.notRecorded.Load(), r.other.Load())
	r.problemsMu.Lock()
	defer r.problemsMu.Unlock()
	if duplicates > 0 || lost.Load() > 0 || len(r.problems) > 0 {
		t.Fatalf("soak: the invariant is broken (first %d problems):\n\t%s", len(r.problems), strings.Join(r.problems, "\n\t"))
	}
}
