package idem_test

// A state-machine property test on a real redis-server: rapid draws a
// sequence of calls, fn outcomes and faults, and after every step the
// ledger invariant is checked against everything that happened so far.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

const (
	// rapidLease is the lease of the two service instances. Their owners
	// never die, and the heartbeat renews it every third of it, so it
	// never ends while the test runs (Redis is down for milliseconds at
	// most). At 3 s, in a suite run at load average 10, two renewals in a
	// row each timed out after their second and an owner lost its lease:
	// 6 s gives each renewal two seconds and the lease four of slack.
	// Nothing waits for this lease to end.
	rapidLease = 6 * time.Second
	// rapidCrashLease is the lease of owners that crash: after it, the
	// next caller takes over. It is short, so that steps waiting for a
	// crashed owner stay quick, and it is safe on a loaded machine because
	// no renewal of it must succeed: a crashable owner is cut off as soon
	// as its fn starts, and one resumed later is a paused owner, whose
	// lease may have ended. Load only makes its fn start less often (its
	// claim must come back with a third of the lease ahead, or renew
	// first), and any error of a crashable instance is accepted. Nor can
	// load fake a second live owner: fn's context ends on the clock (its
	// Err reads it), not on a timer that may fire late.
	rapidCrashLease = 150 * time.Millisecond
	// rapidSlowLease is the lease of the slow instance, whose replies the
	// SlowClaim and SlowRenewal steps hold for up to two leases. A renewal
	// of it must succeed for its fn to start after a late claim reply, and
	// to keep its fn's context live; a renewal is sent a third of a lease
	// after the last: 600ms leaves 200ms for a round trip on a loaded
	// machine. (Were one too slow, the slow call would end in ErrLeaseLost,
	// which is accepted of it: the step would only test less.)
	rapidSlowLease = 600 * time.Millisecond
	// rapidSlowReadTimeout is the slow instance's go-redis ReadTimeout:
	// shorter than the longest hold, so that go-redis re-sends some held
	// scripts (a claim repeated after its lease ended answers "yours" with
	// no lease left).
	rapidSlowReadTimeout = time.Second
	// rapidMaxSlow is the number of slow steps under way at once.
	rapidMaxSlow = 2
	// rapidWait is how long a duplicate waits for an owner; longer than
	// rapidCrashLease, so that a waiter without a deadline of its own
	// sees a crashed owner's lease end and takes over.
	rapidWait = 2 * time.Second
	// rapidChecks is the number of rapid checks (a fifth of it in -short),
	// unless -rapid.checks or RAPID_CHECKS says otherwise.
	rapidChecks = 40
)

// rapidKeys are the keys of a generation: few, so that calls collide, and
// with braces and a backslash, so that the escaping is exercised too. The
// step NewKeys starts a generation of fresh keys (most calls use the
// current one, some the one before), so that a check sees more than three
// keys go from new to done.
var rapidKeys = []string{"k0", "k{1}", `k\}2`}

// Fn outcomes a call can draw. "slow" sleeps, ignoring its context, then
// succeeds.
var rapidOutcomes = []string{"ok", "slow", "transient", "permanent", "panic"}

