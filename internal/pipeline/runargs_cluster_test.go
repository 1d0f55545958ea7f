package pipeline_test

// A test that a Runner on a cluster queues and sends each script by its
// first key, not by another of its arguments.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// nodeHook records, for one node's client of a ClusterClient, the first
// key of every script sent to that node (a MOVED script is sent to two).
type nodeHook struct {
	addr string
	mu   *sync.Mutex
	sent *[][2]string // guarded by mu; node address and first key
}

func (n nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (n nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n.add(cmd)
		return next(ctx, cmd)
	}
}

func (n nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			n.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (n nodeHook) add(cmd redis.Cmder) {
	if !isScript(cmd) || len(cmd.Args()) < 4 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	*n.sent = append(*n.sent, [2]string{n.addr, fmt.Sprint(cmd.Args()[3])})
}

// TestClusterRoutesByFirstKey guards the claim that a script's command
// carries the cluster slot of its first key (KEYS[1], the fourth
// argument), as go-redis's EVALSHA does: alone and queued, each script is
// queued behind, and sent only to, the master of its first key, though its
// first argument (ARGV[1]) is in a slot of another master. It fails if
// the command's first key position is another argument's (a script sent
// to the wrong node first, redirected by MOVED), or if RunArgs picked the
// batcher by another argument (the queued calls would go alone through
// another master's free batcher).
func TestClusterRoutesByFirstKey(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	var mu sync.Mutex
	var sent [][2]string
	cc := cl.Client(t, func(o *redis.ClusterOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			rdb := redis.NewClient(opt)
			rdb.AddHook(nodeHook{addr: opt.Addr, mu: &mu, sent: &sent})
			return rdb
		}
	})
	h := newHooks()
	cc.AddHook(h)
	r := newRunner(t, cc, 1)
	r.SetSlow(time.Hour)
	ctx := context.Background()
	master := func(key string) string {
		t.Helper()
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	// The held call's key and argument, both on master a; the queued
	// calls' keys on a too, their arguments on other masters.
	held := "{held}"
	a := master(held)
	var keys, args []string
	for i := 0; len(keys) < 2; i++ {
		if k := fmt.Sprintf("{k%d}", i); master(k) == a {
			keys = append(keys, k)
		}
	}
	for i := 0; len(args) < 2; i++ {
		if x := fmt.Sprintf("{x%d}", i); master(x) != a {
			args = append(args, x)
		}
	}

	// Alone.
	if v, err := r.Run(ctx, incr, keys[:1], args[0]).Text(); err != nil || v != args[0]+"#1" {
		t.Fatalf("a lone call: %q, %v", v, err)
	}

	// Queued behind a held call on master a.
	hold := make(chan struct{})
	h.mu.Lock()
	h.holdCmds = hold
	h.match = func(cmd redis.Cmder) bool { return len(cmd.Args()) > 3 && cmd.Args()[3] == held }
	h.mu.Unlock()
	first := goRunArgs(r, held, held)
	h.awaitHeld(t, "cmd")
	outs := []<-chan result{goRunArgs(r, keys[0], args[0]), goRunArgs(r, keys[1], args[1])}
	deadline := time.Now().Add(wait)
	for pipeline.QueuedOnMasters(r) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued behind their first key's master, want 2", pipeline.QueuedOnMasters(r))
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	if res := recv(t, first); res.err != nil {
		t.Fatalf("the held call: %v", res.err)
	}
	for i, want := range []string{args[0] + "#2", args[1] + "#1"} {
		if res := recv(t, outs[i]); res.err != nil || res.val != want {
			t.Fatalf("queued call %d: %q, %v; want %q", i, res.val, res.err, want)
		}
	}
	if p := h.scriptPipes(); len(p) != 1 || p[0] != 2 {
		t.Fatalf("pipelines of %v scripts, want one of the 2 queued", p)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) == 0 {
		t.Fatal("the nodes' hooks saw no script")
	}
	for _, s := range sent {
		if s[0] != a {
			t.Errorf("a script of key %s went to %s, not to its master %s", s[1], s[0], a)
		}
	}
}

// goRunArgs runs incr on key with arg in the background.
func goRunArgs(r *pipeline.Runner, key, arg string) <-chan result {
	out := make(chan result, 1)
	go func() {
		v, err := r.Run(context.Background(), incr, []string{key}, arg).Text()
		out <- result{v, err}
	}()
	return out
}
