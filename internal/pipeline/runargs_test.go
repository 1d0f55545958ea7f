package pipeline_test

// Tests of the commands that Run and RunArgs send: the same as go-redis's
// Script.Run and Pipeliner.EvalSha would, and an argument list that a run
// never changes once a pipeline may read it.

import (
	"context"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

// scriptHook is a go-redis hook that hands each script's command sent,
// alone or in a pipeline, to its function before it goes.
type scriptHook func(cmd redis.Cmder)

func (f scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			f(cmd)
		}
		return next(ctx, cmd)
	}
}

func (f scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) {
				f(cmd)
			}
		}
		return next(ctx, cmds)
	}
}

// recorder records the scripts' commands that a go-redis client sends, in
// order: each as a copy of its arguments when sent, and the command itself,
// whose Args may be read again later. Its hook is scriptHook(r.add).
type recorder struct {
	mu   sync.Mutex
	sent [][]any       // guarded by mu; each command's arguments, copied when sent
	cmds []redis.Cmder // guarded by mu; the commands
}

func (r *recorder) add(cmd redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, append([]any(nil), cmd.Args()...))
	r.cmds = append(r.cmds, cmd)
}

// take returns what was recorded, and forgets it.
func (r *recorder) take() (sent [][]any, cmds []redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sent, cmds = r.sent, r.cmds
	r.sent, r.cmds = nil, nil
	return sent, cmds
}

// goRedisArgs returns the arguments of go-redis's own EVALSHA (sha) or
// EVAL of s, as a pipeline queues it (nothing is sent).
func goRedisArgs(rdb *redis.Client, s pipeline.Script, sha bool, keys []string, args ...any) []any {
	pipe := rdb.Pipeline()
	defer pipe.Discard()
	if sha {
		return pipe.EvalSha(context.Background(), s.Hash(), keys, args...).Args()
	}
	return pipe.Eval(context.Background(), s.Src, keys, args...).Args()
}

// TestRunSendsGoRedisCommands guards the claim that hooks see the same
// commands as go-redis's Script.Run, from Run's arguments and from a
// list laid out for RunArgs: an EVALSHA of the script's digest
// with the number of keys, the keys, then the arguments; after a NOSCRIPT,
// an EVAL of its source with the same arguments. It would fail if
// Script.Args or the command a run builds laid them out otherwise (say,
// the source in an EVALSHA, "evalsha" kept in the fallback, a key or an
// argument lost or moved).
func TestRunSendsGoRedisCommands(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		rec := &recorder{}
		rdb := newClient(t, addr, nil)
		rdb.AddHook(scriptHook(rec.add))
		ctx := context.Background()
		keys := []string{"k1", "k2"}
		args := []any{"a", 7, []byte("b")}
		sha := goRedisArgs(rdb, incr, true, keys, args...)
		eval := goRedisArgs(rdb, incr, false, keys, args...)
		for _, max := range []int{0, 4} { // every script alone; alone in a Runner with pipelines
			r := newRunner(t, rdb, max)
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			rec.take()
			if err := r.Run(ctx, incr, keys, args...).Err(); err != nil {
				t.Fatalf("max %d: %v", max, err)
			}
			// Laid out by hand, as idem's calls do: RunArgs fills the
			// first two places.
			a := append([]any{nil, nil, len(keys), keys[0], keys[1]}, args...)
			if err := r.RunArgs(ctx, incr, a).Err(); err != nil {
				t.Fatalf("max %d: RunArgs: %v", max, err)
			}
			sent, _ := rec.take()
			if want := [][]any{sha, eval, sha}; !reflect.DeepEqual(sent, want) {
				t.Fatalf("max %d: sent\n%v\nwant (a NOSCRIPT, its EVAL, then the cached script)\n%v", max, sent, want)
			}
		}
	})
}

// TestPipelineSendsGoRedisCommands is TestRunSendsGoRedisCommands for
// queued calls, which go in one pipeline of EVALSHAs, and after a NOSCRIPT
// in a second one of EVALs.
func TestPipelineSendsGoRedisCommands(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		h := newHooks()
		rec := &recorder{}
		rdb := newClient(t, addr, h)
		rdb.AddHook(scriptHook(rec.add))
		r := newRunner(t, rdb, 1)
		r.SetSlow(time.Hour)
		ctx := context.Background()
		if err := r.Run(ctx, incr, []string{"cache"}, "x").Err(); err != nil { // caches the script
			t.Fatal(err)
		}
		rec.take()
		keys := []string{"a", "b"}
		first, outs, release := queueBehindHeld(t, r, h, keys)
		flushWhilePiped(t, rdb, h, first, release)
		for i, out := range outs {
			if res := recv(t, out); res.err != nil || res.val != keys[i]+"#1" {
				t.Fatalf("call %s: %q, %v", keys[i], res.val, res.err)
			}
		}
		sent, _ := rec.take()
		if len(sent) == 5 {
			// The queued calls' order in a pipeline is theirs in the queue.
			for _, p := range [][][]any{sent[1:3], sent[3:5]} {
				sort.Slice(p, func(i, j int) bool { return p[i][3].(string) < p[j][3].(string) })
			}
		}
		want := [][]any{goRedisArgs(rdb, incr, true, []string{"held"}, "held")}
		for _, sha := range []bool{true, false} {
			for _, k := range keys {
				want = append(want, goRedisArgs(rdb, incr, sha, []string{k}, k))
			}
		}
		if !reflect.DeepEqual(sent, want) {
			t.Fatalf("sent\n%v\nwant (the held call, the pipeline of EVALSHAs, that of EVALs)\n%v", sent, want)
		}
	})
}

