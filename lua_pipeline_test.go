package idem_test

// The batcher (internal/pipeline): concurrent calls' scripts share pipelines, and
// each call still behaves as it would alone: its own reply, its own
// errors, its own context. The tests make a crowd deterministic with
// WithPipelines(1) and a first call whose claim reply is held: while it
// holds the only place, every other call queues, and the next pipeline
// carries them all.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// pipeRecorder is a go-redis hook that records the pipelines a client
// sends, as the names of their commands (see cmdName).
type pipeRecorder struct {
	mu    sync.Mutex
	pipes [][]string // guarded by mu
}

func (r *pipeRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *pipeRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (r *pipeRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, cmd := range cmds {
			names[i] = cmdName(cmd)
		}
		r.mu.Lock()
		r.pipes = append(r.pipes, names)
		r.mu.Unlock()
		return next(ctx, cmds)
	}
}

// find returns how many pipelines sent exactly n commands named name
// (among others: a call that queued while the pipeline was taken may have
// joined it).
func (r *pipeRecorder) find(name string, n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := 0
	for _, p := range r.pipes {
		k := 0
		for _, c := range p {
			if c == name {
				k++
			}
		}
		if k == n {
			found++
		}
	}
	return found
}

func (r *pipeRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sb strings.Builder
	for _, p := range r.pipes {
		counts := map[string]int{}
		for _, c := range p {
			counts[c]++
		}
		fmt.Fprintf(&sb, "%s ", formatCounts(counts))
	}
	return sb.String()
}

// crowd is a Client with one place for a pipeline, held by a first call
// whose claim reply the injector holds for hold; calls started with queue
// then wait in the batcher's queue for it.
type crowd struct {
	t    *testing.T
	b    *idemtest.Backend
	in   *faultconn.Injector
	c    *idem.Client
	rec  *pipeRecorder
	ctr  *cmdCounter
	l    idemtest.Runs
	done chan error // the first call's
}

// newCrowd starts the first call ("blocker") and returns once its claim
// was written. rules act after the hold's rule, on the commands it does
// not take.
func newCrowd(t *testing.T, b *idemtest.Backend, hold time.Duration, ro func(*redis.Options), rules ...faultconn.Rule) *crowd {
	t.Helper()
	idemtest.LoadScripts(t, b)
	claim := idemtest.IsScript(t, "claim")
	cr := &crowd{t: t, b: b, rec: new(pipeRecorder), ctr: new(cmdCounter), done: make(chan error, 1)}
	cr.in = faultconn.New(faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: hold})
	for _, r := range rules {
		cr.in.Add(r)
	}
	rdb := b.Client(t, func(o *redis.Options) {
		o.Dialer = cr.in.Dialer(b.Addr)
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
		o.ReadTimeout = 3*hold + 10*time.Second
		if ro != nil {
			ro(o)
		}
	})
	rdb.AddHook(cr.ctr)
	rdb.AddHook(cr.rec)
	cr.c = idem.New(rdb, idem.WithPipelines(1))
	idem.SetSlowPipeline(cr.c, time.Hour) // the held place stays held
	t.Cleanup(func() { _ = cr.c.Close() })
	go func() {
		_, err := cr.c.Do(context.Background(), "blocker", "fp", cr.l.Fn("blocker"))
		cr.done <- err
	}()
	idemtest.Eventually(t, 10*time.Second, "the blocker's claim written", func() bool { return cr.in.Hits() >= 1 })
	return cr
}

// queue starts Do for each key (with ctxs[i], or a background context)
// and returns once all of them wait in the batcher's queue; each call's
// result, or error, arrives on its channel.
func (cr *crowd) queue(keys []string, ctxs ...context.Context) []chan callResult {
	cr.t.Helper()
	out := make([]chan callResult, len(keys))
	for i, key := range keys {
		ctx := context.Background()
		if i < len(ctxs) && ctxs[i] != nil {
			ctx = ctxs[i]
		}
		out[i] = make(chan callResult, 1)
		go func() {
			res, err := cr.c.Do(ctx, key, "fp", cr.l.Fn("r-"+key))
			out[i] <- callResult{string(res), err}
		}()
	}
	idemtest.Eventually(cr.t, 10*time.Second, fmt.Sprintf("%d calls queued", len(keys)), func() bool {
		return idem.Queued(cr.c) == len(keys)
	})
	return out
}