// TestRapidStateMachine is the model check of the faults catalogue.
//
// Model. For each key, the test keeps the executions of fn (in the order
// they started, each with its attempt number) and the first final outcome
// any Do returned: a result (nil error) or a recorded permanent error.
// After every step it requires:
//
//   - never two live owners: when an fn starts with a live context, every
//     other fn of its key that is still running has a context that is
//     already done (owners, from owner_lease_test.go, checked at every start);
//   - no execution of fn for a key started after a final outcome was
//     returned for it (one result; no double execution);
//   - every final outcome returned for a key is the same (the same bytes,
//     or the same stored error), and it is the outcome of an execution of
//     that key whose attempt is the highest one that ever ran (a stale
//     owner never wins over a newer one);
//   - attempt numbers of a key grow strictly in the order fn started:
//     never repeated, never lower (the fencing token only grows);
//   - each Do's answer is consistent with what its own fn did: a panic only
//     if its fn panicked, a transient error only its own fn's, a result
//     only from an execution of the key that succeeded;
//   - the service instances (which never crash and see Redis down only
//     for milliseconds) get no other errors than ErrInProgress, their
//     context's deadline, or their fn's own or stored outcome;
//   - Redis agrees (Status): a key that had an execution has a record
//     whose attempt is at least the highest that ran, and a key with a
//     final outcome is done or failed; nothing is lost by a kill -9 and
//     restart (AOF, appendfsync always).
//
// At the end every remaining owner finishes, every crashed one stays
// dead, and each key is called once more on both instances: each call
// must return the key's final outcome (taking over from crashed owners
// when needed) and agree with everything before it.
//
// Crashed owners. A kill -9 of the owner's process is, as Redis sees it,
// all of the owner's connections closing at once and no command from it
// ever again: no renewal, no completion, no release. That is what the
// "CrashOwner" step does to an owner running on its own go-redis client
// (a third service instance): once its fn has started, every connection
// of that client is closed and every new dial fails. Its lease then ends
// by itself in Redis time and the next caller takes over with the next
// attempt number. Writing the record's lease end into the past (HSET lu 0)
// would model something else: an owner that is alive but not renewing,
// and a live owner's heartbeat would simply restore the lease. The
// "ResumeOwner" step reconnects such an owner later and lets its fn
// finish: that is an owner paused past its lease (SIGSTOP, a long GC)
// that comes back, and its completion must be refused with ErrLeaseLost
// if another caller took over meanwhile (if none did, completing is
// correct: nobody else ran fn).
//
// Slow replies. The SlowClaim and SlowRenewal steps run on a fourth
// instance, the slow one, whose connections go through a
// faultconn.Injector and whose lease is rapidSlowLease: a claim's reply, or
// a renewal's (the first or every one), is held for half a lease to two
// leases, some past go-redis's ReadTimeout so that it re-sends the
// script. The call goes on in the background while later steps run;
// a competitor on a service instance may come after the slow call's lease
// ended on the server, and hold its own fn across the moment the held
// reply arrives. That is where a client that trusts a late reply starts a
// second live owner. The slow instance's calls may end in ErrLeaseLost or
// ErrNotRecorded (its lease ended for it), never in a wrong outcome.
func TestRapidStateMachine(t *testing.T) {
	// In a process of its own, started at once: it is the longest test,
	// and would otherwise wait for a parallel slot.
	if idemtest.RunInChild(t) {
		return
	}
	setRapidChecks(t, rapidChecks)
	env := &rapidEnv{t: t, srv: redistest.Start(t, redistest.Config{AppendOnly: true})}
	start := time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		m := newRapidMachine(rt, env)
		rt.Repeat(map[string]func(*rapid.T){
			"Do":           m.do,
			"DoBurst":      m.doBurst,
			"StartOwner":   m.startOwner,
			"FinishOwner":  m.finishOwner,
			"CrashOwner":   m.crashOwner,
			"ResumeOwner":  m.resumeOwner,
			"RestartRedis": m.restartRedis,
			"ScriptFlush":  m.scriptFlush,
			"KillPubSub":   m.killPubSub,
			"NewKeys":      m.newKeys,
			"SlowClaim":    m.slowClaim,
			"SlowRenewal":  m.slowRenewal,
			"":             m.check,
		})
		m.finish(rt)
	})
	t.Logf("rapid: %d checks, %d Do calls, %d fn executions (%d takeovers, %d started with their context done), %d crashed owners, %d resumed, %d restarts, %d script flushes, %d pub/sub kills, %d slow claims and %d slow renewals (%d with a competitor; %d claim and %d renewal replies held), in %v",
		env.checks.Load(), env.calls.Load(), env.execs.Load(), env.takeovers.Load(), env.deadStarts.Load(), env.crashes.Load(), env.resumes.Load(),
		env.restarts.Load(), env.flushes.Load(), env.pubsubKills.Load(), env.slowClaims.Load(), env.slowRenewals.Load(), env.competitors.Load(),
		env.heldClaims.Load(), env.heldRenewals.Load(), time.Since(start).Round(time.Millisecond))
}

// setRapidChecks sets rapid's number of checks for this test unless the
// command line (-rapid.checks) or the environment (RAPID_CHECKS) chose it.
func setRapidChecks(t *testing.T, n int) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if _, ok := os.LookupEnv("RAPID_CHECKS"); set || ok {
		return
	}
	f := flag.Lookup("rapid.checks")
	if f == nil {
		return
	}
	old := f.Value.String()
	if err := f.Value.Set(strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Value.Set(old) })
}

// rapidEnv is what the checks of one test share: the server and counters.
type rapidEnv struct {
	t   *testing.T
	srv *redistest.Server

	checks, calls, execs, takeovers, crashes, resumes, restarts, flushes, pubsubKills atomic.Int64
	deadStarts, slowClaims, slowRenewals, competitors, heldClaims, heldRenewals       atomic.Int64
}

// rapidMachine is one check: its own key prefix (so checks do not see
// each other's records on the shared server), two service instances, and
// the history the invariant is checked on.
type rapidMachine struct {
	env     *rapidEnv
	prefix  string
	clients [2]*idem.Client

	seq    atomic.Int64 // orders executions and returns
	execID atomic.Int64
	gen    int // the current generation of keys; used by the check's goroutine only

	mu       sync.Mutex
	keys     []string                // every key used, in order of first use
	execs    map[string][]*rapidExec // by key, in the order fn started
	finals   map[string]*rapidFinal  // the first final outcome returned, by key
	problems []string
	// firstLate holds the keys whose first execution had an attempt above
	// 1, and noRun counts the calls of a key that may have claimed an
	// attempt and not run fn under it (those that returned an error
	// without running fn, and slow calls): one of those gave a claim up.
	firstLate map[string]int64
	noRun     map[string]int

	live idemtest.Owners // fns running, by key: the check of one live owner

	// The slow steps are drawn on for half the checks (slowOn), so that
	// the others, which need not wait for a slow step's end, keep the
	// test's run time down, and a failure that needs no slow reply
	// shrinks to a check without them.
	slowOn    bool
	slow      *rapidSlow     // the slow instance, made by the first slow step; used by the step goroutine only
	scen      sync.WaitGroup // the slow steps' calls under way
	scenarios atomic.Int32   // how many
	slowKeys  map[string]int // guarded by mu; the keys of the slow steps under way

	wg      sync.WaitGroup // every goroutine the check started
	gated   []*rapidCall   // every call whose fn blocks until told its outcome
	owners  []*rapidCall   // those whose fn is blocked and not yet told
	zombies []*rapidCall   // crashed owners (network cut), maybe resumed later
	cutters []*rapidCutter // every cut-able client, to close at the end
}

