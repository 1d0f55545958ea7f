package idem_test

// Benchmarks of Do, each beside a raw baseline in the same run: the least
// a go-redis client of the same kind must send for the same path, as
// minimal scripts. A new key is two EVALSHA (claim, complete); a replay or a
// conflict is one. Names pair them for scripts/bench: BenchmarkX/.../idem
// beside BenchmarkX/.../raw.
//
// The benchmarks run on a redis-server that they start when one is
// installed, else on miniredis. They measure and report; they never assert
// a timing.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The raw baseline's scripts: as little as each step must do.
var (
	// rawClaim takes a key if nobody has: a small hash and its TTL.
	rawClaim = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], 'own', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'st', 'p')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)
	// rawComplete stores a result and wakes whoever listens.
	rawComplete = redis.NewScript(`
redis.call('HSET', KEYS[1], 'st', 'd', 'res', ARGV[1])
redis.call('PUBLISH', KEYS[2], 'd')
return 1`)
	// rawReplay returns a stored result.
	rawReplay = redis.NewScript(`return redis.call('HGET', KEYS[1], 'res')`)
	// rawConflict compares a stored fingerprint.
	rawConflict = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then return 0 end
return 1`)
)

const (
	benchFingerprint = "account=42&amount=100"
	benchRetention   = 24 * time.Hour // idem's default, for the raw TTL too
)

var resultSizes = []struct {
	name string
	n    int
}{
	{"100B", 100},
	{"10KiB", 10 << 10},
	{"1MiB", 1 << 20}, // the default WithMaxResultSize
}

var (
	benchRuns    atomic.Int64 // makes the keys of every benchmark run unique
	benchLogOnce sync.Once
)

// benchServer is the Redis a benchmark runs on.
type benchServer struct {
	addr string
	real bool // a redis-server process, not miniredis in this process
}

// benchRedis returns the Redis a benchmark runs on: a redis-server started
// for it (and stopped at its end) when one is installed or
// IDEM_REQUIRE_REDIS=1, else miniredis.
func benchRedis(b *testing.B) benchServer {
	b.Helper()
	_, err := exec.LookPath("redis-server")
	if err == nil || os.Getenv(redistest.RequireEnv) == "1" {
		addr := redistest.Start(b, redistest.Config{}).Addr()
		benchLogOnce.Do(func() { b.Logf("benchmarks run on redis-server at %s", addr) })
		return benchServer{addr: addr, real: true}
	}
	benchLogOnce.Do(func() { b.Logf("redis-server not found: benchmarks run on miniredis") })
	return benchServer{addr: miniredis.RunT(b).Addr()}
}

// startCPU starts measuring the CPU per op of the benchmark's process and
// of the server srv (see benchrun.Meter).
func startCPU(b *testing.B, srv benchServer) *benchrun.Meter {
	var server *redis.Client
	if srv.real {
		server = benchClient(b, srv.addr)
	}
	return benchrun.StartMeter(b, server)
}

// benchClient returns a go-redis client with default options, closed when
// the benchmark ends. idem and the raw baseline each get their own.
func benchClient(b *testing.B, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func benchIdem(b *testing.B, addr string, opts ...idem.Option) *idem.Client {
	c := idem.New(benchClient(b, addr), opts...)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// benchResultFn returns an fn that returns p.
func benchResultFn(p []byte) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) { return p, nil }
}

// rawKey is the raw baseline's record key, built as idem builds its own.
func rawKey(key string) string { return "raw:{" + key + "}" }

// rawNewKey is the raw floor of a new key: two EVALSHA.
func rawNewKey(ctx context.Context, rdb *redis.Client, key, token string, result []byte) error {
	rk := rawKey(key)
	won, err := rawClaim.Run(ctx, rdb, []string{rk}, token, benchRetention.Milliseconds()).Int64()
	if err != nil {
		return err
	}
	if won != 1 {
		return fmt.Errorf("raw claim of %q: not won", key)
	}
	return rawComplete.Run(ctx, rdb, []string{rk, rk + ":done"}, result).Err()
}

const rawToken = "0123456789abcdef" // as long as idem's owner token

// idemReplay replays key through c and fails b unless it gets n bytes.
func idemReplay(b *testing.B, ctx context.Context, c *idem.Client, key string, fn func(context.Context) ([]byte, error), n int) {
	if res, err := c.Do(ctx, key, benchFingerprint, fn); err != nil || len(res) != n {
		b.Fatalf("got %d bytes, %v; want %d bytes", len(res), err, n)
	}
}

// rawReplayCall is the raw replay of the record rk, which must hold n bytes.
func rawReplayCall(b *testing.B, ctx context.Context, rdb *redis.Client, rk []string, n int) {
	if res, err := rawReplay.Run(ctx, rdb, rk).Text(); err != nil || len(res) != n {
		b.Fatalf("got %d bytes, %v; want %d bytes", len(res), err, n)
	}
}

// idemConflict calls key through c with other parameters than it was done
// with, and fails b unless that is ErrConflict.
func idemConflict(b *testing.B, ctx context.Context, c *idem.Client, key string, fn func(context.Context) ([]byte, error)) {
	if _, err := c.Do(ctx, key, "other parameters", fn); !errors.Is(err, idem.ErrConflict) {
		b.Fatalf("got %v, want ErrConflict", err)
	}
}

// rawConflictRecord stores the raw baseline's done record rk, result p.
func rawConflictRecord(b *testing.B, ctx context.Context, rdb *redis.Client, rk string, p []byte) {
	if err := rdb.HSet(ctx, rk, "fp", benchFingerprint, "res", p).Err(); err != nil {
		b.Fatal(err)
	}
}

// rawConflictCall is the raw conflict check of the record rk.
func rawConflictCall(b *testing.B, ctx context.Context, rdb *redis.Client, rk []string) {
	if same, err := rawConflict.Run(ctx, rdb, rk, "other parameters").Int64(); err != nil || same != 0 {
		b.Fatalf("got %d, %v; want 0", same, err)
	}
}

func BenchmarkNewKey(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	ctx := context.Background()
	for _, size := range resultSizes {
		p := benchrun.Payload(size.n)
		b.Run(size.name+"/idem", func(b *testing.B) {
			c := benchIdem(b, addr)
			ks := benchrun.NewKeys(b, benchClient(b, addr), func(k string) string { return idem.RecordKey(c, k) }, size.n)
			fn := benchResultFn(p)
			if _, err := c.Do(ctx, ks.Next(), benchFingerprint, fn); err != nil { // caches the scripts
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := startCPU(b, srv)
			for b.Loop() {
				if _, err := c.Do(ctx, ks.Next(), benchFingerprint, fn); err != nil {
					b.Fatal(err)
				}
				ks.MaybeFlush(b)
			}
			cpu.Stop(b.N)
		})
		b.Run(size.name+"/raw", func(b *testing.B) {
			rdb := benchClient(b, addr)
			ks := benchrun.NewKeys(b, rdb, rawKey, size.n)
			if err := rawNewKey(ctx, rdb, ks.Next(), rawToken, p); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := startCPU(b, srv)
			for b.Loop() {
				if err := rawNewKey(ctx, rdb, ks.Next(), rawToken, p); err != nil {
					b.Fatal(err)
				}
				ks.MaybeFlush(b)
			}
			cpu.Stop(b.N)
		})
	}
}

func BenchmarkReplay(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	ctx := context.Background()
	for _, size := range resultSizes {
		p := benchrun.Payload(size.n)
		key := fmt.Sprint("replay-", size.name)
		b.Run(size.name+"/idem", func(b *testing.B) {
			c := benchIdem(b, addr)
			fn := benchResultFn(p)
			if _, err := c.Do(ctx, key, benchFingerprint, fn); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := startCPU(b, srv)
			for b.Loop() {
				idemReplay(b, ctx, c, key, fn, len(p))
			}
			cpu.Stop(b.N)
		})
		b.Run(size.name+"/raw", func(b *testing.B) {
			rdb := benchClient(b, addr)
			// A key of its own: -count runs this function again on the
			// same server, and the raw claim takes a key only once.
			key := fmt.Sprint(key, "-", benchRuns.Add(1))
			rk := []string{rawKey(key)}
			if err := rawNewKey(ctx, rdb, key, rawToken, p); err != nil {
				b.Fatal(err)
			}
			if err := rawReplay.Run(ctx, rdb, rk).Err(); err != nil { // caches the script
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := startCPU(b, srv)
			for b.Loop() {
				rawReplayCall(b, ctx, rdb, rk, len(p))
			}
			cpu.Stop(b.N)
		})
	}
}

func BenchmarkConflict(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	ctx := context.Background()
	p := benchrun.Payload(100)
	b.Run("idem", func(b *testing.B) {
		c := benchIdem(b, addr)
		fn := benchResultFn(p)
		if _, err := c.Do(ctx, "conflict", benchFingerprint, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		cpu := startCPU(b, srv)
		for b.Loop() {
			idemConflict(b, ctx, c, "conflict", fn)
		}
		cpu.Stop(b.N)
	})
	b.Run("raw", func(b *testing.B) {
		rdb := benchClient(b, addr)
		rk := []string{rawKey("conflict")}
		rawConflictRecord(b, ctx, rdb, rk[0], p)
		if err := rawConflict.Run(ctx, rdb, rk, benchFingerprint).Err(); err != nil { // caches the script
			b.Fatal(err)
		}
		b.ReportAllocs()
		cpu := startCPU(b, srv)
		for b.Loop() {
			rawConflictCall(b, ctx, rdb, rk)
		}
		cpu.Stop(b.N)
	})
}

// BenchmarkPaired runs each sequential path of idem and its raw baseline in
// turns, one call of each per iteration (which goes first alternates),
// through one go-redis client, timing every call: load that comes and goes
// on a shared machine then weighs on both alike, so raw/idem (the raw
// calls' total time over idem's) compares them more closely than separate
// runs can. It reports idem-ns/op, raw-ns/op and raw/idem; ns/op is a
// pair's. Allocations and CPU are the separate benchmarks' (BenchmarkNewKey,
// BenchmarkReplay, BenchmarkConflict). NewKeyParallel runs new keys from
// many goroutines in phases, idem's and the baseline's in turns (see
// pairedParallel), and reports the CPU of each too.
func BenchmarkPaired(b *testing.B) {
	srv := benchRedis(b)
	ctx := context.Background()
	paired := func(b *testing.B, idemCall, rawCall func(), after func()) {
		var idemTime, rawTime time.Duration
		timed := func(call func(), total *time.Duration) {
			t0 := time.Now()
			call()
			*total += time.Since(t0)
		}
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				timed(idemCall, &idemTime)
				timed(rawCall, &rawTime)
			} else {
				timed(rawCall, &rawTime)
				timed(idemCall, &idemTime)
			}
			i++
			after()
		}
		b.ReportMetric(float64(idemTime.Nanoseconds())/float64(b.N), "idem-ns/op")
		b.ReportMetric(float64(rawTime.Nanoseconds())/float64(b.N), "raw-ns/op")
		b.ReportMetric(float64(rawTime)/float64(idemTime), "raw/idem")
	}
	for _, size := range resultSizes {
		p := benchrun.Payload(size.n)
		b.Run("NewKey/"+size.name, func(b *testing.B) {
			calls, flush := pairedNewKeys(b, srv, p)
			must := func(call func() error) func() {
				return func() {
					if err := call(); err != nil {
						b.Fatal(err)
					}
				}
			}
			paired(b, must(calls[0]), must(calls[1]), flush)
		})
	}
	for _, size := range resultSizes {
		p := benchrun.Payload(size.n)
		b.Run("Replay/"+size.name, func(b *testing.B) {
			rdb := benchClient(b, srv.addr)
			c := idem.New(rdb)
			b.Cleanup(func() { _ = c.Close() })
			key := fmt.Sprint("paired-replay-", benchRuns.Add(1))
			fn := benchResultFn(p)
			if _, err := c.Do(ctx, key, benchFingerprint, fn); err != nil {
				b.Fatal(err)
			}
			if err := rawNewKey(ctx, rdb, key, rawToken, p); err != nil {
				b.Fatal(err)
			}
			rk := []string{rawKey(key)}
			paired(b, func() { idemReplay(b, ctx, c, key, fn, len(p)) },
				func() { rawReplayCall(b, ctx, rdb, rk, len(p)) }, func() {})
		})
	}
	b.Run("Conflict", func(b *testing.B) {
		rdb := benchClient(b, srv.addr)
		c := idem.New(rdb)
		b.Cleanup(func() { _ = c.Close() })
		key := fmt.Sprint("paired-conflict-", benchRuns.Add(1))
		p := benchrun.Payload(100)
		fn := benchResultFn(p)
		if _, err := c.Do(ctx, key, benchFingerprint, fn); err != nil {
			b.Fatal(err)
		}
		rk := []string{rawKey(key)}
		rawConflictRecord(b, ctx, rdb, rk[0], p)
		paired(b, func() { idemConflict(b, ctx, c, key, fn) },
			func() { rawConflictCall(b, ctx, rdb, rk) }, func() {})
	})
	b.Run("NewKeyParallel", func(b *testing.B) {
		calls, _ := pairedNewKeys(b, srv, benchrun.Payload(100))
		pairedParallel(b, srv, calls, 8)
	})
	// 64 goroutines on this 2-core machine: a busy service.
	b.Run("NewKeyParallel64", func(b *testing.B) {
		calls, _ := pairedNewKeys(b, srv, benchrun.Payload(100))
		pairedParallel(b, srv, calls, max(1, 64/runtime.GOMAXPROCS(0)))
	})
}

// pairedNewKeys returns the new-key calls, with result p, of idem
// (calls[0]) and of the raw baseline (calls[1]), through one go-redis
// client and each on keys of its own, having made each once to cache the
// scripts; flush deletes their records once they hold benchrun.FlushBytes (not for
// parallel use; the run's end deletes them all).
func pairedNewKeys(b *testing.B, srv benchServer, p []byte) (calls [2]func() error, flush func()) {
	ctx := context.Background()
	rdb := benchClient(b, srv.addr)
	c := idem.New(rdb)
	b.Cleanup(func() { _ = c.Close() })
	iks := benchrun.NewKeys(b, rdb, func(k string) string { return idem.RecordKey(c, k) }, len(p))
	rks := benchrun.NewKeys(b, rdb, rawKey, len(p))
	fn := benchResultFn(p)
	calls = [2]func() error{
		func() error { _, err := c.Do(ctx, iks.Next(), benchFingerprint, fn); return err },
		func() error { return rawNewKey(ctx, rdb, rks.Next(), rawToken, p) },
	}
	for _, call := range calls {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	return calls, func() { iks.MaybeFlush(b); rks.MaybeFlush(b) }
}

// pairedParallel runs calls[0] (idem's) and calls[1] (the baseline's) from
// perCPU goroutines per CPU in phases (see benchrun.Phases), which take
// turns in an order drawn anew every round, and reports, beside each
// one's ns/op and CPU per call, raw/idem: the ratio of their throughputs.
func pairedParallel(b *testing.B, srv benchServer, calls [2]func() error, perCPU int) {
	var server *redis.Client
	if srv.real {
		server = benchClient(b, srv.addr)
	}
	rng := rand.New(rand.NewPCG(uint64(benchRuns.Add(1)), 0))
	sides := []benchrun.Side{{Name: "idem", Call: calls[0]}, {Name: "raw", Call: calls[1]}}
	if nsOp := benchrun.Phases(b, sides, perCPU, server, rng); nsOp != nil {
		b.ReportMetric(nsOp[1]/nsOp[0], "raw/idem")
	}
}

// BenchmarkScripts measures what the server spends in the scripts of a new
// key (claim, then complete, with a 100-byte result), idem's beside the
// raw baseline's, without the client: the scripts go in pipelines of 100
// keys, idem's and the baseline's in turns, and the server's own count of
// the time in EVALSHA (INFO commandstats) gives idem-script-us/op and
// raw-script-us/op, which the round trips and the client do not blur, and
// raw/idem. One op is one key.
func BenchmarkScripts(b *testing.B) {
	srv := benchRedis(b)
	if !srv.real {
		b.Skip("needs a redis-server: miniredis keeps no command statistics")
	}
	ctx := context.Background()
	p := benchrun.Payload(100)
	const batch = 100
	rdb := benchClient(b, srv.addr)
	c := benchIdem(b, srv.addr)
	type side struct {
		claim, complete *redis.Script
		args            func() (claim, complete []any)
		ks              *benchrun.Keys
		usec, calls     float64
	}
	sides := [2]*side{
		{
			claim:    redis.NewScript(idem.ScriptSource("claim")),
			complete: redis.NewScript(idem.ScriptSource("complete")),
			args: func() (claim, complete []any) {
				return idem.NewKeyArgs(c, benchFingerprint, rawToken, p)
			},
		},
		{
			claim: rawClaim, complete: rawComplete,
			args: func() (claim, complete []any) {
				return []any{rawToken, benchRetention.Milliseconds()}, []any{p}
			},
		},
	}
	for _, sd := range sides {
		sd.ks = benchrun.NewKeys(b, rdb, rawKey, len(p))
		for _, s := range []*redis.Script{sd.claim, sd.complete} {
			if err := s.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
	pipeline := func(sd *side, send func(pipe redis.Pipeliner)) {
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		pipe := rdb.Pipeline()
		send(pipe)
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, cmd := range cmds {
			if v, _ := cmd.(*redis.Cmd).Result(); v == int64(0) || v == nil {
				b.Fatalf("a script answered %v", v)
			}
		}
		u, n := evalshaStats(b, rdb)
		sd.usec, sd.calls = sd.usec+u, sd.calls+n
	}
	i := 0
	for b.Loop() {
		for j := range sides {
			sd := sides[(i+j)%2] // which side goes first alternates
			b.StopTimer()
			rks, cargs, pargs := make([]string, batch), make([][]any, batch), make([][]any, batch)
			for k := range rks {
				rks[k] = rawKey(sd.ks.Next())
				cargs[k], pargs[k] = sd.args()
			}
			b.StartTimer()
			pipeline(sd, func(pipe redis.Pipeliner) {
				for k, rk := range rks {
					pipe.EvalSha(ctx, sd.claim.Hash(), []string{rk}, cargs[k]...)
				}
			})
			pipeline(sd, func(pipe redis.Pipeliner) {
				for k, rk := range rks {
					pipe.EvalSha(ctx, sd.complete.Hash(), []string{rk, rk + ":done"}, pargs[k]...)
				}
			})
			sd.ks.MaybeFlush(b)
		}
		i++
	}
	for _, sd := range sides {
		if sd.calls != float64(2*batch*b.N) {
			b.Fatalf("the server counted %v script calls, want %d", sd.calls, 2*batch*b.N)
		}
	}
	idemUs, rawUs := sides[0].usec/float64(batch*b.N), sides[1].usec/float64(batch*b.N)
	b.ReportMetric(idemUs, "idem-script-us/op")
	b.ReportMetric(rawUs, "raw-script-us/op")
	b.ReportMetric(rawUs/idemUs, "raw/idem")
}

// evalshaStats reads the time the server spent in EVALSHA (µs) and the
// number of calls, from INFO commandstats, since the last CONFIG RESETSTAT.
func evalshaStats(b *testing.B, rdb *redis.Client) (usec, calls float64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = f
			case "usec":
				usec = f
			}
		}
	}
	return usec, calls
}

// BenchmarkNewKeyParallel runs new keys with 100-byte results from 8
// goroutines per CPU, as a busy service does.
func BenchmarkNewKeyParallel(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	ctx := context.Background()
	p := benchrun.Payload(100)
	const perCPU = 8
	b.Run("idem", func(b *testing.B) {
		c := benchIdem(b, addr)
		ks := benchrun.NewKeys(b, benchClient(b, addr), func(k string) string { return idem.RecordKey(c, k) }, len(p))
		fn := benchResultFn(p)
		if _, err := c.Do(ctx, ks.Next(), benchFingerprint, fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.SetParallelism(perCPU)
		cpu := startCPU(b, srv)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Do(ctx, ks.Next(), benchFingerprint, fn); err != nil {
					b.Error(err)
					return
				}
			}
		})
		cpu.Stop(b.N)
	})
	b.Run("raw", func(b *testing.B) {
		rdb := benchClient(b, addr)
		ks := benchrun.NewKeys(b, rdb, rawKey, len(p))
		if err := rawNewKey(ctx, rdb, ks.Next(), rawToken, p); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.SetParallelism(perCPU)
		cpu := startCPU(b, srv)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := rawNewKey(ctx, rdb, ks.Next(), rawToken, p); err != nil {
					b.Error(err)
					return
				}
			}
		})
		cpu.Stop(b.N)
	})
}

// BenchmarkHotKey sends each new key from 32 callers at once, half through
// each of two Clients (two service instances); fn takes a millisecond, so
// the duplicates wait and are woken. One op is one key, all 32 answered.
//
// The raw baseline is the same 32 callers each sending one claim EVALSHA;
// the winner runs fn and sends the completion, and the others learn the
// outcome in-process for free: a wake-up that costs nothing.
func BenchmarkHotKey(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	ctx := context.Background()
	p := benchrun.Payload(100)
	const (
		callers = 32
		work    = time.Millisecond
	)
	b.Run("idem", func(b *testing.B) {
		cs := [2]*idem.Client{benchIdem(b, addr), benchIdem(b, addr)}
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			runs.Add(1)
			time.Sleep(work)
			return p, nil
		}
		prefix := fmt.Sprint("hot", benchRuns.Add(1), ":")
		var keys int
		one := func() {
			key := prefix + strconv.Itoa(keys)
			keys++
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					if res, err := cs[i%2].Do(ctx, key, benchFingerprint, fn); err != nil || len(res) != len(p) {
						b.Errorf("got %d bytes, %v; want %d bytes", len(res), err, len(p))
					}
				})
			}
			wg.Wait()
		}
		one()
		b.ReportAllocs()
		cpu := startCPU(b, srv)
		for b.Loop() {
			one()
		}
		cpu.Stop(b.N)
		if n := runs.Load(); n != int64(keys) {
			b.Fatalf("fn ran %d times for %d keys", n, keys)
		}
	})
	b.Run("raw", func(b *testing.B) {
		rdbs := [2]*redis.Client{benchClient(b, addr), benchClient(b, addr)}
		tokens := make([]string, callers)
		for i := range tokens {
			tokens[i] = fmt.Sprintf("%016d", i)
		}
		prefix := fmt.Sprint("hot", benchRuns.Add(1), ":")
		var keys int
		one := func() {
			rk := rawKey(prefix + strconv.Itoa(keys))
			keys++
			done := make(chan struct{})
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					rdb := rdbs[i%2]
					won, err := rawClaim.Run(ctx, rdb, []string{rk}, tokens[i], benchRetention.Milliseconds()).Int64()
					if err != nil {
						b.Error(err)
						return
					}
					if won == 0 {
						<-done
						return
					}
					defer close(done)
					time.Sleep(work)
					if err := rawComplete.Run(ctx, rdb, []string{rk, rk + ":done"}, p).Err(); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
		}
		one()
		b.ReportAllocs()
		cpu := startCPU(b, srv)
		for b.Loop() {
			one()
		}
		cpu.Stop(b.N)
	})
}

// BenchmarkWakeup measures how soon waiters return after the owner's
// outcome is recorded: from the owner's Do returning to each waiter's Do
// returning, as p50 and p99 over all waiters of all rounds (0 for a waiter
// that returned first: the notification can come before the reply of the
// owner's completion); and, as fn-p50-ms and fn-p99-ms, from the owner's
// fn returning, which counts the recording of the outcome too (ns/op, the
// time of a whole round, is not reported). A round has 1,000 waiters on
// one Client and their owners on another (two service instances, so the
// wake-up goes through Redis): on one key, where one waiter asks Redis and
// the rest share its wait in-process, or on 1,000 keys, one waiter each.
// The owners complete together, 200ms after the waiters started waiting.
// "pubsub" is the default; "poll" disables pub/sub on both Clients, so
// waiters find the outcome by polling alone.
func BenchmarkWakeup(b *testing.B) {
	srv := benchRedis(b)
	addr := srv.addr
	const waiters = 1000
	for _, keys := range []int{1, waiters} {
		for _, mode := range []string{"pubsub", "poll"} {
			name := fmt.Sprintf("%dkey/%s", keys, mode)
			if keys > 1 {
				name = fmt.Sprintf("%dkeys/%s", keys, mode)
			}
			b.Run(name, func(b *testing.B) {
				owner := benchIdem(b, addr)
				waiter, wctr := countedIdem(b, benchClient(b, addr), idem.WithWait(time.Minute))
				if mode == "poll" {
					idem.PollOnly(owner)
					idem.PollOnly(waiter)
				}
				var lat, fnLat []time.Duration
				b.ReportAllocs()
				for b.Loop() {
					l, fl := wakeRound(b, owner, waiter, wctr, keys, waiters, mode == "pubsub")
					lat, fnLat = append(lat, l...), append(fnLat, fl...)
				}
				pct := func(lat []time.Duration, p float64) float64 {
					slices.Sort(lat)
					return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
				}
				b.ReportMetric(pct(lat, 0.50), "p50-ms")
				b.ReportMetric(pct(lat, 0.99), "p99-ms")
				b.ReportMetric(pct(fnLat, 0.50), "fn-p50-ms")
				b.ReportMetric(pct(fnLat, 0.99), "fn-p99-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// wakeHold is how long the owners of a wake-up round hold their keys after
// the waiters have started waiting: long enough that they wait as they do
// in steady state, their polling backed off.
const wakeHold = 200 * time.Millisecond

// wakeRound runs one round of BenchmarkWakeup and returns each waiter's
// latency from its owner's Do returning, and from its owner's fn
// returning.
func wakeRound(b *testing.B, owner, waiter *idem.Client, wctr *cmdCounter, keys, waiters int, pubsub bool) (lat, fnLat []time.Duration) {
	ctx := context.Background()
	prefix := fmt.Sprint("wake", benchRuns.Add(1), ":")
	p := benchrun.Payload(100)

	release := make(chan struct{})
	started := make(chan struct{}, keys)
	ownerDone := make([]time.Time, keys)
	fnDone := make([]time.Time, keys)
	var owners sync.WaitGroup
	for k := range keys {
		owners.Go(func() {
			_, err := owner.Do(ctx, prefix+strconv.Itoa(k), benchFingerprint, func(context.Context) ([]byte, error) {
				started <- struct{}{}
				<-release
				fnDone[k] = time.Now()
				return p, nil
			})
			ownerDone[k] = time.Now()
			if err != nil {
				b.Error(err)
			}
		})
	}
	for range keys {
		<-started
	}

	before := wctr.snapshot()
	returned := make([]time.Time, waiters)
	var ws sync.WaitGroup
	for i := range waiters {
		ws.Go(func() {
			res, err := waiter.Do(ctx, prefix+strconv.Itoa(i%keys), benchFingerprint, func(context.Context) ([]byte, error) {
				return nil, errors.New("a waiter ran fn")
			})
			returned[i] = time.Now()
			if err != nil || len(res) != len(p) {
				b.Errorf("waiter: got %d bytes, %v; want the owner's %d", len(res), err, len(p))
			}
		})
	}
	// Every key's first waiter has seen its owner busy (and, with pub/sub,
	// subscribed); the hold lets the others join and everyone settle.
	idemtest.Eventually(b, time.Minute, "the waiters' claims", func() bool {
		return wctr.snapshot().since(before).cmds["evalsha claim"] >= keys &&
			(!pubsub || idem.Subscribed(waiter) == keys)
	})
	time.Sleep(wakeHold)
	close(release)
	owners.Wait()
	ws.Wait()

	lat, fnLat = make([]time.Duration, waiters), make([]time.Duration, waiters)
	for i, t := range returned {
		// A waiter can be woken by the notification before the owner has
		// read the reply of its completion.
		lat[i] = max(t.Sub(ownerDone[i%keys]), 0)
		fnLat[i] = t.Sub(fnDone[i%keys])
	}
	return lat, fnLat
}
