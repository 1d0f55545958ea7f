package bench

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// goroutines is how many goroutines call at once in BenchmarkFloors/64goroutines.
const goroutines = 64

// phaseLen is how long one side runs before the next: long beside a call
// (the calls under way at a change end within a millisecond or two), short
// beside a run (-benchtime 2s holds 100 phases, 25 of each side).
const phaseLen = 20 * time.Millisecond

// BenchmarkFloors compares, on new keys with 100-byte results, idem's Do
// with the raw floors of three clients (go-redis, valkey-go, rueidis; see
// sides_test.go), all on one redis-server that it starts, in turns, so that
// a shared machine's changing load weighs on all four alike.
//
// 64goroutines runs them from 64 goroutines in phases of phaseLen: every
// goroutine makes the calls of the current side; the sides take their turns
// in a new random order every four phases, so that work one side leaves
// behind (garbage collection, the server's housekeeping) falls on each of
// the others alike. It reports, per side, ns/op (the time of its phases
// over its calls: the inverse of its throughput), cli-us/op and srv-us/op
// (the CPU time of its phases per call, of this process and of the
// redis-server), and the throughput ratios valkey/goredis, rueidis/goredis,
// idem/goredis (go-redis's ns/op over the other's: 1 = as fast as the
// go-redis floor) and idem/valkey.
//
// 1goroutine runs them from one goroutine, one call of each per iteration,
// in a new random order each time, timing every call: the latency of one
// call alone. It reports ns/op per side and the same ratios.
func BenchmarkFloors(b *testing.B) {
	addr := redistest.Start(b, redistest.Config{}).Addr()
	b.Run("64goroutines", func(b *testing.B) { inPhases(b, addr) })
	b.Run("1goroutine", func(b *testing.B) { inTurns(b, addr) })
}

// runSides returns the sides' new-key calls on addr, each on keys of its
// own that the run deletes (the keys' handlers are returned too), having
// made every call once from each of n goroutines: their connection pools
// are full before the timer starts.
func runSides(b *testing.B, addr string, n int) (calls [nSides]func() error, keys [nSides]*benchKeys, names [nSides]string) {
	ctx := context.Background()
	p := benchPayload(payloadSize)
	sides := newSides(b, addr, p)
	admin := newGoRedis(b, addr)
	for i, s := range sides {
		ks := newBenchKeys(b, admin, s.record, len(p))
		keys[i], names[i] = ks, s.name
		calls[i] = func() error { return s.call(ctx, ks.next()) }
	}
	var warm sync.WaitGroup
	for range n {
		warm.Go(func() {
			for _, call := range calls {
				if err := call(); err != nil {
					b.Error(err)
				}
			}
		})
	}
	warm.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return calls, keys, names
}

// reportRatios reports the throughput ratios of the sides whose ns/op are
// given.
func reportRatios(b *testing.B, nsOp [nSides]float64) {
	b.ReportMetric(nsOp[goredisSide]/nsOp[valkeySide], "valkey/goredis")
	b.ReportMetric(nsOp[goredisSide]/nsOp[rueidisSide], "rueidis/goredis")
	b.ReportMetric(nsOp[goredisSide]/nsOp[idemSide], "idem/goredis")
	b.ReportMetric(nsOp[valkeySide]/nsOp[idemSide], "idem/valkey")
}

// inPhases is BenchmarkFloors/64goroutines.
func inPhases(b *testing.B, addr string) {
	calls, _, names := runSides(b, addr, goroutines)
	info := newGoRedis(b, addr)
	var (
		phase   atomic.Int32 // the side whose calls run now
		n       [nSides]atomic.Int64
		stop    = make(chan struct{})
		stopped = make(chan struct{})
		// Owned by the goroutine that changes phases until stopped.
		elapsed, cli, server [nSides]time.Duration
		cliOK, srvOK         bool
	)
	rng := rand.New(rand.NewPCG(uint64(benchRuns.Add(1)), 0))
	order := [nSides]int32{goredisSide, valkeySide, rueidisSide, idemSide}
	rng.Shuffle(nSides, func(i, j int) { order[i], order[j] = order[j], order[i] })
	phase.Store(order[0])
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	go func() {
		defer close(stopped)
		t := time.NewTicker(phaseLen)
		defer t.Stop()
		last := time.Now()
		lastCli, ok1 := processCPU()
		lastSrv, ok2 := serverCPU(info)
		cliOK, srvOK = ok1, ok2
		end := func(p int32, now time.Time) {
			c, ok1 := processCPU()
			s, ok2 := serverCPU(info)
			cliOK, srvOK = cliOK && ok1, srvOK && ok2
			elapsed[p] += now.Sub(last)
			cli[p] += c - lastCli
			server[p] += s - lastSrv
			last, lastCli, lastSrv = now, c, s
		}
		pos := 0
		for {
			select {
			case <-stop:
				end(phase.Load(), time.Now())
				return
			case now := <-t.C:
				p := phase.Load()
				if pos++; pos == nSides {
					pos = 0
					rng.Shuffle(nSides, func(i, j int) { order[i], order[j] = order[j], order[i] })
				}
				phase.Store(order[pos])
				end(p, now)
			}
		}
	}()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// A call under way when the phase changes counts for its own.
			p := phase.Load()
			if err := calls[p](); err != nil {
				b.Error(err)
				return
			}
			n[p].Add(1)
		}
	})
	close(stop)
	<-stopped
	b.StopTimer()
	var nsOp [nSides]float64
	for i := range nSides {
		if n[i].Load() == 0 {
			return // too short a run for every side's phase: no figures
		}
		nsOp[i] = float64(elapsed[i].Nanoseconds()) / float64(n[i].Load())
	}
	per := func(d time.Duration, i int) float64 { return float64(d.Nanoseconds()) / float64(n[i].Load()) / 1e3 }
	for i, name := range names {
		b.ReportMetric(nsOp[i], name+"-ns/op")
		if cliOK {
			b.ReportMetric(per(cli[i], i), name+"-cli-us/op")
		}
		if srvOK {
			b.ReportMetric(per(server[i], i), name+"-srv-us/op")
		}
	}
	reportRatios(b, nsOp)
}

// inTurns is BenchmarkFloors/1goroutine.
func inTurns(b *testing.B, addr string) {
	calls, keys, names := runSides(b, addr, 1)
	rng := rand.New(rand.NewPCG(uint64(benchRuns.Add(1)), 0))
	order := [nSides]int{goredisSide, valkeySide, rueidisSide, idemSide}
	var total [nSides]time.Duration
	for b.Loop() {
		rng.Shuffle(nSides, func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			t0 := time.Now()
			if err := calls[i](); err != nil {
				b.Fatal(err)
			}
			total[i] += time.Since(t0)
		}
		for _, ks := range keys {
			if ks.full() {
				b.StopTimer()
				ks.flush()
				b.StartTimer()
			}
		}
	}
	var nsOp [nSides]float64
	for i, name := range names {
		nsOp[i] = float64(total[i].Nanoseconds()) / float64(b.N)
		b.ReportMetric(nsOp[i], name+"-ns/op")
	}
	reportRatios(b, nsOp)
}

// serverCPU is the redis-server's CPU time so far (user and system), from
// INFO cpu.
func serverCPU(rdb *redis.Client) (time.Duration, bool) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), true
}
