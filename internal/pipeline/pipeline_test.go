package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/pipeline"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// incr counts its runs in KEYS[1] and returns ARGV[1] with the count.
var incr = pipeline.NewScript(`local n = redis.call('INCR', KEYS[1]) return ARGV[1] .. '#' .. n`)

// wait bounds what must happen; the machine may be busy.
const wait = 10 * time.Second

// eachServer runs f against miniredis and against a real redis-server.
func eachServer(t *testing.T, f func(t *testing.T, addr string)) {
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) { f(t, b.Addr) })
}

// hooks records what a go-redis client sends, and can hold it: a plain
// command waits while holdCmds is set and matches, a pipeline while
// holdPipes is.
type hooks struct {
	mu        sync.Mutex
	pipes     [][]redis.Cmder        // guarded by mu; pipelines sent
	pipeCtxs  []context.Context      // guarded by mu; their contexts
	cmdCtxs   []context.Context      // guarded by mu; the contexts of plain scripts
	holdCmds  chan struct{}          // closed to release held commands; nil: none held
	holdPipes chan struct{}          // closed to release held pipelines; nil: none held
	held      chan string            // receives "cmd" or "pipe" as one is held
	match     func(redis.Cmder) bool // which plain commands are held; nil: all
}

func newHooks() *hooks { return &hooks{held: make(chan string, 1024)} }

func (h *hooks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *hooks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.mu.Lock()
			h.cmdCtxs = append(h.cmdCtxs, ctx)
			hold := h.holdCmds
			if h.match != nil && !h.match(cmd) {
				hold = nil
			}
			h.mu.Unlock()
			if hold != nil {
				h.held <- "cmd"
				<-hold
			}
		}
		return next(ctx, cmd)
	}
}

func (h *hooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || !isScript(cmds[0]) {
			return next(ctx, cmds) // a connection's handshake
		}
		h.mu.Lock()
		h.pipes = append(h.pipes, cmds)
		h.pipeCtxs = append(h.pipeCtxs, ctx)
		hold := h.holdPipes
		h.mu.Unlock()
		if hold != nil {
			h.held <- "pipe"
			<-hold
		}
		return next(ctx, cmds)
	}
}

func isScript(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval"
}

// scriptPipes returns the sizes of the pipelines of scripts sent so far.
func (h *hooks) scriptPipes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var sizes []int
	for _, p := range h.pipes {
		if len(p) > 0 && isScript(p[0]) {
			sizes = append(sizes, len(p))
		}
	}
	return sizes
}

func (h *hooks) awaitHeld(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-h.held:
		if got != want {
			t.Fatalf("held a %s, want a %s", got, want)
		}
	case <-time.After(wait):
		t.Fatalf("no %s held within %v", want, wait)
	}
}

func newClient(t *testing.T, addr string, h *hooks) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if h != nil {
		rdb.AddHook(h)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newRunner returns a Runner on rdb with max pipelines, whose senders are
// waited for when the test ends.
func newRunner(t *testing.T, rdb redis.UniversalClient, max int) *pipeline.Runner {
	var work pipeline.Work
	t.Cleanup(work.Wait)
	return pipeline.NewRunner(rdb, max, &work)
}

type result struct {
	val string
	err error
}

// goRun runs incr on key in the background with ctx.
func goRun(r *pipeline.Runner, ctx context.Context, key string) <-chan result {
	out := make(chan result, 1)
	go func() {
		v, err := r.Run(ctx, incr, []string{key}, key).Text()
		out <- result{v, err}
	}()
	return out
}

func recv(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(wait):
		t.Fatalf("no result within %v", wait)
		return result{}
	}
}

// queueBehindHeld holds a lone call in flight (the one place of a Runner
// with max 1) and queues a call for each key behind it, with ctxs[i] (or
// a background context). It returns the held call's result, the queued
// ones', and release, which lets the held call go.
func queueBehindHeld(t *testing.T, r *pipeline.Runner, h *hooks, keys []string, ctxs ...context.Context) (first <-chan result, outs []<-chan result, release func()) {
	t.Helper()
	held := make(chan struct{})
	h.mu.Lock()
	h.holdCmds = held
	h.mu.Unlock()
	first = goRun(r, context.Background(), "held")
	h.awaitHeld(t, "cmd")
	h.mu.Lock()
	h.holdCmds = nil // what comes next is not held: the release below frees the first
	h.mu.Unlock()
	for i, k := range keys {
		ctx := context.Background()
		if i < len(ctxs) {
			ctx = ctxs[i]
		}
		outs = append(outs, goRun(r, ctx, k))
	}
	deadline := time.Now().Add(wait)
	for r.Queued() != len(keys) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", r.Queued(), len(keys))
		}
		time.Sleep(time.Millisecond)
	}
	return first, outs, func() { close(held) }
}