// rapidExec is one execution of fn.
type rapidExec struct {
	seq     int64
	id      int64
	key     string
	attempt int64
	who     string

	// Set when fn returns (under rapidMachine.mu).
	outcome string // "" while fn runs
	payload string // the result, or the error's message
}

// rapidFinal is the first final outcome a Do returned for a key.
type rapidFinal struct {
	seq     int64
	kind    byte // 'd' a result, 'f' a permanent error
	payload string
	exec    *rapidExec
	who     string
}

// rapidCall is one Do call.
type rapidCall struct {
	key     string
	who     string
	c       *idem.Client
	outcome string        // what fn does, if it runs and gate is nil
	gate    chan string   // if set, fn blocks until it receives its outcome
	started chan struct{} // closed when fn starts
	timeout time.Duration // the call's context deadline; 0 for none
	hold    time.Duration // how long fn runs, ignoring its context, before its outcome
	cutter  *rapidCutter  // the crashable instance the call runs on
	slow    bool          // the call runs on the slow instance
	exec    atomic.Pointer[rapidExec]
	done    chan struct{} // closed when Do returned

	res      []byte
	err      error
	panicked any
}

// rapidTransient is the transient error of an execution.
type rapidTransient struct{ payload string }

func (e *rapidTransient) Error() string { return "transient " + e.payload }

// rapidPanic is the panic value of an execution.
type rapidPanic struct{ payload string }

func newRapidMachine(rt *rapid.T, env *rapidEnv) *rapidMachine {
	n := env.checks.Add(1)
	m := &rapidMachine{
		env:      env,
		prefix:   fmt.Sprintf("rapid%d", n),
		execs:    make(map[string][]*rapidExec),
		finals:   make(map[string]*rapidFinal),
		slowOn:   rapid.Bool().Draw(rt, "slowReplies"),
		slowKeys: make(map[string]int),
	}
	var rdbs []*redis.Client
	for i := range m.clients {
		rdb := redis.NewClient(&redis.Options{Addr: env.srv.Addr(), PoolSize: 64})
		rdbs = append(rdbs, rdb)
		m.clients[i] = idem.New(rdb, idem.WithPrefix(m.prefix), idem.WithLease(rapidLease),
			idem.WithWait(rapidWait), idem.WithPollInterval(50*time.Millisecond),
			idem.WithStoreTimeout(5*time.Second))
	}
	rt.Cleanup(func() {
		// Whatever happened (a failure, or rapid giving up a draw while
		// shrinking), end every goroutine of the check: blocked owners
		// get an outcome, crashed ones stay cut off and fail to record.
		m.mu.Lock()
		gated := append([]*rapidCall(nil), m.gated...)
		m.mu.Unlock()
		for _, c := range gated {
			c.tell("ok")
		}
		m.wg.Wait()
		for _, c := range m.clients {
			_ = c.Close()
		}
		for _, rdb := range rdbs {
			_ = rdb.Close()
		}
		for _, cu := range m.cutters {
			cu.close()
		}
		if m.slow != nil {
			_ = m.slow.c.Close()
			_ = m.slow.rdb.Close()
		}
	})
	return m
}

func (m *rapidMachine) problem(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.problems = append(m.problems, fmt.Sprintf(format, args...))
}

// fn returns the fn of call c.
func (m *rapidMachine) fn(c *rapidCall) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		// One live owner: an fn that starts with a live context finds
		// every other running fn of its key with a context already done.
		// One whose own context is done at its start is no live owner (it
		// started on a lease that ended meanwhile: the goroutine stalled
		// between the lease check and fn); it is counted, not checked.
		if ctx.Err() == nil {
			leave := m.live.Enter(ctx)
			defer leave()
		} else {
			m.env.deadStarts.Add(1)
		}
		a, ok := idem.AttemptFrom(ctx)
		if !ok || a.Key != c.key {
			m.problem("%s: fn for key %q ran with attempt %+v, %v", c.who, c.key, a, ok)
		}
		e := m.startExec(c, a.Number)
		c.exec.Store(e)
		if c.started != nil {
			close(c.started)
		}
		out := c.outcome
		if c.gate != nil {
			out = <-c.gate
		}
		if out == "slow" {
			time.Sleep(time.Duration(10+e.id%5*10) * time.Millisecond)
		}
		time.Sleep(c.hold)
		payload := fmt.Sprintf("%s|attempt=%d|exec=%d", c.key, a.Number, e.id)
		if out == "permanent" {
			payload = "declined " + payload
		}
		m.mu.Lock()
		e.outcome, e.payload = out, payload
		m.mu.Unlock()
		switch out {
		case "ok", "slow":
			return []byte(payload), nil
		case "transient":
			return nil, &rapidTransient{payload}
		case "permanent":
			return nil, idem.Permanent(errors.New(payload))
		case "panic":
			panic(rapidPanic{payload})
		}
		panic("unknown outcome " + out)
	}
}

