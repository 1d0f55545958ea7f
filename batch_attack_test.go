package idem_test

// Attacks on the batcher (batch.go): each test tries to break one of the
// promises (one live owner per key; fn at most once per attempt, its
// outcome to every caller of its key and only of it; a conflict for
// another fingerprint; a caller's context bounds its wait; nothing leaks;
// Close waits for the background work) where concurrent calls share
// pipelines.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// gate is a go-redis hook that holds, before they are written, the single
// commands and the pipelines its predicates pick, until opened: it stands
// for a sender goroutine that is slow between taking its batch and writing
// it (descheduled on a busy machine, dialing a new connection, writing a
// big pipeline ahead of the picked script).
type gate struct {
	cmd  func(redis.Cmder) bool   // holds single commands it picks
	pipe func([]redis.Cmder) bool // holds pipelines it picks

	cmdOpen, pipeOpen         chan struct{}
	cmdOnce, pipeOnce         sync.Once
	cmdsHeld, pipesHeld       atomic.Int64 // picked so far
	cmdsPassed, pipesReleased atomic.Int64 // picked and let go
}

func newGate(t *testing.T, cmd func(redis.Cmder) bool, pipe func([]redis.Cmder) bool) *gate {
	g := &gate{cmd: cmd, pipe: pipe, cmdOpen: make(chan struct{}), pipeOpen: make(chan struct{})}
	t.Cleanup(func() { g.openCmds(); g.openPipes() }) // never leave a goroutine held
	return g
}

func (g *gate) openCmds()  { g.cmdOnce.Do(func() { close(g.cmdOpen) }) }
func (g *gate) openPipes() { g.pipeOnce.Do(func() { close(g.pipeOpen) }) }

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.cmd != nil && g.cmd(cmd) {
			g.cmdsHeld.Add(1)
			<-g.cmdOpen
			g.cmdsPassed.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.pipe != nil && g.pipe(cmds) {
			g.pipesHeld.Add(1)
			<-g.pipeOpen
			g.pipesReleased.Add(1)
		}
		return next(ctx, cmds)
	}
}

// isScriptOn reports whether cmd runs the named idem script with record
// key rk as its first key (EVALSHA or EVAL).
func isScriptOn(cmd redis.Cmder, name, rk string) bool {
	args := cmd.Args()
	if len(args) < 4 {
		return false
	}
	if n := cmdName(cmd); n != "evalsha "+name && n != "eval "+name {
		return false
	}
	k, _ := args[3].(string)
	return k == rk
}

// anyScriptOn reports whether one of cmds runs the named script on rk.
func anyScriptOn(cmds []redis.Cmder, name, rk string) bool {
	for _, cmd := range cmds {
		if isScriptOn(cmd, name, rk) {
			return true
		}
	}
	return false
}

// isRawScriptOn is isScriptOn for a command as faultconn sees it.
func isRawScriptOn(name, rk string) func([]string) bool {
	is := faultconn.IsScript(idem.ScriptSHA(name))
	return func(cmd []string) bool { return is(cmd) && len(cmd) > 3 && cmd[3] == rk }
}

// pinned is an idem.Client with two places for pipelines (the default),
// both held by the plain claims of keys "a" and "b", which a gate holds
// before they are written: calls started meanwhile queue, and go as one
// pipeline once openCmds lets the claims go.
type pinned struct {
	c   *idem.Client
	g   *gate
	ctr *cmdCounter
	l   ledger
	ab  [2]chan callResult
}

func newPinned(t *testing.T, b *backend, pipe func([]redis.Cmder) bool, ro func(*redis.Options), opts ...idem.Option) *pinned {
	t.Helper()
	faultLoadScripts(t, b)
	p := &pinned{ctr: new(cmdCounter)}
	rkA, rkB := recordKey(t, b, "a"), recordKey(t, b, "b")
	p.g = newGate(t, func(cmd redis.Cmder) bool {
		return isScriptOn(cmd, "claim", rkA) || isScriptOn(cmd, "claim", rkB)
	}, pipe)
	rdb := b.client(t, func(o *redis.Options) {
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
		if ro != nil {
			ro(o)
		}
	})
	rdb.AddHook(p.ctr)
	rdb.AddHook(p.g)
	p.c = idem.New(rdb, append([]idem.Option{idem.WithPipelines(2)}, opts...)...)
	t.Cleanup(func() { _ = p.c.Close() })
	for i, key := range []string{"a", "b"} {
		p.ab[i] = make(chan callResult, 1)
		go func() {
			res, err := p.c.Do(context.Background(), key, "fp", p.l.fn("r-"+key))
			p.ab[i] <- callResult{string(res), err}
		}()
	}
	eventually(t, 10*time.Second, "the claims of a and b held", func() bool { return p.g.cmdsHeld.Load() == 2 })
	return p
}

// recordKey is the Redis key of key's record for a Client with the
// default prefix.
func recordKey(t *testing.T, b *backend, key string) string {
	return idem.RecordKey(b.idem(t), key)
}

