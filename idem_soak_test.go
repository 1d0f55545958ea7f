package idem_test

// The soak test: many concurrent Do calls from three service instances on
// a real redis-server, with faults at random times, checked against the
// ledger invariant and the promise of one live owner (owners, from
// owner_lease_test.go: when an fn starts, every other running fn of its key has
// a context already done). The faults: kill -9 and restart, SIGSTOP,
// SCRIPT FLUSH, pub/sub connections killed, and, on the wire (faultconn,
// between each instance and the server), a claim's or a renewal's reply
// held for half a lease to three leases. Off by default; run it with
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
	"io"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
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
	t.Parallel()
	d := soakDuration(t)
	if d <= 0 {
		t.Skip("soak: off by default; run with -soak 60s")
	}
	runSoak(t, d)
}

// TestSoakShort is the soak for three seconds: every fault once at least,
// one kill -9 and restart, some claims' replies held (the held replies
// make it last up to about ten seconds). It keeps the soak's code working
// in CI; -short skips it.
func TestSoakShort(t *testing.T) {
	t.Parallel()
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
	// soakMaxHeld is the longest a reply is held, in leases (from half a
	// lease); past go-redis's ReadTimeout (3s) a held script is sent
	// again.
	soakMaxHeld = 3
)

// soakRun is the state of one soak: the ledger of executions and final
// outcomes by key, and the counters of the summary.
type soakRun struct {
	seq    atomic.Int64 // orders executions and returns
	execID atomic.Int64

	calls, execs, takeovers, faults             atomic.Int64
	transients, panics, permanents, cancels     atomic.Int64
	inProgress, claimFailed, notRecorded, other atomic.Int64
	doneAtStart                                 atomic.Int64 // calls whose context ended before Do began
	longs, deadStarts                           atomic.Int64
	heldClaims, heldRenewals                    atomic.Int64 // replies held by the delay nemesis
	serverFaults                                sync.Map     // kind -> *atomic.Int64

	// live holds the fns running, by key: the check of one live owner.
	live idemtest.Owners

	// Why calls failed after fn ran, and what the server was doing.
	causesMu sync.Mutex
	events   []soakEvent    // guarded by causesMu; server faults, in order
	causes   map[string]int // guarded by causesMu; "not recorded: ..." and "lease lost: ..."
	examples []string       // guarded by causesMu; a few errors after fn ran, in full

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

// soakEvent is a server fault and when it lasted.
type soakEvent struct {
	kind       string
	start, end time.Time
}

// soakCall is what a call's fn did, for the classification of its error.
type soakCall struct {
	start   time.Time
	ran     bool      // fn started
	fnStart time.Time // when fn started
	fnEnd   time.Time // when fn returned
	stopped bool      // a long fn stopped because its context ended
}

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

// fn returns the fn of one call: what it does is drawn by the caller. A
// "long" fn runs for slow unless its context ends first; the others sleep
// slow whatever their context says. st, if not nil, learns what fn did.
func (r *soakRun) fn(key, behavior string, slow time.Duration, st *soakCall) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		// One live owner: an fn that starts with a live context finds
		// every other running fn of its key with a context already done
		// (one whose own context is done at its start is no live owner:
		// counted, not checked).
		if ctx.Err() == nil {
			leave := r.live.Enter(ctx)
			defer leave()
		} else {
			r.deadStarts.Add(1)
		}
		if st != nil {
			st.ran, st.fnStart = true, time.Now()
			defer func() { st.fnEnd = time.Now() }()
		}
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

		if behavior == "long" {
			r.longs.Add(1)
			t := time.NewTimer(slow)
			select {
			case <-t.C:
			case <-ctx.Done():
				// Its lease ended for it: it stops, and says why.
				t.Stop()
				if st != nil {
					st.stopped = true
				}
				r.mu.Lock()
				e.outcome, e.payload = "stopped", ""
				r.mu.Unlock()
				return nil, fmt.Errorf("long fn stopped: %w", context.Cause(ctx))
			}
		} else if slow > 0 {
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
	if from == nil || (kind == 'd') != (from.outcome == "ok" || from.outcome == "slow" || from.outcome == "long") || (kind == 'f') != (from.outcome == "permanent") {
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
	case p < 75:
		behavior, slow = "slow", time.Duration(50+rng.IntN(450))*time.Millisecond
	case p < 76:
		// Runs one to two and a half leases: its lease is renewed (and
		// the delay nemesis may hold a renewal's reply).
		behavior, slow = "long", soakLease+time.Duration(rng.Int64N(int64(3*soakLease/2)))
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
	if behavior == "long" {
		timeout = 10 * time.Second // only its lease may stop it
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	r.calls.Add(1)
	var (
		res      []byte
		err      error
		panicked any
		st       = soakCall{start: time.Now()}
	)
	func() {
		defer func() { panicked = recover() }()
		res, err = c.Do(ctx, key, "fp", r.fn(key, behavior, slow, &st))
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
	case err == ctx.Err() && !st.ran:
		// The context (5 ms at the shortest) ended before Do began: Do
		// returns its error as is, and claims nothing. Seen under -race
		// on a loaded machine.
		r.doneAtStart.Add(1)
	case st.stopped && !errors.Is(err, idem.ErrLeaseLost):
		// A long fn stopped by its caller's context.
	case errors.Is(err, idem.ErrInProgress):
		r.inProgress.Add(1)
	case errors.Is(err, idem.ErrNotRecorded):
		// fn ran but its outcome could not be stored within the store
		// timeout. Allowed, counted by cause and by what the server was
		// doing meanwhile.
		r.notRecorded.Add(1)
		r.cause(fmt.Sprintf("not recorded: %s, %s", soakNotRecordedCause(err), r.during(st.fnEnd, time.Now())), err)
	case errors.Is(err, idem.ErrLeaseLost):
		// The lease ended for the caller: before fn (the claim's reply
		// came with too little left and the renewal failed), under a long
		// fn (a renewal's reply was held or lost), or at the completion
		// (another caller had taken over). Allowed, and counted. The
		// last: when a kill -9 and restart keeps Redis down for about a
		// lease (the AOF loads slowly on a busy machine), the owner's
		// completion, retried with a backoff of up to a second and no
		// renewal, comes after a new caller took the key over. The
		// soak's "not recorded" once counted these too.
		switch {
		case !st.ran:
			r.cause("lease lost: before fn", nil)
		case st.stopped:
			r.cause("lease lost: a long fn stopped by its context", nil)
		default:
			// The lease ended between the claim and the completion.
			// Say when fn ran, and what the server did meanwhile.
			now := time.Now()
			r.cause("lease lost: completion refused, "+r.during(st.start, now), fmt.Errorf(
				"%w (Do took %v: fn started after %v and ran %v; %s)", err, now.Sub(st.start).Round(time.Millisecond),
				st.fnStart.Sub(st.start).Round(time.Millisecond), st.fnEnd.Sub(st.fnStart).Round(time.Millisecond), r.during(st.start, now)))
		}
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

func (r *soakRun) serverFault(kind string, start time.Time) {
	r.faults.Add(1)
	v, _ := r.serverFaults.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	r.causesMu.Lock()
	defer r.causesMu.Unlock()
	r.events = append(r.events, soakEvent{kind: kind, start: start, end: time.Now()})
}

// cause counts a failed call under why; err, if not nil, may be kept as an
// example.
func (r *soakRun) cause(why string, err error) {
	r.causesMu.Lock()
	defer r.causesMu.Unlock()
	if r.causes == nil {
		r.causes = make(map[string]int)
	}
	r.causes[why]++
	if err != nil && len(r.examples) < 5 {
		r.examples = append(r.examples, err.Error())
	}
}

// during says which server faults that stop the server (a restart, a
// pause) overlapped [from, to], or that none did. A fault still under way
// at to counts too.
func (r *soakRun) during(from, to time.Time) string {
	r.causesMu.Lock()
	defer r.causesMu.Unlock()
	var kinds []string
	for _, e := range r.events {
		if (e.kind == "restart" || e.kind == "pause") && e.start.Before(to) && e.end.After(from) && !slices.Contains(kinds, e.kind) {
			kinds = append(kinds, e.kind)
		}
	}
	if len(kinds) == 0 {
		return "no restart or pause meanwhile"
	}
	return "during a " + strings.Join(kinds, " and a ")
}

var soakTries = regexp.MustCompile(`after (\d+) tries`)

// soakNotRecordedCause names the last error of a completion that was never
// acknowledged, and how many times it was sent.
func soakNotRecordedCause(err error) string {
	tries := "?"
	if m := soakTries.FindStringSubmatch(err.Error()); m != nil {
		if n, _ := strconv.Atoi(m[1]); n > 3 {
			tries = ">3"
		} else {
			tries = m[1]
		}
	}
	var (
		re redis.Error
		oe *net.OpError
		ne net.Error
	)
	why := "other"
	switch {
	case errors.Is(err, idem.ErrNotReplicated):
		why = "not replicated"
	case errors.As(err, &re):
		why = "redis " + strings.Fields(re.Error() + " ?")[0]
	case errors.Is(err, context.DeadlineExceeded):
		why = "store timeout ended a try"
	case errors.As(err, &oe) && oe.Op == "dial":
		why = "dial failed"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		why = "connection lost"
	case errors.As(err, &ne) && ne.Timeout():
		why = "read timeout"
	}
	return fmt.Sprintf("%s (tries %s)", why, tries)
}

func runSoak(t *testing.T, d time.Duration) {
	srv := redistest.Start(t, redistest.Config{AppendOnly: true})
	r := &soakRun{keys: make(map[string]*soakKey)}
	var clients []*idem.Client
	var wires []*faultconn.Injector // each instance's connections, for the delay nemesis
	for range soakClients {
		in := faultconn.New()
		wires = append(wires, in)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 256, Dialer: in.Dialer(srv.Addr())})
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

	// The delay nemesis, beside them: every 50-400ms, on one instance's
	// connections, the reply of its next claim or its next renewal (of
	// any key) is held for half a lease to soakMaxHeld leases.
	var nemesis sync.WaitGroup
	stopDelays := new(atomic.Bool) // no reply is held from the cooldown on
	nemesis.Go(func() {
		rng := rand.New(rand.NewPCG(2, uint64(start.UnixNano())))
		var pending [soakClients][2]atomic.Int32 // rules not yet acted, by instance and script
		for first := true; time.Now().Before(quiet); first = false {
			if !first {
				time.Sleep(time.Duration(50+rng.IntN(350)) * time.Millisecond)
			}
			i, k := rng.IntN(soakClients), 0
			if rng.IntN(100) < 40 {
				k = 1
			}
			if pending[i][k].Load() >= 2 {
				continue
			}
			held := soakLease/2 + time.Duration(rng.Int64N(int64((soakMaxHeld*2-1)*soakLease/2)))
			script, count := "claim", &r.heldClaims
			if k == 1 {
				script, count = "renew", &r.heldRenewals
			}
			soakHold(wires[i], script, held, count, &pending[i][k], stopDelays)
		}
		stopDelays.Store(true)
	})
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
		t0 := time.Now()
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
			srv.Restart(t) // kill -9, then start on the same AOF
			maxDown = max(maxDown, time.Since(t0))
		}
		r.serverFault(kind, t0)
	}
	nemesis.Wait()
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
				res, err := clients[i%len(clients)].Do(ctx, k, "fp", r.fn(k, "ok", 0, nil))
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
	overlaps := r.live.Overlaps()
	delays := r.heldClaims.Load() + r.heldRenewals.Load()
	faults := r.faults.Load() + delays + r.transients.Load() + r.panics.Load() + r.cancels.Load()
	fmt.Printf("soak: calls=%d faults=%d delays=%d takeovers=%d fn_executions=%d duplicates=%d lost_results=%d live_owner_overlaps=%d duration=%v\n",
		r.calls.Load(), faults, delays, r.takeovers.Load(), r.execs.Load(), duplicates, lost.Load(), len(overlaps), elapsed.Round(time.Millisecond))
	for _, o := range overlaps {
		r.problem("TWO LIVE OWNERS: %s", o)
	}
	var sf []string
	r.serverFaults.Range(func(k, v any) bool {
		sf = append(sf, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(sf)
	t.Logf("soak: keys=%d finals=%d server faults: %s (longest restart %v); replies held: claims=%d renewals=%d; fn transient=%d panic=%d permanent=%d long=%d, started with its context done=%d; calls ended by their context=%d (before Do began: %d); errors: in progress=%d, claim failed=%d, not recorded=%d, other=%d",
		keys, len(finals), strings.Join(sf, " "), maxDown.Round(time.Millisecond), r.heldClaims.Load(), r.heldRenewals.Load(),
		r.transients.Load(), r.panics.Load(), r.permanents.Load(), r.longs.Load(), r.deadStarts.Load(), r.cancels.Load(), r.doneAtStart.Load(),
		r.inProgress.Load(), r.claimFailed.Load(), r.notRecorded.Load(), r.other.Load())
	// The breakdown of the calls that lost their outcome or their lease,
	// by cause and by what the server was doing.
	r.causesMu.Lock()
	breakdown := map[string][]string{}
	total := map[string]int{}
	for why, n := range r.causes {
		kind, cause, _ := strings.Cut(why, ": ")
		breakdown[kind] = append(breakdown[kind], fmt.Sprintf("%s: %d", cause, n))
		total[kind] += n
	}
	examples := r.examples
	r.causesMu.Unlock()
	var parts []string
	for _, kind := range []string{"not recorded", "lease lost"} {
		sort.Strings(breakdown[kind])
		part := fmt.Sprintf("%s=%d", kind, total[kind])
		if len(breakdown[kind]) > 0 {
			part += " (" + strings.Join(breakdown[kind], "; ") + ")"
		}
		parts = append(parts, part)
	}
	fmt.Printf("soak: %s\n", strings.Join(parts, ", "))
	for _, e := range examples {
		t.Logf("soak: an error after fn ran, for example: %s", e)
	}
	if r.heldClaims.Load() == 0 {
		r.problem("the delay nemesis held no claim's reply")
	}
	r.problemsMu.Lock()
	defer r.problemsMu.Unlock()
	if duplicates > 0 || lost.Load() > 0 || len(r.problems) > 0 {
		t.Fatalf("soak: the invariant is broken (first %d problems):\n\t%s", len(r.problems), strings.Join(r.problems, "\n\t"))
	}
}

// soakHold makes in hold the reply of the next run of script, on any key,
// for held; count counts the replies held, pending the rules that have not
// acted yet. From stop on, the rule acts on nothing.
func soakHold(in *faultconn.Injector, script string, held time.Duration, count *atomic.Int64, pending *atomic.Int32, stop *atomic.Bool) {
	isScript := faultconn.IsScript(idem.ScriptSHA(script))
	pending.Add(1)
	in.Add(faultconn.Rule{
		Match: func(cmd []string) bool {
			if stop.Load() || !isScript(cmd) {
				return false
			}
			// An Nth 1 rule acts on the first command it matches.
			count.Add(1)
			pending.Add(-1)
			return true
		},
		Nth:    1,
		Action: faultconn.DelayReply,
		Delay:  held,
	})
}