// startExec records that fn started, and checks at once that it may.
func (m *rapidMachine) startExec(c *rapidCall, attempt int64) *rapidExec {
	m.env.execs.Add(1)
	if attempt > 1 {
		m.env.takeovers.Add(1)
	}
	e := &rapidExec{seq: m.seq.Add(1), id: m.execID.Add(1), key: c.key, attempt: attempt, who: c.who}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.execs[c.key]
	if f := m.finals[c.key]; f != nil {
		m.problems = append(m.problems, fmt.Sprintf(
			"DUPLICATE: key %q: fn ran (%s, attempt %d) after %s returned the final outcome %q",
			c.key, c.who, attempt, f.who, f.payload))
	}
	if len(prev) > 0 && attempt <= prev[len(prev)-1].attempt {
		m.problems = append(m.problems, fmt.Sprintf(
			"key %q: fn started with attempt %d (%s) after attempt %d (%s): attempt numbers must grow",
			c.key, attempt, c.who, prev[len(prev)-1].attempt, prev[len(prev)-1].who))
	}
	if len(prev) == 0 && attempt != 1 {
		// Allowed only where a call claimed the key and gave the claim
		// back without running fn (its claim's reply came too late, or
		// its context ended): finish checks that one did.
		if m.firstLate == nil {
			m.firstLate = make(map[string]int64)
		}
		m.firstLate[c.key] = attempt
	}
	m.execs[c.key] = append(prev, e)
	return e
}

// tell gives a blocked fn its outcome; it never blocks.
func (c *rapidCall) tell(outcome string) {
	select {
	case c.gate <- outcome:
	default:
	}
}

// launch starts call c in a goroutine; c.done is closed when Do returned.
func (m *rapidMachine) launch(c *rapidCall, barrier <-chan struct{}) {
	c.done = make(chan struct{})
	m.env.calls.Add(1)
	if c.gate != nil {
		m.mu.Lock()
		m.gated = append(m.gated, c)
		m.mu.Unlock()
	}
	m.wg.Go(func() {
		defer close(c.done)
		if barrier != nil {
			<-barrier
		}
		ctx := context.Background()
		if c.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.timeout)
			defer cancel()
		}
		defer func() { c.panicked = recover() }()
		c.res, c.err = c.c.Do(ctx, c.key, "fp", m.fn(c))
	})
}

// record checks what Do returned against what its fn did, and notes a
// final outcome.
func (m *rapidMachine) record(c *rapidCall) {
	<-c.done
	seq := m.seq.Add(1)
	e := c.exec.Load()
	m.mu.Lock()
	defer m.mu.Unlock()
	bad := func(format string, args ...any) {
		m.problems = append(m.problems, fmt.Sprintf("%s on key %q: ", c.who, c.key)+fmt.Sprintf(format, args...))
	}
	if e != nil && e.outcome == "panic" && c.panicked == nil {
		bad("fn panicked but Do returned (%q, %v)", c.res, c.err)
	}
	if (e == nil && c.err != nil) || c.slow {
		// A slow call may have claimed an attempt and not run fn under it:
		// its claim's reply came after another caller took over, and it
		// waited, for an outcome that is not its own or to claim again.
		if m.noRun == nil {
			m.noRun = make(map[string]int)
		}
		m.noRun[c.key]++
	}
	var (
		se *idem.StoredError
		tr *rapidTransient
	)
	switch {
	case c.panicked != nil:
		p, ok := c.panicked.(rapidPanic)
		if !ok || e == nil || e.outcome != "panic" || p.payload != e.payload {
			bad("Do panicked with %v, but its own fn did not panic so", c.panicked)
		}
	case c.err == nil:
		if e != nil && string(c.res) != e.payload {
			bad("Do returned %q, but its own fn ran and gave %q (%s)", c.res, e.payload, e.outcome)
		}
		m.final(c, seq, 'd', string(c.res), bad)
	case errors.As(c.err, &se):
		m.final(c, seq, 'f', se.Message, bad)
	case idem.IsPermanent(c.err) && !errors.Is(c.err, idem.ErrNotRecorded) && !errors.Is(c.err, idem.ErrLeaseLost):
		// The owner's own permanent error, recorded (or its leader's).
		m.final(c, seq, 'f', c.err.Error(), bad)
	case errors.As(c.err, &tr):
		// A leader's transient error is never shared: it must be ours.
		if e == nil || e.outcome != "transient" || tr.payload != e.payload {
			bad("Do returned the transient error %q that its own fn did not return", c.err)
		}
	case errors.Is(c.err, idem.ErrInProgress):
	case c.cutter != nil:
		// A crashed or paused owner: it may fail in any way (ErrNotRecorded,
		// ErrLeaseLost, a dial error), but it never gets a result that is
		// not the key's final outcome: checked above.
	case c.timeout > 0 && errors.Is(c.err, context.DeadlineExceeded):
		// The deadline ended the call in a Redis round (claim or release).
	case e == nil && errors.Is(c.err, idem.ErrLeaseLost):
		// The claim's reply came with too little of the lease left, and
		// renewing it failed: fn did not start, the claim was given back.
	case c.slow && (errors.Is(c.err, idem.ErrLeaseLost) || errors.Is(c.err, idem.ErrNotRecorded)):
		// A held renewal ended the slow owner's lease for it (its
		// context), and another caller may have taken the key over: its
		// completion was refused. Its outcome is not the key's: checked
		// above.
	default:
		bad("unexpected error: %v", c.err)
	}
}

