package bench

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/redistest"
)

// goroutines is how many goroutines call at once in BenchmarkFloors/64goroutines.
const goroutines = 64

// BenchmarkFloors compares, on new keys with 100-byte results, idem's Do
// with the raw floors of three clients (go-redis, valkey-go, rueidis) and
// of idem's own pipelines on go-redis (see sides_test.go), all on one
// redis-server that it starts, in turns, so that a shared machine's
// changing load weighs on all five alike.
//
// 64goroutines runs them from 64 goroutines in phases of benchrun.PhaseLen: every
// goroutine makes the calls of the current side; the sides take their turns
// in a new random order every four phases, so that work one side leaves
// behind (garbage collection, the server's housekeeping) falls on each of
// the others alike. It reports, per side, ns/op (the time of its phases
// over its calls: the inverse of its throughput), cli-us/op and srv-us/op
// (the CPU time of its phases per call, of this process and of the
// redis-server), and the throughput ratios valkey/goredis, rueidis/goredis,
// pipelined/goredis, idem/goredis (go-redis's ns/op over the other's: 1 =
// as fast as the go-redis floor), idem/valkey, pipelined/valkey (the
// transport's own against valkey-go's) and idem/pipelined (idem's work on
// that transport).
//
// 1goroutine runs them from one goroutine, one call of each per iteration,
// in a new random order each time, timing every call: the latency of one
// call alone. It reports ns/op per side and the same ratios: a change of
// the machine's load falls on every side within one iteration.
//
// 1goroutine-phases runs them from one goroutine in phases, as
// 64goroutines does from 64: its ns/op are noisier than 1goroutine's (a
// change of load falls on one side's phase), but it measures the CPU time
// per call, client and server, which timing single calls cannot.
func BenchmarkFloors(b *testing.B) {
	addr := redistest.Start(b, redistest.Config{}).Addr()
	b.Run("64goroutines", func(b *testing.B) { inPhases(b, addr, goroutines) })
	b.Run("1goroutine", func(b *testing.B) { inTurns(b, addr) })
	b.Run("1goroutine-phases", func(b *testing.B) { inPhases(b, addr, 1) })
}

// runSides returns the sides' new-key calls on addr, each on keys of its
// own that the run deletes (the keys' handlers are returned too), having
// made every call once from each of n goroutines: their connection pools
// are full before the timer starts.
func runSides(b *testing.B, addr string, n int) (calls [nSides]func() error, keys [nSides]*benchrun.Keys, names [nSides]string) {
	ctx := context.Background()
	p := benchrun.Payload(payloadSize)
	sides := newSides(b, addr, p)
	admin := newGoRedis(b, addr)
	for i, s := range sides {
		ks := benchrun.NewKeys(b, admin, s.record, len(p))
		keys[i], names[i] = ks, s.name
		calls[i] = func() error { return s.call(ctx, ks.Next()) }
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
	b.ReportMetric(nsOp[goredisSide]/nsOp[pipelinedSide], "pipelined/goredis")
	b.ReportMetric(nsOp[goredisSide]/nsOp[idemSide], "idem/goredis")
	b.ReportMetric(nsOp[valkeySide]/nsOp[idemSide], "idem/valkey")
	b.ReportMetric(nsOp[valkeySide]/nsOp[pipelinedSide], "pipelined/valkey")
	b.ReportMetric(nsOp[pipelinedSide]/nsOp[idemSide], "idem/pipelined")
}

// inPhases is BenchmarkFloors/64goroutines with n goroutines, and
// 1goroutine-phases with 1 (the benchmark's own: benchrun.Phases' perCPU 0).
func inPhases(b *testing.B, addr string, n int) {
	calls, _, names := runSides(b, addr, n)
	sides := make([]benchrun.Side, nSides)
	for i := range sides {
		sides[i] = benchrun.Side{Name: names[i], Call: calls[i]}
	}
	rng := rand.New(rand.NewPCG(uint64(benchRuns.Add(1)), 0))
	perCPU := 0
	if n > 1 {
		perCPU = max(1, n/runtime.GOMAXPROCS(0))
	}
	nsOp := benchrun.Phases(b, sides, perCPU, newGoRedis(b, addr), rng)
	if nsOp != nil {
		reportRatios(b, [nSides]float64(nsOp))
	}
}

// inTurns is BenchmarkFloors/1goroutine.
func inTurns(b *testing.B, addr string) {
	calls, keys, names := runSides(b, addr, 1)
	rng := rand.New(rand.NewPCG(uint64(benchRuns.Add(1)), 0))
	order := [nSides]int{goredisSide, valkeySide, rueidisSide, pipelinedSide, idemSide}
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
			if ks.Full() {
				b.StopTimer()
				ks.Flush()
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