// queue starts Do for each key, with ctxs[i] or a background context, one
// after the other, and returns once all of them wait in the batcher's
// queue, in the order of keys.
func (p *pinned) queue(t *testing.T, keys []string, ctxs ...context.Context) []chan callResult {
	t.Helper()
	out := make([]chan callResult, len(keys))
	for i, key := range keys {
		ctx := context.Background()
		if i < len(ctxs) && ctxs[i] != nil {
			ctx = ctxs[i]
		}
		out[i] = make(chan callResult, 1)
		go func() {
			res, err := p.c.Do(ctx, key, "fp", p.l.fn("r-"+key))
			out[i] <- callResult{string(res), err}
		}()
		// One at a time: the pipeline carries them in this order.
		eventually(t, 10*time.Second, "the call queued", func() bool { return idem.Queued(p.c) == i+1 })
	}
	return out
}

// finishAB waits for the calls of a and b.
func (p *pinned) finishAB(t *testing.T) {
	t.Helper()
	for i, key := range []string{"a", "b"} {
		if r := recv(t, p.ab[i]); r.err != nil || r.res != "r-"+key+"#1" {
			t.Errorf("key %q: got %q, %v", key, r.res, r.err)
		}
	}
}

// recv returns what ch delivers, failing the test after 30 seconds.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("no result within 30 s")
		panic("unreachable")
	}
}

// A caller whose claim was taken into a pipeline, and whose context ends
// before that pipeline is written, returns "may have run" and gives its
// claim back: the release must not land before the claim, or the key
// stays claimed by nobody for a whole lease (every later caller gets
// ErrInProgress, then takes over as attempt 2, told that an earlier
// attempt may have acted). Alone, a script is written by the caller's own
// goroutine before that goroutine can release anything; in a pipeline, a
// sender writes it, and the caller may leave first.
func TestAttackGiveBackOvertakesPipelinedClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		rk := recordKey(t, b, "victim")
		p := newPinned(t, b, func(cmds []redis.Cmder) bool { return anyScriptOn(cmds, "claim", rk) },
			nil, idem.WithLease(time.Minute))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		results := p.queue(t, []string{"victim", "other"}, ctx)
		p.g.openCmds() // a's and b's claims go; a sender takes the queue
		eventually(t, 10*time.Second, "the pipeline taken by a sender", func() bool { return p.g.pipesHeld.Load() == 1 })
		cancel()
		r := recv(t, results[0])
		if !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), "claim") {
			t.Fatalf("victim: got %q, %v; want the claim's context.Canceled", r.res, r.err)
		}
		// The caller gives the claim back (a, b and their completions free
		// the other place meanwhile).
		eventually(t, 10*time.Second, "the victim's release sent", func() bool {
			return p.ctr.snapshot().cmds["evalsha release"] >= 1
		})
		p.g.openPipes()
		if r := recv(t, results[1]); r.err != nil || r.res != "r-other#1" {
			t.Errorf("other: got %q, %v", r.res, r.err)
		}
		p.finishAB(t)
		_ = p.c.Close() // background releases done
		faultRuns(t, &p.l, "victim", "[]")
		st := faultStatus(t, b, "victim")
		if st.State == idem.StateInProgress {
			t.Errorf("BUG: the victim's key is left in progress (attempt %d, lease until %v) by a claim that nobody owns: "+
				"its release ran before the pipeline carried the claim", st.Attempt, st.LeaseEnds.Format(time.TimeOnly))
			_, err := b.idem(t, idem.WithWait(0)).Do(context.Background(), "victim", "fp", p.l.fn("next"))
			t.Logf("the next caller gets: %v", err)
		}
	})
}

// The same with go-redis's retries: the pipeline's claim ran, the caller
// left at its context and released it, then the pipeline's reply was lost
// and go-redis sent the whole pipeline again, which claims the released
// key anew (attempt 2) with the departed caller's token.
func TestAttackPipelineRetryReclaimsAfterGiveBack(t *testing.T) {
	b := newRedis(t, redistest.Config{})
	in := faultconn.New(
		faultconn.Rule{Match: isRawScriptOn("claim", recordKey(t, b, "victim")), Nth: 1, Action: faultconn.DelayReply, Delay: 4 * time.Second},
		faultconn.Rule{Match: isRawScriptOn("claim", recordKey(t, b, "other")), Nth: 1, Action: faultconn.DropReply})
	p := newPinned(t, b, nil, func(o *redis.Options) {
		o.Dialer = in.Dialer(b.addr)
	}, idem.WithLease(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	results := p.queue(t, []string{"victim", "other"}, ctx)
	p.g.openCmds()
	r := recv(t, results[0])
	if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "claim") {
		t.Fatalf("victim: got %q, %v; want the claim's context.DeadlineExceeded", r.res, r.err)
	}
	if r := recv(t, results[1]); r.err != nil || r.res != "r-other#1" {
		t.Errorf("other: got %q, %v", r.res, r.err)
	}
	p.finishAB(t)
	_ = p.c.Close()
	if in.Hits() != 2 {
		t.Fatalf("%d faults, want the victim's delay and the other's lost reply", in.Hits())
	}
	faultRuns(t, &p.l, "victim", "[]")
	if st := faultStatus(t, b, "victim"); st.State == idem.StateInProgress {
		t.Errorf("BUG: the victim's key is left in progress (attempt %d, lease until %v) by a claim that nobody owns: "+
			"go-redis sent the pipeline again after the departed caller's release", st.Attempt, st.LeaseEnds.Format(time.TimeOnly))
	}
}