// blocker waits for the first call's end.
func (cr *crowd) blocker() {
	cr.t.Helper()
	select {
	case err := <-cr.done:
		if err != nil {
			cr.t.Fatalf("the blocker: %v", err)
		}
	case <-time.After(30 * time.Second):
		cr.t.Fatal("the blocker did not return")
	}
}

type callResult struct {
	res string
	err error
}

func crowdKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return keys
}

// The queued claims go as one pipeline (one round trip for all), and every
// call gets its own key's result.
func TestQueuedCallsShareOnePipeline(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		cr := newCrowd(t, b, 500*time.Millisecond, nil)
		keys := crowdKeys("k", 40)
		results := cr.queue(keys)
		cr.blocker()
		cr.ownResults(keys, results)
		if n := cr.rec.find("evalsha claim", len(keys)); n != 1 {
			t.Errorf("want one pipeline of the %d queued claims; sent %v", len(keys), cr.rec)
		}
		got := cr.ctr.snapshot().withoutHandshakes()
		want := map[string]int{"evalsha claim": 41, "evalsha complete": 41, "config get": 1}
		for name, n := range want {
			if got.cmds[name] != n {
				t.Errorf("sent %v; want %s", got, formatCounts(want))
				break
			}
		}
		t.Logf("%v; pipelines %v", got, cr.rec)
		if got.trips >= 82 {
			t.Errorf("%d round trips for 41 new keys: the scripts did not share pipelines", got.trips)
		}
	})
}

// A pipeline whose reply is lost part way: every call fails as a single
// call with a lost reply fails, and the claims that ran are given back:
// go-redis reports the pipeline's error on each command that had no error
// of its own, those whose replies came before the loss included, so they
// too count as unknown. The commands after the loss never reached Redis.
// With go-redis's retries, the pipeline is sent again and every call gets
// its own outcome, fn running once.
func TestPipelineReplyLost(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	claim := idemtest.IsScript(t, "claim")
	t.Run("no retries", func(t *testing.T) {
		// The 11th claim overall is the 10th of the pipeline.
		cr := newCrowd(t, b, 500*time.Millisecond, idemtest.NoRetry,
			faultconn.Rule{Match: claim, Nth: 10, Action: faultconn.DropReply})
		keys := crowdKeys("lost", 30)
		results := cr.queue(keys)
		cr.blocker()
		var ok, released, absent []string
		for i, key := range keys {
			r := <-results[i]
			if r.err == nil {
				if want := "r-" + key + "#1"; r.res != want {
					t.Errorf("key %q: got %q, want %q", key, r.res, want)
				}
				cr.l.Want(t, key, "[1]")
				ok = append(ok, key)
				continue
			}
			if !errors.Is(r.err, io.EOF) || !strings.Contains(r.err.Error(), "claim") {
				t.Errorf("key %q: got %v, want the claim's io.EOF", key, r.err)
			}
			cr.l.Want(t, key, "[]")
			idemtest.Eventually(t, 5*time.Second, "a lost claim given back", func() bool {
				st := idemtest.Status(t, b, key).State
				return st == idem.StateReleased || st == idem.StateAbsent
			})
			if idemtest.Status(t, b, key).State == idem.StateReleased {
				released = append(released, key)
			} else {
				absent = append(absent, key)
			}
		}
		t.Logf("pipelines: %v", cr.rec)
		if len(ok) != 0 || len(released) != 10 || len(absent) != 20 {
			t.Fatalf("%d calls succeeded, %d claims ran and were given back, %d never ran; want 0, 10, 20", len(ok), len(released), len(absent))
		}
		// Each failed key is free: the next call runs fn at once.
		next := b.Idem(t, idem.WithWait(0))
		for _, key := range append(released, absent...) {
			want := "next#1"
			if idemtest.Status(t, b, key).State == idem.StateReleased {
				want = "next#2"
			}
			res, err := next.Do(context.Background(), key, "fp", cr.l.Fn("next"))
			if err != nil || string(res) != want {
				t.Errorf("key %q, the next call: got %q, %v; want %q", key, res, err, want)
			}
		}
	})
	t.Run("retries", func(t *testing.T) {
		cr := newCrowd(t, b, 500*time.Millisecond, nil,
			faultconn.Rule{Match: claim, Nth: 10, Action: faultconn.DropReply})
		keys := crowdKeys("retried", 30)
		results := cr.queue(keys)
		cr.blocker()
		cr.ownResults(keys, results)
		if cr.in.Hits() < 2 {
			t.Fatalf("the reply was not dropped (%d hits)", cr.in.Hits())
		}
	})
}