// flushWhilePiped lets the call queueBehindHeld held go (release), holds
// the pipeline of the calls queued behind it as it is sent, flushes the
// server's scripts and lets the pipeline go: its EVALSHAs meet NOSCRIPT.
func flushWhilePiped(t *testing.T, rdb *redis.Client, h *hooks, first <-chan result, release func()) {
	t.Helper()
	holdPipe := make(chan struct{})
	h.mu.Lock()
	h.holdPipes = holdPipe
	h.mu.Unlock()
	release()
	recv(t, first)
	h.awaitHeld(t, "pipe")
	h.mu.Lock()
	h.holdPipes = nil
	h.mu.Unlock()
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	close(holdPipe)
}

func TestLoneCallGoesAlone(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 4)
		for i := range 3 {
			v, err := r.Run(context.Background(), incr, []string{"k"}, "a").Text()
			if want := "a#" + strconv.Itoa(i+1); err != nil || v != want {
				t.Fatalf("Run = %q, %v; want %q", v, err, want)
			}
		}
		if p := h.scriptPipes(); len(p) != 0 {
			t.Fatalf("lone calls went in pipelines %v", p)
		}
	})
}

func TestQueuedCallsShareOnePipeline(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 1)
		r.SetSlow(time.Hour) // the held place stays held
		keys := []string{"a", "b", "c", "d", "e"}
		first, outs, release := queueBehindHeld(t, r, h, keys)
		release()
		if res := recv(t, first); res.err != nil || res.val != "held#1" {
			t.Fatalf("held call: %q, %v", res.val, res.err)
		}
		for i, out := range outs {
			if res := recv(t, out); res.err != nil || res.val != keys[i]+"#1" {
				t.Fatalf("call %s: %q, %v; want its own reply", keys[i], res.val, res.err)
			}
		}
		if p := h.scriptPipes(); len(p) != 1 || p[0] != len(keys) {
			t.Fatalf("pipelines of %v scripts, want one of %d", p, len(keys))
		}
	})
}

// The issue this guards: a shared pipeline ran with the first queued
// call's context, so that go-redis hooks (tracing) saw one request's
// context values beside other requests' scripts.
func TestPipelineCarriesNoCallersValues(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		type ctxKey struct{}
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 1)
		r.SetSlow(time.Hour)
		keys := []string{"a", "b", "c"}
		var ctxs []context.Context
		for _, k := range keys {
			ctxs = append(ctxs, context.WithValue(context.Background(), ctxKey{}, "request "+k))
		}
		first, outs, release := queueBehindHeld(t, r, h, keys, ctxs...)
		release()
		recv(t, first)
		for _, out := range outs {
			if res := recv(t, out); res.err != nil {
				t.Fatal(res.err)
			}
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.pipeCtxs) != 1 {
			t.Fatalf("%d pipelines, want 1", len(h.pipeCtxs))
		}
		if v := h.pipeCtxs[0].Value(ctxKey{}); v != nil {
			t.Fatalf("the shared pipeline's context carries a caller's value %q", v)
		}

		// A lone call keeps its caller's context, values included.
		h.cmdCtxs = nil
		h.mu.Unlock()
		lone := context.WithValue(context.Background(), ctxKey{}, "lone")
		if err := r.Run(lone, incr, []string{"lone"}, "x").Err(); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		if len(h.cmdCtxs) != 1 || h.cmdCtxs[0].Value(ctxKey{}) != "lone" {
			t.Fatalf("a lone call did not run with its caller's context")
		}
	})
}

// A shared pipeline ends at the latest of its callers' deadlines, and has
// none when a caller has none.
func TestPipelineDeadline(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 1)
		r.SetSlow(time.Hour)
		now := time.Now()
		early, cancel1 := context.WithDeadline(context.Background(), now.Add(time.Minute))
		defer cancel1()
		late, cancel2 := context.WithDeadline(context.Background(), now.Add(2*time.Minute))
		defer cancel2()
		for _, tc := range []struct {
			name string
			ctxs []context.Context
			want time.Time // zero: none
		}{
			{"every caller has one", []context.Context{early, late}, now.Add(2 * time.Minute)},
			{"a caller has none", []context.Context{early, context.Background()}, time.Time{}},
		} {
			h.mu.Lock()
			h.pipeCtxs = nil
			h.mu.Unlock()
			first, outs, release := queueBehindHeld(t, r, h, []string{tc.name + "1", tc.name + "2"}, tc.ctxs...)
			release()
			recv(t, first)
			for _, out := range outs {
				recv(t, out)
			}
			h.mu.Lock()
			d, ok := h.pipeCtxs[0].Deadline()
			h.mu.Unlock()
			if ok != !tc.want.IsZero() || !d.Equal(tc.want) {
				t.Fatalf("%s: pipeline deadline %v, %v; want %v", tc.name, d, ok, tc.want)
			}
		}
	})
}