// final notes a final outcome of c's key and checks it against the first.
// m.mu is held.
func (m *rapidMachine) final(c *rapidCall, seq int64, kind byte, payload string, bad func(string, ...any)) {
	var from *rapidExec
	for _, e := range m.execs[c.key] {
		if e.payload == payload && e.outcome != "" {
			from = e
		}
	}
	want := map[byte][]string{'d': {"ok", "slow"}, 'f': {"permanent"}}[kind]
	switch {
	case from == nil:
		bad("Do returned the outcome %c %q, which no execution of the key produced", kind, payload)
		return
	case !slices.Contains(want, from.outcome):
		bad("Do returned the outcome %c %q, but that execution ended with %s", kind, payload, from.outcome)
	}
	f := m.finals[c.key]
	if f == nil {
		m.finals[c.key] = &rapidFinal{seq: seq, kind: kind, payload: payload, exec: from, who: c.who}
		return
	}
	if f.kind != kind || f.payload != payload {
		bad("Do returned the final outcome %c %q, but %s got %c %q before", kind, payload, f.who, f.kind, f.payload)
	}
}

// check is the invariant, run after every step.
func (m *rapidMachine) check(rt *rapid.T) {
	overlaps := m.live.Overlaps()
	m.mu.Lock()
	problems := append([]string(nil), m.problems...)
	for _, o := range overlaps {
		problems = append(problems, "TWO LIVE OWNERS: "+o)
	}
	for key, f := range m.finals {
		for _, e := range m.execs[key] {
			if e.attempt > f.exec.attempt {
				problems = append(problems, fmt.Sprintf(
					"key %q: the final outcome %q is from attempt %d, but attempt %d (%s) ran too",
					key, f.payload, f.exec.attempt, e.attempt, e.who))
			}
		}
	}
	type want struct {
		maxAttempt int64
		final      *rapidFinal
	}
	keys := append([]string(nil), m.keys...)
	wants := make(map[string]want)
	for _, key := range keys {
		w := want{final: m.finals[key]}
		for _, e := range m.execs[key] {
			w.maxAttempt = max(w.maxAttempt, e.attempt)
		}
		wants[key] = w
	}
	m.mu.Unlock()

	for _, key := range keys {
		w := wants[key]
		if w.maxAttempt == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := m.clients[0].Status(ctx, key)
		cancel()
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("Status(%q): %v", key, err))
		case st.State == idem.StateAbsent || st.Attempt < w.maxAttempt:
			problems = append(problems, fmt.Sprintf(
				"LOST: key %q: Redis has %v attempt %d, but attempt %d ran", key, st.State, st.Attempt, w.maxAttempt))
		case w.final != nil && w.final.kind == 'd' && st.State != idem.StateDone,
			w.final != nil && w.final.kind == 'f' && st.State != idem.StateFailed:
			problems = append(problems, fmt.Sprintf(
				"LOST: key %q: Redis has %v, but the outcome %c %q was returned", key, st.State, w.final.kind, w.final.payload))
		}
	}
	if len(problems) > 0 {
		rt.Fatalf("invariant broken:\n\t%s", strings.Join(problems, "\n\t"))
	}
}

// call makes a call of a service instance with drawn parameters.
func (m *rapidMachine) call(rt *rapid.T, key, label string) *rapidCall {
	i := rapid.IntRange(0, 1).Draw(rt, label+"client")
	return &rapidCall{
		key:     key,
		who:     fmt.Sprintf("instance %d", i),
		c:       m.clients[i],
		outcome: rapid.SampledFrom(rapidOutcomes).Draw(rt, label+"outcome"),
		timeout: rapid.SampledFrom([]time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond}).Draw(rt, label+"timeout"),
	}
}

// do: one call, or a few concurrent ones on one key from both instances.
// If an owner of the key is blocked, it may be told its outcome while
// they wait.
func (m *rapidMachine) do(rt *rapid.T) {
	m.burst(rt, rapid.IntRange(1, 3).Draw(rt, "callers"))
}

// doBurst: many concurrent duplicates of one key.
func (m *rapidMachine) doBurst(rt *rapid.T) {
	m.burst(rt, rapid.IntRange(4, 10).Draw(rt, "callers"))
}

// key draws a key of the current generation of keys, or of the one
// before.
func (m *rapidMachine) key(rt *rapid.T) string {
	gen := rapid.IntRange(max(0, m.gen-1), m.gen).Draw(rt, "gen")
	key := fmt.Sprintf("%s#%d", rapid.SampledFrom(rapidKeys).Draw(rt, "key"), gen)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.keys, key) {
		m.keys = append(m.keys, key)
	}
	return key
}

func (m *rapidMachine) newKeys(*rapid.T) { m.gen++ }