// A queued call whose context ends returns then, while the pipeline's
// place is still held: unsent, its claim never ran, and nothing is given
// back for it.
func TestQueuedCallLeavesAtItsContext(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		cr := newCrowd(t, b, 5*time.Second, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		t0 := time.Now()
		results := cr.queue([]string{"leaver", "stayer"}, ctx)
		r := <-results[0]
		if d := time.Since(t0); d > 4*time.Second {
			t.Errorf("the call returned after %v: it waited for the held pipeline", d)
		}
		if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "claim") {
			t.Errorf("got %q, %v; want the claim's context.DeadlineExceeded", r.res, r.err)
		}
		cr.blocker()
		if r := <-results[1]; r.err != nil || r.res != "r-stayer#1" {
			t.Errorf("the other queued call: got %q, %v", r.res, r.err)
		}
		cr.l.Want(t, "leaver", "[]")
		idemtest.WantStatus(t, b, "leaver", idem.StateAbsent, 0)
		if n := cr.ctr.snapshot().cmds["evalsha release"]; n != 0 {
			t.Errorf("%d releases sent for a claim that was never sent", n)
		}
	})
}

// A call whose claim went out in a pipeline whose reply is held returns at
// its context's end, not the pipeline's: its claim may have run, so it is
// given back, and fn does not run; the other calls of the pipeline get
// their replies when they come.
func TestPipelinedCallLeavesAtItsContext(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		claim := idemtest.IsScript(t, "claim")
		// The second claim overall is the pipeline's first: holding its
		// reply holds the pipeline's.
		cr := newCrowd(t, b, time.Second, nil,
			faultconn.Rule{Match: claim, Nth: 1, Action: faultconn.DelayReply, Delay: 5 * time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		results := cr.queue([]string{"leaver", "a", "b"}, ctx)
		r := <-results[0]
		if d := time.Since(t0); d > 4500*time.Millisecond {
			t.Errorf("the call returned after %v: it waited for the pipeline's reply", d)
		}
		if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "claim") {
			t.Errorf("got %q, %v; want the claim's context.DeadlineExceeded", r.res, r.err)
		}
		cr.blocker()
		for i, key := range []string{"a", "b"} {
			if r := <-results[i+1]; r.err != nil || r.res != "r-"+key+"#1" {
				t.Errorf("key %q: got %q, %v", key, r.res, r.err)
			}
		}
		idemtest.Eventually(t, 10*time.Second, "the claim given back", func() bool {
			return idemtest.Status(t, b, "leaver").State == idem.StateReleased
		})
		cr.l.Want(t, "leaver", "[]")
		idemtest.WantStatus(t, b, "leaver", idem.StateReleased, 1)
	})
}

// Scripts flushed from the server's cache: the queued calls' EVALSHAs
// answer NOSCRIPT in one pipeline and go again, whole, in a second one.
func TestPipelineAfterScriptFlush(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		cr := newCrowd(t, b, 500*time.Millisecond, nil)
		keys := crowdKeys("flushed", 20)
		results := cr.queue(keys)
		b.Do(t, "SCRIPT", "FLUSH")
		cr.blocker()
		cr.ownResults(keys, results)
		if cr.rec.find("evalsha claim", len(keys)) != 1 || cr.rec.find("eval claim", len(keys)) != 1 {
			t.Errorf("want a pipeline of %d EVALSHA claims, then one of %d EVAL claims; sent %v", len(keys), len(keys), cr.rec)
		}
	})
}