// TestNoScriptLeavesArgsAnEvalSha guards the claim that the EVAL fallback
// goes in a new slice: the EVALSHA's command, which a pipeline a caller
// gave up on may still read, keeps its arguments, and the next run of the
// same arguments is an EVALSHA again. It would fail if the fallback wrote
// "eval" and the source into the caller's list, alone or in a pipeline:
// every later run would then send the whole source.
func TestNoScriptLeavesArgsAnEvalSha(t *testing.T) {
	eachServer(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		check := func(t *testing.T, rec *recorder, a []any, what string) {
			t.Helper()
			sent, cmds := rec.take()
			var names []any
			for _, s := range sent {
				names = append(names, s[0])
			}
			if want := []any{"evalsha", "eval", "evalsha"}; !reflect.DeepEqual(names, want) {
				t.Fatalf("%s: sent %v, want %v (the fallback once, then the cached script)", what, names, want)
			}
			if got := cmds[0].Args(); got[0] != "evalsha" || got[1] != incr.Hash() {
				t.Fatalf("%s: the NOSCRIPT EVALSHA's arguments became %v", what, got[:2])
			}
			if a[0] != "evalsha" || a[1] != incr.Hash() {
				t.Fatalf("%s: the caller's arguments became %v", what, a[:2])
			}
		}

		t.Run("alone", func(t *testing.T) {
			rec := &recorder{}
			rdb := newClient(t, addr, nil)
			rdb.AddHook(scriptHook(rec.add))
			r := newRunner(t, rdb, 4)
			a := incr.Args([]string{"alone"}, "x")
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if v, err := r.RunArgs(ctx, incr, a).Text(); err != nil || v != "x#"+strconv.Itoa(i+1) {
					t.Fatalf("run %d: %q, %v", i, v, err)
				}
			}
			check(t, rec, a, "alone")
		})

		t.Run("pipelined", func(t *testing.T) {
			h := newHooks()
			rec := &recorder{}
			rdb := newClient(t, addr, h)
			rdb.AddHook(scriptHook(rec.add))
			r := newRunner(t, rdb, 1)
			r.SetSlow(time.Hour)
			a := incr.Args([]string{"piped"}, "y")
			first, outs, release := queueBehindHeld(t, r, h, []string{"other"})
			out := make(chan result, 1)
			go func() {
				v, err := r.RunArgs(ctx, incr, a).Text()
				out <- result{v, err}
			}()
			deadline := time.Now().Add(wait)
			for r.Queued() != 2 {
				if time.Now().After(deadline) {
					t.Fatalf("%d calls queued, want 2", r.Queued())
				}
				time.Sleep(time.Millisecond)
			}
			flushWhilePiped(t, rdb, h, first, release)
			recv(t, outs[0])
			if res := recv(t, out); res.err != nil || res.val != "y#1" {
				t.Fatalf("the pipelined call: %q, %v", res.val, res.err)
			}
			if v, err := r.RunArgs(ctx, incr, a).Text(); err != nil || v != "y#2" {
				t.Fatalf("a run after the fallback: %q, %v", v, err)
			}
			sent, cmds := rec.take()
			var names []any
			for _, s := range sent {
				names = append(names, s[0])
			}
			// The held call; the pipeline of EVALSHAs, of EVALs; a's again.
			want := []any{"evalsha", "evalsha", "evalsha", "eval", "eval", "evalsha"}
			if !reflect.DeepEqual(names, want) {
				t.Fatalf("sent %v, want %v", names, want)
			}
			if got := cmds[2].Args(); got[0] != "evalsha" || got[1] != incr.Hash() {
				t.Fatalf("the pipelined NOSCRIPT EVALSHA's arguments became %v", got[:2])
			}
			if a[0] != "evalsha" || a[1] != incr.Hash() {
				t.Fatalf("the caller's arguments became %v", a[:2])
			}
		})
	})
}