func (m *rapidMachine) burst(rt *rapid.T, n int) {
	key := m.key(rt)
	calls := make([]*rapidCall, n)
	for i := range calls {
		calls[i] = m.call(rt, key, fmt.Sprintf("call%d.", i))
	}
	// Draw everything first: rapid may end the step at a draw.
	finishMeanwhile := rapid.Bool().Draw(rt, "finishOwnerMeanwhile")
	outcome := rapid.SampledFrom(rapidOutcomes).Draw(rt, "ownerOutcome")
	delay := time.Duration(rapid.IntRange(0, 50).Draw(rt, "ownerDelayMs")) * time.Millisecond
	var release *rapidCall
	held := false
	m.mu.Lock()
	for i, o := range m.owners {
		if o.key != key {
			continue
		}
		if finishMeanwhile && release == nil {
			release = o
			m.owners = slices.Delete(m.owners, i, i+1)
		} else {
			held = true
		}
		break
	}
	slow := m.slowKeys[key] > 0
	m.mu.Unlock()
	if held {
		// The key stays held by a blocked owner: bound the waits, which
		// would otherwise last the whole wait budget.
		for _, c := range calls {
			if c.timeout == 0 || c.timeout > 100*time.Millisecond {
				c.timeout = 100 * time.Millisecond
			}
		}
	} else if slow {
		// A slow step holds the key, maybe for longer than the wait
		// budget (held renewals that go-redis re-sends keep renewing it):
		// bound the waits, yet let a waiter take over at a lease's end.
		for _, c := range calls {
			if c.timeout == 0 || c.timeout > rapidSlowLease/2 {
				c.timeout = rapidSlowLease / 2
			}
		}
	}
	barrier := make(chan struct{})
	for _, c := range calls {
		m.launch(c, barrier)
	}
	close(barrier)
	if release != nil {
		time.Sleep(delay)
		release.tell(outcome)
		m.record(release)
	}
	for _, c := range calls {
		m.record(c)
	}
}

// startOwner starts a call whose fn blocks until FinishOwner (or a later
// Do) tells it its outcome; other steps run while it holds the key.
func (m *rapidMachine) startOwner(rt *rapid.T) {
	m.mu.Lock()
	n := len(m.owners)
	m.mu.Unlock()
	if n >= 2 {
		rt.Skip("two owners are running")
	}
	key := m.key(rt)
	c := m.call(rt, key, "")
	c.outcome = ""
	c.gate = make(chan string, 1)
	c.started = make(chan struct{})
	c.timeout = 150 * time.Millisecond // bounds the wait if the key is busy; fn ignores it
	m.launch(c, nil)
	select {
	case <-c.started:
		m.mu.Lock()
		m.owners = append(m.owners, c)
		m.mu.Unlock()
	case <-c.done:
		m.record(c)
	}
}

// finishOwner tells a blocked owner its outcome and checks its answer.
func (m *rapidMachine) finishOwner(rt *rapid.T) {
	m.mu.Lock()
	n := len(m.owners)
	m.mu.Unlock()
	if n == 0 {
		rt.Skip("no owner is running")
	}
	i := rapid.IntRange(0, n-1).Draw(rt, "owner")
	outcome := rapid.SampledFrom(rapidOutcomes).Draw(rt, "outcome")
	m.mu.Lock()
	c := m.owners[i]
	m.owners = slices.Delete(m.owners, i, i+1)
	m.mu.Unlock()
	c.tell(outcome)
	m.record(c)
}

// crashOwner starts an owner on a third, crashable service instance and
// crashes it inside fn: its connections close and it never reaches Redis
// again (until ResumeOwner, for a pause).
func (m *rapidMachine) crashOwner(rt *rapid.T) {
	m.mu.Lock()
	n := len(m.zombies)
	m.mu.Unlock()
	if n >= 2 {
		rt.Skip("two crashed owners already")
	}
	key := m.key(rt)
	cu := newRapidCutter(m.env.srv.Addr())
	m.cutters = append(m.cutters, cu)
	c := &rapidCall{
		key: key,
		who: fmt.Sprintf("crashable instance %d", len(m.cutters)),
		c: idem.New(cu.rdb, idem.WithPrefix(m.prefix), idem.WithLease(rapidCrashLease),
			idem.WithWait(0), idem.WithStoreTimeout(150*time.Millisecond)),
		gate:    make(chan string, 1),
		started: make(chan struct{}),
		cutter:  cu,
	}
	cu.idem = c.c
	m.launch(c, nil)
	select {
	case <-c.started:
		cu.cut()
		m.env.crashes.Add(1)
		m.mu.Lock()
		m.zombies = append(m.zombies, c)
		m.mu.Unlock()
	case <-c.done:
		// The key was busy or finished: nothing to crash.
		m.record(c)
	}
}

// resumeOwner brings a crashed owner back, as if it had been paused: its
// network returns and its fn finishes. Its completion must be refused if
// another caller took over.
func (m *rapidMachine) resumeOwner(rt *rapid.T) {
	m.mu.Lock()
	n := len(m.zombies)
	m.mu.Unlock()
	if n == 0 {
		rt.Skip("no crashed owner")
	}
	i := rapid.IntRange(0, n-1).Draw(rt, "zombie")
	outcome := rapid.SampledFrom([]string{"ok", "permanent", "transient"}).Draw(rt, "outcome")
	m.mu.Lock()
	c := m.zombies[i]
	m.zombies = slices.Delete(m.zombies, i, i+1)
	m.mu.Unlock()
	c.cutter.restore()
	m.env.resumes.Add(1)
	c.tell(outcome)
	m.record(c)
}

func (m *rapidMachine) restartRedis(*rapid.T) {
	m.env.restarts.Add(1)
	m.env.srv.Restart(m.env.t) // kill -9 first
}

func (m *rapidMachine) scriptFlush(*rapid.T) {
	m.env.flushes.Add(1)
	m.env.srv.Do(m.env.t, "SCRIPT", "FLUSH")
}

