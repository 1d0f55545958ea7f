// Package benchrun is what idem's benchmarks share, in the root module and
// in bench/: the CPU meter (this process's CPU time, and a redis-server's),
// the phased runs that compare sides under one changing machine load, and
// the keys of new-key benchmarks, whose records it deletes.
package benchrun

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

	"github.com/redis/go-redis/v9"
)

// ServerCPU returns the CPU time (user and system) that the redis-server
// behind rdb has used so far, from INFO cpu.
func ServerCPU(rdb *redis.Client) (time.Duration, bool) {
	if rdb == nil {
		return 0, false
	}
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

// A Meter measures the CPU time per op of the benchmark's process
// (cli-us/op, where getrusage tells it) and of a redis-server (srv-us/op,
// from INFO cpu): unlike ns/op, neither counts the time spent waiting for
// the other, or for other programs on the machine.
type Meter struct {
	b          *testing.B
	server     *redis.Client // nil: no server to measure
	cli0, srv0 time.Duration
	cliOK      bool
	srvOK      bool
}

// StartMeter starts measuring; server is a client of the redis-server to
// measure, or nil when there is none (with miniredis, the server's work is
// in cli-us/op).
func StartMeter(b *testing.B, server *redis.Client) *Meter {
	m := &Meter{b: b, server: server}
	m.srv0, m.srvOK = ServerCPU(server)
	m.cli0, m.cliOK = ProcessCPU()
	return m
}

// Stop reports the CPU per op since StartMeter, over n ops.
func (m *Meter) Stop(n int) {
	cli, cliOK := ProcessCPU()
	srv, srvOK := ServerCPU(m.server)
	if n <= 0 {
		return
	}
	perOp := func(d time.Duration) float64 { return float64(d) / float64(n) / float64(time.Microsecond) }
	if cliOK && m.cliOK {
		m.b.ReportMetric(perOp(cli-m.cli0), "cli-us/op")
	}
	if srvOK && m.srvOK {
		m.b.ReportMetric(perOp(srv-m.srv0), "srv-us/op")
	}
}

// A Side is one contender of a phased run: its name in the metrics, and
// one call of it.
type Side struct {
	Name string
	Call func() error
}

// PhaseLen is how long a phased run runs one side before the next: long
// beside a call (the calls under way at a change end within a millisecond
// or two), short beside a run (-benchtime 2s holds 100 phases).
const PhaseLen = 20 * time.Millisecond

// Phases runs the sides from perCPU goroutines per CPU (0: from one
// goroutine, the benchmark's own) in phases of
// PhaseLen: every goroutine makes the calls of the current side, and the
// sides take their turns in an order that rng shuffles after every round
// (nil: the same order every round), so that slow changes of the machine's
// load weigh on every side alike, and so does, with a shuffled order, the
// work one side leaves behind (garbage collection, the server's
// housekeeping). The goroutines' connection pools are filled first, with
// every side's calls.
//
// It reports, per side, <name>-ns/op (the time of its phases over its
// calls: the inverse of its throughput), and the CPU time of its phases
// per call, <name>-cli-us/op and <name>-srv-us/op (the server's, from
// server; nil: none), and returns the ns/op, or nil when the run was too
// short for every side to have a phase. A call under way when the phase
// changes counts for its own side.
func Phases(b *testing.B, sides []Side, perCPU int, server *redis.Client, rng *rand.Rand) []float64 {
	n := len(sides)
	var warm sync.WaitGroup
	for range max(1, perCPU*runtime.GOMAXPROCS(0)) {
		warm.Go(func() {
			for _, s := range sides {
				if err := s.Call(); err != nil {
					b.Error(err)
				}
			}
		})
	}
	warm.Wait()
	if b.Failed() {
		b.FailNow()
	}
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	shuffle := func() {
		if rng != nil {
			rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
	}
	shuffle()
	var (
		phase   atomic.Int32 // the side whose calls run now
		calls   = make([]atomic.Int64, n)
		stop    = make(chan struct{})
		stopped = make(chan struct{})
		// Owned by the goroutine that changes phases until stopped.
		elapsed, cli, srv = make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, n)
		cliOK, srvOK      bool
	)
	phase.Store(order[0])
	if perCPU > 0 {
		b.SetParallelism(perCPU)
	}
	b.ResetTimer()
	go func() {
		defer close(stopped)
		t := time.NewTicker(PhaseLen)
		defer t.Stop()
		last := time.Now()
		lastCli, ok1 := ProcessCPU()
		lastSrv, ok2 := ServerCPU(server)
		cliOK, srvOK = ok1, ok2
		end := func(p int32, now time.Time) {
			c, ok1 := ProcessCPU()
			s, ok2 := ServerCPU(server)
			cliOK, srvOK = cliOK && ok1, srvOK && ok2
			elapsed[p] += now.Sub(last)
			cli[p] += c - lastCli
			srv[p] += s - lastSrv
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
				if pos++; pos == n {
					pos = 0
					shuffle()
				}
				phase.Store(order[pos])
				end(p, now)
			}
		}
	}()
	call := func() bool {
		p := phase.Load()
		if err := sides[p].Call(); err != nil {
			b.Error(err)
			return false
		}
		calls[p].Add(1)
		return true
	}
	if perCPU == 0 {
		for i := 0; i < b.N && call(); i++ {
		}
	} else {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() && call() {
			}
		})
	}
	close(stop)
	<-stopped
	b.StopTimer()
	nsOp := make([]float64, n)
	for i := range sides {
		if calls[i].Load() == 0 {
			return nil
		}
		nsOp[i] = float64(elapsed[i].Nanoseconds()) / float64(calls[i].Load())
	}
	per := func(d time.Duration, i int) float64 {
		return float64(d.Nanoseconds()) / float64(calls[i].Load()) / 1e3
	}
	for i, s := range sides {
		b.ReportMetric(nsOp[i], s.Name+"-ns/op")
		if cliOK {
			b.ReportMetric(per(cli[i], i), s.Name+"-cli-us/op")
		}
		if srvOK {
			b.ReportMetric(per(srv[i], i), s.Name+"-srv-us/op")
		}
	}
	return nsOp
}