// A queued call whose context ends returns at once, with an error that
// says its script was never sent; and it never runs.
func TestQueuedCallLeavesUnsent(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		rdb := newClient(t, addr, h)
		r := newRunner(t, rdb, 1)
		r.SetSlow(time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		first, outs, release := queueBehindHeld(t, r, h, []string{"gone", "stays"}, ctx)
		cancel()
		res := recv(t, outs[0])
		if !errors.Is(res.err, context.Canceled) || !pipeline.NotSent(res.err) || pipeline.InFlight(res.err) != nil {
			t.Fatalf("queued call cancelled: %v (NotSent %v); want context.Canceled, not sent", res.err, pipeline.NotSent(res.err))
		}
		if r.Queued() != 1 {
			t.Fatalf("%d calls queued after one left, want 1", r.Queued())
		}
		release()
		recv(t, first)
		if res := recv(t, outs[1]); res.err != nil || res.val != "stays#1" {
			t.Fatalf("the call that stayed: %q, %v", res.val, res.err)
		}
		if n, err := rdb.Exists(context.Background(), "gone").Result(); err != nil || n != 0 {
			t.Fatalf("the unsent call's script ran (EXISTS %d, %v)", n, err)
		}
		// A call whose context ended before it came is not sent either.
		first, _, release = queueBehindHeld(t, r, h, nil)
		if err := r.Run(ctx, incr, []string{"late"}, "x").Err(); !pipeline.NotSent(err) {
			t.Fatalf("a call with a done context behind a busy place: %v, want not sent", err)
		}
		release()
		recv(t, first)
	})
}

// A call whose context ends while its pipeline is under way returns then,
// and InFlight tells when the pipeline, which may still run its script,
// is over.
func TestPipelinedCallLeavesInFlight(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		rdb := newClient(t, addr, h)
		r := newRunner(t, rdb, 1)
		r.SetSlow(time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		first, outs, release := queueBehindHeld(t, r, h, []string{"left", "stayed"}, ctx)
		holdPipe := make(chan struct{})
		h.mu.Lock()
		h.holdPipes = holdPipe
		h.mu.Unlock()
		release()
		recv(t, first)
		h.awaitHeld(t, "pipe")
		cancel()
		res := recv(t, outs[0])
		over := pipeline.InFlight(res.err)
		if !errors.Is(res.err, context.Canceled) || pipeline.NotSent(res.err) || over == nil {
			t.Fatalf("pipelined call cancelled: %v; want context.Canceled, in flight", res.err)
		}
		select {
		case <-over:
			t.Fatal("InFlight's channel received while the pipeline was held")
		case <-time.After(50 * time.Millisecond):
		}
		close(holdPipe)
		select {
		case <-over:
		case <-time.After(wait):
			t.Fatal("InFlight's channel did not receive once the pipeline was over")
		}
		if res := recv(t, outs[1]); res.err != nil || res.val != "stayed#1" {
			t.Fatalf("the call that stayed: %q, %v", res.val, res.err)
		}
		// The script of the call that left ran all the same.
		if n, err := rdb.Get(context.Background(), "left").Int(); err != nil || n != 1 {
			t.Fatalf("the left call's script: GET %d, %v; want it run once", n, err)
		}
	})
}

// Scripts the server does not have cached go whole in a second pipeline;
// a script that fails fails its own call only.
func TestPipelineNoScriptAndErrors(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		rdb := newClient(t, addr, h)
		r := newRunner(t, rdb, 1)
		r.SetSlow(time.Hour)
		ctx := context.Background()
		if err := rdb.Set(ctx, "str", "not a number", 0).Err(); err != nil {
			t.Fatal(err)
		}
		first, outs, release := queueBehindHeld(t, r, h, []string{"a", "str", "b"})
		flushWhilePiped(t, rdb, h, first, release)
		for i, want := range []string{"a#1", "", "b#1"} {
			res := recv(t, outs[i])
			if want == "" {
				if res.err == nil {
					t.Fatalf("a script on a string key: %q, want an error", res.val)
				}
				continue
			}
			if res.err != nil || res.val != want {
				t.Fatalf("call %d: %q, %v; want %q", i, res.val, res.err, want)
			}
		}
		if p := h.scriptPipes(); len(p) != 2 {
			t.Fatalf("pipelines %v, want the EVALSHAs and then the EVALs", p)
		}
	})
}