func (m *rapidMachine) killPubSub(*rapid.T) {
	m.env.pubsubKills.Add(1)
	m.env.srv.KillPubSub(m.env.t)
}

// finish ends the check: blocked owners finish, crashed ones fail to
// record, then every key is called on both instances and must give its
// final outcome.
func (m *rapidMachine) finish(rt *rapid.T) {
	m.mu.Lock()
	owners, zombies := m.owners, m.zombies
	m.owners, m.zombies = nil, nil
	m.mu.Unlock()
	for _, c := range owners {
		c.tell("ok")
	}
	for _, c := range zombies {
		c.tell("ok") // still cut off: a crash, never recorded
	}
	for _, c := range append(owners, zombies...) {
		m.record(c)
	}
	m.scen.Wait()
	m.check(rt)
	m.mu.Lock()
	keys := append([]string(nil), m.keys...)
	for key, n := range m.firstLate {
		if m.noRun[key] == 0 {
			m.problems = append(m.problems, fmt.Sprintf("key %q: the first execution has attempt %d, but no call gave a claim back", key, n))
		}
	}
	m.mu.Unlock()
	for i, cl := range m.clients {
		calls := make([]*rapidCall, len(keys))
		for j, key := range keys {
			calls[j] = &rapidCall{key: key, who: fmt.Sprintf("final call on instance %d", i), c: cl, outcome: "ok"}
			m.launch(calls[j], nil)
		}
		for _, c := range calls {
			m.record(c)
			if c.err != nil && !idem.IsPermanent(c.err) {
				m.problem("final call on key %q, instance %d: %v (want the key's outcome)", c.key, i, c.err)
			}
		}
	}
	m.check(rt)
}

// rapidSlow is the slow instance of a check: an idem.Client with the lease
// rapidSlowLease whose connections go through in, where the slow steps add
// rules that hold replies.
type rapidSlow struct {
	in  *faultconn.Injector
	rdb *redis.Client
	c   *idem.Client
}

// slowInstance returns the check's slow instance, made at its first use.
func (m *rapidMachine) slowInstance() *rapidSlow {
	if m.slow != nil {
		return m.slow
	}
	addr := m.env.srv.Addr()
	s := &rapidSlow{in: faultconn.New()}
	s.rdb = redis.NewClient(&redis.Options{
		Addr:            addr,
		Dialer:          s.in.Dialer(addr),
		PoolSize:        64,
		ReadTimeout:     rapidSlowReadTimeout,
		MinRetryBackoff: time.Millisecond,
		MaxRetryBackoff: 2 * time.Millisecond,
	})
	s.c = idem.New(s.rdb, idem.WithPrefix(m.prefix), idem.WithLease(rapidSlowLease),
		idem.WithWait(rapidWait), idem.WithPollInterval(50*time.Millisecond),
		idem.WithStoreTimeout(5*time.Second))
	m.slow = s
	return s
}

// hold makes the slow instance hold the replies of script (by name) on
// key's record for d: the nth one from now, or every one with nth 0, until
// the returned func is called. held counts the replies held.
func (s *rapidSlow) hold(script, record string, nth int, d time.Duration, held *atomic.Int64) (stop func()) {
	isScript := faultconn.IsScript(idem.ScriptSHA(script))
	var stopped atomic.Bool
	s.in.Add(faultconn.Rule{
		Match: func(cmd []string) bool {
			// EVALSHA sha numkeys key...: the record is the first key.
			if stopped.Load() || len(cmd) < 4 || cmd[3] != record || !isScript(cmd) {
				return false
			}
			held.Add(1) // a rule acts on every command it matches (Nth 0 or 1)
			return true
		},
		Nth:    nth,
		Action: faultconn.DelayReply,
		Delay:  d,
	})
	return func() { stopped.Store(true) }
}

// scenario runs f, a slow step's calls on key, in the background: later
// steps run meanwhile, and finish waits for it.
func (m *rapidMachine) scenario(key string, f func()) {
	m.scenarios.Add(1)
	m.scen.Add(1)
	m.mu.Lock()
	m.slowKeys[key]++
	m.mu.Unlock()
	m.wg.Go(func() {
		defer m.scen.Done()
		defer m.scenarios.Add(-1)
		defer func() {
			m.mu.Lock()
			m.slowKeys[key]--
			m.mu.Unlock()
		}()
		f()
	})
}

// slowStep skips a slow step when slow steps are off in this check, or
// rapidMaxSlow are under way.
func (m *rapidMachine) slowStep(rt *rapid.T) {
	if !m.slowOn {
		rt.Skip("no slow steps in this check")
	}
	if m.scenarios.Load() >= rapidMaxSlow {
		rt.Skip("slow steps are under way")
	}
}

// competitor draws a call on a service instance that comes, after (from
// the slow call's start, at least a lease) when the slow call's lease may
// have ended on the server, to take its key over, and holds its fn for up
// to hold ms, across the moment the slow call's held reply may arrive; or
// nil.
func (m *rapidMachine) competitor(rt *rapid.T, key string, hold, afterMax int) (c *rapidCall, after time.Duration) {
	if !rapid.Bool().Draw(rt, "competitor") {
		return nil, 0
	}
	c = m.call(rt, key, "competitor.")
	c.timeout = 0 // it waits (rapidWait) for the lease to end
	c.hold = time.Duration(rapid.IntRange(0, hold).Draw(rt, "competitorHoldMs")) * time.Millisecond
	after = time.Duration(rapid.IntRange(int(rapidSlowLease/time.Millisecond), afterMax).Draw(rt, "competitorAfterMs")) * time.Millisecond
	c.who += " (competitor)"
	return c, after
}

