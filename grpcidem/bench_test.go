package grpcidem_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

var benchRuns atomic.Int64 // makes the keys of every benchmark run unique

// BenchmarkInterceptor measures what the server interceptor adds to a
// unary call, over a real TCP connection: a call with a new key (claim,
// handler, store: two Redis round trips) and a replayed one (one round
// trip, no handler), each run in turns with the same call to a server
// without the interceptor, so that load on a shared machine weighs on both
// alike. It reports bare-ns/op and idem-ns/op (the time of one call of
// each), bare/idem (the share of the bare server's throughput that the
// interceptor keeps: 1 = no cost) and overhead-us/op (idem less bare). The
// Redis is a redis-server started for the benchmark when one is
// installed, else miniredis in this process. It never asserts a timing.
func BenchmarkInterceptor(b *testing.B) {
	addr := benchRedisAddr(b)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { _ = rdb.Close() })
	keys := idem.New(rdb)
	b.Cleanup(func() { _ = keys.Close() })

	resp := mustStruct(map[string]any{"debit": "d-1", "memo": strings.Repeat("x", 80)})
	h := func(context.Context, *structpb.Struct) (*structpb.Struct, error) { return resp, nil }
	bare := dial(b, serve(b, &bank{debit: h}))
	withIdem := dial(b, serve(b, &bank{debit: h}, grpcidem.UnaryServerInterceptor(keys)))

	req := mustStruct(map[string]any{"account": "A", "amount": 100})
	call := func(b *testing.B, cc *grpc.ClientConn, key string) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), grpcidem.HeaderIdempotencyKey, key)
		out := new(structpb.Struct)
		if err := cc.Invoke(ctx, methodDebit, req, out); err != nil {
			b.Fatal(err)
		}
		if out.GetFields()["debit"].GetStringValue() != "d-1" {
			b.Fatalf("response %v", out)
		}
	}
	inTurns := func(b *testing.B, key func() string) {
		var tBare, tIdem time.Duration
		timed := func(cc *grpc.ClientConn, k string, total *time.Duration) func() {
			return func() {
				t0 := time.Now()
				call(b, cc, k)
				*total += time.Since(t0)
			}
		}
		i := 0
		for b.Loop() {
			k := key()
			sides := [2]func(){timed(bare, k, &tBare), timed(withIdem, k, &tIdem)}
			sides[i%2]()
			sides[1-i%2]()
			i++
		}
		n := float64(b.N)
		b.ReportMetric(float64(tBare.Nanoseconds())/n, "bare-ns/op")
		b.ReportMetric(float64(tIdem.Nanoseconds())/n, "idem-ns/op")
		b.ReportMetric(float64(tBare)/float64(tIdem), "bare/idem")
		b.ReportMetric(float64(tIdem-tBare)/n/1e3, "overhead-us/op")
	}

	run := benchRuns.Add(1)
	b.Run("NewKey", func(b *testing.B) {
		i := 0
		inTurns(b, func() string {
			i++
			return fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), run, i)
		})
	})
	b.Run("Replay", func(b *testing.B) {
		key := fmt.Sprintf("bench-replay-%d-%d", os.Getpid(), run)
		call(b, withIdem, key) // stored once
		inTurns(b, func() string { return key })
	})
}

// benchRedisAddr returns the address of a redis-server started for the
// benchmark (stopped at its end) when one is installed or
// IDEM_REQUIRE_REDIS=1, else of a miniredis.
func benchRedisAddr(b *testing.B) string {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("IDEM_REQUIRE_REDIS") == "1" {
		return redistest.Start(b, redistest.Config{}).Addr()
	}
	b.Logf("redis-server not found: the benchmark runs on miniredis")
	return miniredis.RunT(b).Addr()
}