// 200 goroutines on 50 keys through two Clients (two instances of a
// service), pipelines on: one fn per key, never two live owners, and every
// caller gets its own key's result.
func TestCrowdOnFewKeys(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		var (
			l idemtest.Runs
			o idemtest.Owners
		)
		crowdOn(t, []*idem.Client{b.Idem(t), b.Idem(t)}, "few", 200, 50, time.Millisecond, &l, &o)
		o.Check(t)
	})
}

// crowdOn makes callers calls, behind a barrier, on keys keys (prefix-00,
// prefix-01, ...) through cs in turn; each fn notes its run in l (and in
// o, unless nil), takes work and returns "r-" and its key. It fails the
// test unless every caller got its own key's result and fn ran once per
// key.
func crowdOn(t *testing.T, cs []*idem.Client, prefix string, callers, keys int, work time.Duration, l *idemtest.Runs, o *idemtest.Owners) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		key := fmt.Sprintf("%s-%02d", prefix, i%keys)
		wg.Go(func() {
			<-start
			res, err := cs[i%len(cs)].Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
				if o != nil {
					defer o.Enter(ctx)()
				}
				l.Add(ctx)
				time.Sleep(work)
				return []byte("r-" + key), nil
			})
			if err != nil || string(res) != "r-"+key {
				t.Errorf("caller %d, key %q: got %q, %v", i, key, res, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for k := range keys {
		l.Want(t, fmt.Sprintf("%s-%02d", prefix, k), "[1]")
	}
}

// ownResults fails the test unless each of keys' calls, whose results
// queue returned, got its own key's result of attempt 1, fn running once.
func (cr *crowd) ownResults(keys []string, results []chan callResult) {
	cr.t.Helper()
	for i, key := range keys {
		r := <-results[i]
		if want := "r-" + key + "#1"; r.err != nil || r.res != want {
			cr.t.Errorf("key %q: got %q, %v; want %q", key, r.res, r.err, want)
		}
		cr.l.Want(cr.t, key, "[1]")
	}
}

// A reply held up holds up only its own calls: once a pipeline (here the
// plain run of the one place, WithPipelines(1)) has been in flight for a
// while, it stops holding its place, and the calls behind it go on. Before,
// every call waited for the held reply.
func TestSlowReplyHoldsOnlyItsOwnCalls(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		const hold = 5 * time.Second
		idemtest.LoadScripts(t, b)
		in := faultconn.New(faultconn.Rule{Match: idemtest.IsScript(t, "claim"), Nth: 1, Action: faultconn.DelayReply, Delay: hold})
		rdb := b.Client(t, func(o *redis.Options) {
			o.Dialer = in.Dialer(b.Addr)
			o.ReadTimeout = 3 * hold
		})
		c := idem.New(rdb, idem.WithPipelines(1))
		t.Cleanup(func() { _ = c.Close() })
		var l idemtest.Runs
		slow := make(chan error, 1)
		go func() {
			_, err := c.Do(context.Background(), "slow", "fp", l.Fn("slow"))
			slow <- err
		}()
		idemtest.Eventually(t, 10*time.Second, "the slow claim written", func() bool { return in.Hits() >= 1 })
		t0 := time.Now()
		crowdOn(t, []*idem.Client{c}, "behind", 40, 20, 0, &l, nil)
		if d := time.Since(t0); d > hold-time.Second {
			t.Errorf("the calls behind the held reply took %v: they waited for it", d)
		}
		select {
		case err := <-slow:
			t.Fatalf("the held call returned (%v) before its reply", err)
		default:
		}
		if err := <-slow; err != nil {
			t.Fatalf("the held call: %v", err)
		}
		l.Want(t, "slow", "[1]")
	})
}