// Payload returns n bytes of letters: the result of a benchmark's calls.
func Payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// FlushBytes bounds the results that a run leaves in Redis before Keys
// deletes them.
const FlushBytes = 32 << 20

// runs makes the keys of every run unique.
var runs atomic.Int64

// Keys hands out the new keys of one side of one run and deletes their
// records once they hold FlushBytes of results, and when the run ends, so
// that records do not pile up in Redis.
type Keys struct {
	tb      testing.TB
	rdb     *redis.Client
	prefix  string
	record  func(key string) string // the Redis key of a key's record
	size    int                     // result bytes per record
	n       atomic.Int64            // keys handed out
	flushed int64                   // keys deleted, in order; owned by Flush
}

// NewKeys returns the keys of a run whose records, of size result bytes,
// are at record(key) in rdb.
func NewKeys(tb testing.TB, rdb *redis.Client, record func(string) string, size int) *Keys {
	ks := &Keys{tb: tb, rdb: rdb, record: record, size: size,
		prefix: "b" + strconv.FormatInt(runs.Add(1), 10) + ":"}
	tb.Cleanup(ks.Flush)
	return ks
}

// Next returns a new key, in one allocation as a caller would. It is safe
// for concurrent use.
func (ks *Keys) Next() string {
	var buf [48]byte
	return string(strconv.AppendInt(append(buf[:0], ks.prefix...), ks.n.Add(1)-1, 10))
}

// Full reports whether the records not yet deleted hold FlushBytes.
func (ks *Keys) Full() bool { return (ks.n.Load()-ks.flushed)*int64(ks.size) >= FlushBytes }

// MaybeFlush deletes the records so far, the timer stopped, when they are
// Full. Not for use beside Next.
func (ks *Keys) MaybeFlush(b *testing.B) {
	if !ks.Full() {
		return
	}
	b.StopTimer()
	ks.Flush()
	b.StartTimer()
}

// Flush deletes the records of the keys handed out so far. Not for use
// beside Next.
func (ks *Keys) Flush() {
	n := ks.n.Load()
	for ks.flushed < n {
		end := min(ks.flushed+1000, n)
		keys := make([]string, 0, end-ks.flushed)
		for i := ks.flushed; i < end; i++ {
			keys = append(keys, ks.record(ks.prefix+strconv.FormatInt(i, 10)))
		}
		if err := ks.rdb.Unlink(context.Background(), keys...).Err(); err != nil {
			ks.tb.Errorf("benchrun: delete the run's records: %v", err)
			return
		}
		ks.flushed = end
	}
}