// A pipeline (or plain run) in flight for longer than its slow time stops
// holding its place: the next call goes without waiting for it.
func TestSlowCallFreesItsPlace(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 1)
		r.SetSlow(20 * time.Millisecond)
		held := make(chan struct{})
		h.mu.Lock()
		h.holdCmds = held
		h.match = func(cmd redis.Cmder) bool { return len(cmd.Args()) > 3 && cmd.Args()[3] == "slow" }
		h.mu.Unlock()
		slow := goRun(r, context.Background(), "slow")
		h.awaitHeld(t, "cmd")
		for i := range 3 {
			out := goRun(r, context.Background(), "next")
			if res := recv(t, out); res.err != nil || res.val != "next#"+strconv.Itoa(i+1) {
				t.Fatalf("a call behind a slow one: %q, %v", res.val, res.err)
			}
		}
		close(held)
		if res := recv(t, slow); res.err != nil {
			t.Fatal(res.err)
		}
	})
}

// More calls queued than one pipeline takes go in several, none larger
// than MaxBatch.
func TestMaxBatch(t *testing.T) {
	h := newHooks()
	r := newRunner(t, newClient(t, miniredis.RunT(t).Addr(), h), 1)
	r.SetSlow(time.Hour)
	n := 2*pipeline.MaxBatch + 10
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	first, outs, release := queueBehindHeld(t, r, h, keys)
	release()
	recv(t, first)
	for i, out := range outs {
		if res := recv(t, out); res.err != nil || res.val != keys[i]+"#1" {
			t.Fatalf("call %d: %q, %v", i, res.val, res.err)
		}
	}
	total := 0
	for _, size := range h.scriptPipes() {
		if size > pipeline.MaxBatch {
			t.Fatalf("a pipeline of %d scripts, more than %d", size, pipeline.MaxBatch)
		}
		total += size
	}
	if total != n {
		t.Fatalf("%d scripts in pipelines, want %d", total, n)
	}
}

// With max 0 every script goes alone, however many calls run at once.
func TestNoPipelines(t *testing.T) {
	h := newHooks()
	r := newRunner(t, newClient(t, miniredis.RunT(t).Addr(), h), 0)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(context.Background(), incr, []string{fmt.Sprint("k", i)}, "x").Err(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if p := h.scriptPipes(); len(p) != 0 {
		t.Fatalf("pipelines %v with max 0", p)
	}
}

// A crowd of concurrent calls on a real server: every call gets its own
// reply, and the crowd shares pipelines.
func TestCrowd(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		r := newRunner(t, newClient(t, addr, h), 2)
		const callers, calls = 32, 50
		var wg sync.WaitGroup
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprint("g", g)
				for i := range calls {
					v, err := r.Run(context.Background(), incr, []string{key}, key).Text()
					if want := key + "#" + strconv.Itoa(i+1); err != nil || v != want {
						t.Errorf("%s: %q, %v; want %q", key, v, err, want)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
}

// On a cluster, calls queue per master; every script reaches its key's
// master through the ClusterClient, whose hooks see it.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	h := newHooks()
	cc := cl.Client(t)
	cc.AddHook(h)
	r := newRunner(t, cc, 1)
	const callers, calls = 24, 20
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("{g", g, "}")
			for i := range calls {
				v, err := r.Run(context.Background(), incr, []string{key}, key).Text()
				if want := key + "#" + strconv.Itoa(i+1); err != nil || v != want {
					t.Errorf("%s: %q, %v; want %q", key, v, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	h.mu.Lock()
	seen := len(h.cmdCtxs)
	for _, p := range h.pipes {
		for _, c := range p {
			if isScript(c) {
				seen++
			}
		}
	}
	h.mu.Unlock()
	if seen < callers*calls {
		t.Fatalf("the ClusterClient's hooks saw %d scripts, want at least %d", seen, callers*calls)
	}
}

// A Runner on a cluster whose masters cannot be found runs the script
// through the ClusterClient, which reports the failure.
func TestClusterUnreachable(t *testing.T) {
	addr := redistest.RefusedAddr(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer cc.Close()
	r := newRunner(t, cc, 1)
	if err := r.Run(context.Background(), incr, []string{"k"}, "x").Err(); err == nil {
		t.Fatal("a script on an unreachable cluster succeeded")
	}
}

func TestErrCmd(t *testing.T) {
	boom := errors.New("boom")
	cmd := pipeline.ErrCmd(context.Background(), boom)
	if !errors.Is(cmd.Err(), boom) {
		t.Fatalf("ErrCmd's error: %v", cmd.Err())
	}
	if pipeline.NotSent(boom) || pipeline.InFlight(boom) != nil {
		t.Fatal("a plain error reads as not sent or in flight")
	}
}
