package pipeline_test

// A test that a Runner on a cluster queues and sends each script by its
// first key, not by another of its arguments.

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// nodeSent is a script sent to a node.
type nodeSent struct{ addr, key, name string }

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
	var sent []nodeSent
	cc := cl.Client(t, recordNodes(&mu, &sent))
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
		if s.addr != a {
			t.Errorf("a script of key %s went to %s, not to its master %s", s.key, s.addr, a)
		}
	}
}

// recordNodes sets a ClusterClient's options to add a hook to each node's
// client that records, in *sent, every script sent to that node (a MOVED
// script is sent to two).
func recordNodes(mu *sync.Mutex, sent *[]nodeSent) func(*redis.ClusterOptions) {
	return func(o *redis.ClusterOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			rdb := redis.NewClient(opt)
			rdb.AddHook(scriptHook(func(cmd redis.Cmder) {
				if len(cmd.Args()) < 4 {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				*sent = append(*sent, nodeSent{opt.Addr, fmt.Sprint(cmd.Args()[3]), cmd.Name()})
			}))
			return rdb
		}
	}
}

// TestClusterFailoverRunsTheSameArgs guards the EVAL fallback across a
// cluster's failover: the promoted replica never loaded the script (a
// replica applies a script's effects, not the script), so the same
// argument list, run again, gets NOSCRIPT from the new master and is sent
// whole there, from a new slice: the list stays an EVALSHA of the
// script's digest, and the next run is one EVALSHA at the new master.
func TestClusterFailoverRunsTheSameArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster of six redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 1)
	var mu sync.Mutex
	var sent []nodeSent
	cc := cl.Client(t, recordNodes(&mu, &sent))
	r := newRunner(t, cc, 4)
	ctx := context.Background()
	key := "{failover}"
	a := incr.Args([]string{key}, "v")
	if v, err := r.RunArgs(ctx, incr, a).Text(); err != nil || v != "v#1" {
		t.Fatalf("before the failover: %q, %v", v, err)
	}
	// Replication is asynchronous: a master killed before its replica has
	// the first run's write would hand the promoted replica an empty key
	// (the run after would answer v#1). Wait for the replica to have it.
	old, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := old.Do(ctx, "WAIT", 1, 30_000).Int(); err != nil || n < 1 {
		t.Fatalf("WAIT for the replica of %s: %d, %v", old.Options().Addr, n, err)
	}
	cl.KillMasterOf(t, key)
	// go-redis does not learn of a dead master by itself (its dials are
	// refused, and no MOVED comes): reload as an application would.
	cc.ReloadState(ctx)
	mu.Lock()
	sent = nil
	mu.Unlock()
	var v string
	for try := 0; try < 100; try++ { // the client learns the new topology
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		v, err = r.RunArgs(tctx, incr, a).Text()
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || len(v) < 3 || v[:2] != "v#" || v == "v#1" {
		t.Fatalf("after the failover: %q, %v; want a second run", v, err)
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	promoted := m.Options().Addr
	mu.Lock()
	evals := 0
	for _, s := range sent {
		if s.addr == promoted && s.name == "eval" {
			evals++
		}
	}
	sent = nil
	mu.Unlock()
	if evals == 0 {
		t.Fatalf("no EVAL at the promoted master %s: want the fallback", promoted)
	}
	if a[0] != "evalsha" || a[1] != incr.Hash() {
		t.Fatalf("after the fallback, the list became %v", a[:2])
	}
	if err := r.RunArgs(ctx, incr, a).Err(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []nodeSent{{promoted, key, "evalsha"}}; !reflect.DeepEqual(sent, want) {
		t.Fatalf("the next run sent %v, want %v", sent, want)
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

// TestClusterRedirectsRunTheSameArgs guards the EVALSHA's first key
// position and the EVAL fallback through a slot's migration: while the
// slot migrates, the old master answers ASK for a key it lacks, and the
// importing master, which never loaded the script, answers NOSCRIPT, so
// the fallback goes there too (ASK again); once the slot has moved, the
// old master answers MOVED and the list, run again, is one EVALSHA at the
// new master. The list stays an EVALSHA of the digest throughout.
func TestClusterRedirectsRunTheSameArgs(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	var mu sync.Mutex
	var sent []nodeSent
	cc := cl.Client(t, recordNodes(&mu, &sent))
	r := newRunner(t, cc, 4)
	ctx := context.Background()
	key := "{redirect}"
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redistest.Server
	var masters []*redistest.Server
	for _, n := range cl.Nodes() {
		masters = append(masters, n)
		switch {
		case n.Addr() == m.Options().Addr:
			from = n
		case to == nil:
			to = n
		}
	}
	if from == nil || to == nil {
		t.Fatalf("the key's master %s, or another, not among the nodes", m.Options().Addr)
	}
	fromID, toID := from.Do(t, "CLUSTER", "MYID"), to.Do(t, "CLUSTER", "MYID")
	to.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
	from.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)

	a := incr.Args([]string{key}, "v")
	check := func(what, want string, names ...string) {
		t.Helper()
		v, err := r.RunArgs(ctx, incr, a).Text()
		if err != nil || v != want {
			t.Fatalf("%s: %q, %v; want %q", what, v, err, want)
		}
		if a[0] != "evalsha" || a[1] != incr.Hash() {
			t.Fatalf("%s: the list became %v", what, a[:2])
		}
		mu.Lock()
		defer mu.Unlock()
		var at []string
		for _, s := range sent {
			if s.addr == to.Addr() {
				at = append(at, s.name)
			}
		}
		sent = nil
		if !reflect.DeepEqual(at, names) {
			t.Fatalf("%s: the new master saw %v, want %v", what, at, names)
		}
	}
	check("while the slot migrates (ASK)", "v#1", "evalsha", "eval")

	for _, n := range masters {
		n.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", toID)
	}
	check("once the slot moved (MOVED)", "v#2", "evalsha")
}