// slowRun launches slow, then the competitor comp (if any) after after,
// records both, and stops the rule.
func (m *rapidMachine) slowRun(slow, comp *rapidCall, after time.Duration, stop func()) {
	if comp != nil {
		m.env.competitors.Add(1)
	}
	m.scenario(slow.key, func() {
		defer stop()
		start := time.Now()
		m.launch(slow, nil)
		if comp != nil {
			time.Sleep(time.Until(start.Add(after)))
			m.launch(comp, nil)
			m.record(comp)
		}
		m.record(slow)
	})
}

// slowClaim: a call on the slow instance whose claim's reply is held for
// half a lease to two (past ReadTimeout, go-redis sends the claim
// again). When the reply comes after the lease ended, another caller
// may hold the key.
func (m *rapidMachine) slowClaim(rt *rapid.T) {
	m.slowStep(rt)
	key := m.key(rt)
	lease := int(rapidSlowLease / time.Millisecond)
	held := time.Duration(rapid.IntRange(lease/2, 2*lease).Draw(rt, "claimHeldMs")) * time.Millisecond
	c := &rapidCall{
		key:     key,
		who:     fmt.Sprintf("slow instance (claim reply held %v)", held),
		outcome: rapid.SampledFrom(rapidOutcomes).Draw(rt, "slowOutcome"),
		hold:    time.Duration(rapid.IntRange(0, lease/3).Draw(rt, "slowHoldMs")) * time.Millisecond,
		slow:    true,
	}
	// The competitor comes soon after the lease ended, mostly before the
	// held reply arrives, and holds its fn for up to half a lease.
	comp, after := m.competitor(rt, key, lease/2, 3*lease/2)
	s := m.slowInstance()
	c.c = s.c
	m.env.slowClaims.Add(1)
	stop := s.hold("claim", idem.RecordKey(s.c, key), 1, held, &m.env.heldClaims)
	m.slowRun(c, comp, after, stop)
}

// slowRenewal: an owner on the slow instance whose fn runs for one to two
// leases, ignoring its context, while the reply of its first renewal, or
// of every one, is held for half a lease to two.
// Its context must end before its lease can end on the server; another
// caller may come to take the key over.
func (m *rapidMachine) slowRenewal(rt *rapid.T) {
	m.slowStep(rt)
	key := m.key(rt)
	lease := int(rapidSlowLease / time.Millisecond)
	held := time.Duration(rapid.IntRange(lease/2, 2*lease).Draw(rt, "renewalHeldMs")) * time.Millisecond
	nth := rapid.SampledFrom([]int{1, 0}).Draw(rt, "renewalsHeld") // the first, or every one
	c := &rapidCall{
		key:     key,
		who:     fmt.Sprintf("slow instance (renewal replies held %v, nth %d)", held, nth),
		outcome: rapid.SampledFrom(rapidOutcomes).Draw(rt, "slowOutcome"),
		hold:    time.Duration(rapid.IntRange(lease, 2*lease).Draw(rt, "slowHoldMs")) * time.Millisecond,
		slow:    true,
	}
	// The lease ends on the server a lease after the last renewal that
	// reached it: from four thirds of a lease on.
	comp, after := m.competitor(rt, key, lease/3, 5*lease/3)
	s := m.slowInstance()
	c.c = s.c
	m.env.slowRenewals.Add(1)
	stop := s.hold("renew", idem.RecordKey(s.c, key), nth, held, &m.env.heldRenewals)
	m.slowRun(c, comp, after, stop)
}

// rapidCutter is a crashable service instance's go-redis client: cut
// closes all its connections and fails every dial until restore.
type rapidCutter struct {
	rdb  *redis.Client
	idem *idem.Client

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

var errRapidCut = errors.New("rapid: the owner's process is gone")

func newRapidCutter(addr string) *rapidCutter {
	cu := &rapidCutter{conns: make(map[net.Conn]struct{})}
	cu.rdb = redis.NewClient(&redis.Options{
		Addr: addr,
		// A pool larger than the number of dials that can fail keeps
		// go-redis from starting its background dial prober, which
		// would outlive Close by up to a second.
		PoolSize: 1000,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if cu.isDown() {
				return nil, errRapidCut
			}
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cu.mu.Lock()
			defer cu.mu.Unlock()
			if cu.down {
				conn.Close()
				return nil, errRapidCut
			}
			cu.conns[conn] = struct{}{}
			return conn, nil
		},
	})
	return cu
}

func (cu *rapidCutter) isDown() bool {
	cu.mu.Lock()
	defer cu.mu.Unlock()
	return cu.down
}

func (cu *rapidCutter) cut() {
	cu.mu.Lock()
	defer cu.mu.Unlock()
	cu.down = true
	for conn := range cu.conns {
		conn.Close()
	}
	clear(cu.conns)
}

func (cu *rapidCutter) restore() {
	cu.mu.Lock()
	defer cu.mu.Unlock()
	cu.down = false
}

func (cu *rapidCutter) close() {
	if cu.idem != nil {
		_ = cu.idem.Close()
	}
	_ = cu.rdb.Close()
}
