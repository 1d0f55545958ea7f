package benchrun_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPayload(t *testing.T) {
	if got := string(benchrun.Payload(30)); got != "abcdefghijklmnopqrstuvwxyzabcd" {
		t.Fatalf("Payload(30) = %q", got)
	}
}

func TestCPU(t *testing.T) {
	if _, ok := benchrun.ProcessCPU(); !ok {
		t.Skip("no getrusage here")
	}
	srv := redistest.Start(t, redistest.Config{})
	if d, ok := benchrun.ServerCPU(srv.Client(t)); !ok || d < 0 {
		t.Fatalf("ServerCPU = %v, %v", d, ok)
	}
	if _, ok := benchrun.ServerCPU(nil); ok {
		t.Fatal("ServerCPU(nil) reports a time")
	}
}

// Keys hands out unique keys and deletes their records.
func TestKeys(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	ctx := context.Background()
	record := func(k string) string { return "rec:{" + k + "}" }
	ks := benchrun.NewKeys(t, rdb, record, benchrun.FlushBytes/2)
	seen := map[string]bool{}
	var records []string
	for range 3 {
		k := ks.Next()
		if seen[k] {
			t.Fatalf("key %q handed out twice", k)
		}
		seen[k] = true
		records = append(records, record(k))
		if err := rdb.Set(ctx, record(k), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if !ks.Full() {
		t.Fatal("three records of half FlushBytes each are not Full")
	}
	ks.Flush()
	if ks.Full() {
		t.Fatal("Full after Flush")
	}
	if n, err := rdb.Exists(ctx, records...).Result(); err != nil || n != 0 {
		t.Fatalf("%d records left after Flush (%v)", n, err)
	}
	if other := benchrun.NewKeys(t, rdb, record, 1).Next(); seen[other] {
		t.Fatalf("another run's key %q repeats one of this run's", other)
	}
}

// Phases gives every side phases and calls, from one goroutine with
// perCPU 0, and reports each one's figures; a side that fails fails the
// benchmark.
func TestPhases(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	server := srv.Client(t)
	for _, perCPU := range []int{1, 0} { // 0: one goroutine
		var a, b, at atomic.Int64
		var nsOp []float64
		res := testing.Benchmark(func(bm *testing.B) {
			sides := []benchrun.Side{
				{Name: "a", Call: func() error {
					if at.Add(1) > 1 {
						a.Store(-1 << 40) // two calls at once
					}
					defer at.Add(-1)
					a.Add(1)
					return nil
				}},
				{Name: "b", Call: func() error { b.Add(1); return server.Ping(context.Background()).Err() }},
			}
			nsOp = benchrun.Phases(bm, sides, perCPU, server, nil)
		})
		if a.Load() == 0 || b.Load() == 0 {
			t.Fatalf("perCPU %d: calls: a %d, b %d; want both sides called", perCPU, a.Load(), b.Load())
		}
		if perCPU == 0 && a.Load() < 0 {
			t.Errorf("perCPU 0: two calls of a at once, want one goroutine")
		}
		if len(nsOp) != 2 || nsOp[0] <= 0 || nsOp[1] <= 0 {
			t.Fatalf("perCPU %d: ns/op %v, want two positive figures", perCPU, nsOp)
		}
		for _, m := range []string{"a-ns/op", "b-ns/op", "b-srv-us/op", "b-cli-us/op"} {
			if _, ok := res.Extra[m]; !ok {
				t.Errorf("perCPU %d: no %s in %v", perCPU, m, res.Extra)
			}
		}
	}
	failed := testing.Benchmark(func(bm *testing.B) {
		benchrun.Phases(bm, []benchrun.Side{{Name: "x", Call: func() error { return errors.New("boom") }}}, 1, nil, nil)
	})
	if failed.N != 0 {
		t.Fatalf("a run whose side fails: %v, want a failed run (N 0)", failed)
	}
}
