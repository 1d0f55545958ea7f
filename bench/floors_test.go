package bench

// Tests that the sides BenchmarkFloors times do what they claim: each floor
// leaves the record its scripts promise and refuses a second claim; idem's
// side returns the result and replays it; the run's records are deleted.

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/benchrun"
	"github.com/idem-go/idem/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFloors runs one new key through each floor's claim and completion and
// reads the record back; a second claim of the key must be refused and
// leave the record as it was.
func TestFloors(t *testing.T) {
	addr := redistest.Start(t, redistest.Config{}).Addr()
	ctx := context.Background()
	p := benchrun.Payload(payloadSize)
	admin := newGoRedis(t, addr)
	floors := []*floor{goRedisFloor(newGoRedis(t, addr), p), valkeyFloor(t, addr, p), rueidisFloor(t, addr, p), pipelinedFloor(t, newGoRedis(t, addr), p)}
	for _, f := range floors {
		t.Run(f.name, func(t *testing.T) {
			key := "test-" + f.name
			if err := f.newKey(ctx, key); err != nil {
				t.Fatalf("new key: %v", err)
			}
			rk := rawKey(key)
			want := map[string]string{"own": rawToken, "st": "d", "res": string(p)}
			check := func(when string) {
				t.Helper()
				got, err := admin.HGetAll(ctx, rk).Result()
				if err != nil {
					t.Fatalf("%s: HGETALL %s: %v", when, rk, err)
				}
				if len(got) != len(want) {
					t.Errorf("%s: record %s has fields %v, want %v", when, rk, got, want)
				}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("%s: record %s field %s = %q, want %q", when, rk, k, got[k], v)
					}
				}
				ttl, err := admin.PTTL(ctx, rk).Result()
				if err != nil {
					t.Fatalf("%s: PTTL %s: %v", when, rk, err)
				}
				if ttl <= benchRetention-time.Hour || ttl > benchRetention {
					t.Errorf("%s: record %s expires in %v, want just under %v", when, rk, ttl, benchRetention)
				}
			}
			check("after the completion")

			won, err := f.claim(ctx, rk, "fedcba9876543210")
			if err != nil {
				t.Fatalf("second claim: %v", err)
			}
			if won != 0 {
				t.Errorf("second claim of %s returned %d, want 0 (refused)", rk, won)
			}
			check("after a refused claim")

			if err := f.newKey(ctx, key); err == nil {
				t.Errorf("a second new key %q through newKey succeeded, want an error", key)
			}
		})
	}
}

// TestIdemSide checks idem's side: its call returns the result, a second
// Do of the key replays it without running fn, and the record lies where
// benchKeys deletes it (idemKey).
func TestIdemSide(t *testing.T) {
	addr := redistest.Start(t, redistest.Config{}).Addr()
	ctx := context.Background()
	p := benchrun.Payload(payloadSize)
	rdb := newGoRedis(t, addr)
	sides := newSides(t, addr, p)
	key := "test-idem"
	if err := sides[idemSide].call(ctx, key); err != nil {
		t.Fatalf("idem side: %v", err)
	}
	c := newIdem(t, rdb)
	res, err := c.Do(ctx, key, benchFingerprint, func(context.Context) ([]byte, error) {
		return nil, errors.New("fn ran for a key already done")
	})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if string(res) != string(p) {
		t.Errorf("replay returned %q, want %q", res, p)
	}
	n, err := rdb.Exists(ctx, idemKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("no record at %s after Do: benchrun.Keys would not delete idem's records", idemKey(key))
	}
}

// TestBenchKeys checks that a run's records, every side's, are deleted by
// benchrun.Keys.Flush, and that keys are unique across runs.
func TestBenchKeys(t *testing.T) {
	addr := redistest.Start(t, redistest.Config{}).Addr()
	ctx := context.Background()
	p := benchrun.Payload(payloadSize)
	rdb := newGoRedis(t, addr)
	sides := newSides(t, addr, p)
	seen := map[string]bool{}
	for _, s := range sides {
		ks := benchrun.NewKeys(t, rdb, s.record, len(p))
		var records []string
		for range 3 {
			key := ks.Next()
			if seen[key] {
				t.Fatalf("key %q handed out twice", key)
			}
			seen[key] = true
			if err := s.call(ctx, key); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			records = append(records, s.record(key))
		}
		if n, err := rdb.Exists(ctx, records...).Result(); err != nil || n != 3 {
			t.Fatalf("%s: %d of %v exist (%v), want 3", s.name, n, records, err)
		}
		ks.Flush()
		if n, err := rdb.Exists(ctx, records...).Result(); err != nil || n != 0 {
			t.Errorf("%s: %d of %v exist after flush (%v), want 0", s.name, n, records, err)
		}
	}
}

// TestScriptsMatchRoot holds the floors' scripts equal to the raw baseline
// of the root module's benchmarks, whose figures they extend.
func TestScriptsMatchRoot(t *testing.T) {
	src, err := os.ReadFile("../bench_test.go")
	if err != nil {
		t.Fatalf("the root's benchmarks: %v", err)
	}
	for name, script := range map[string]string{"rawClaim": rawClaimSrc, "rawComplete": rawCompleteSrc} {
		if !strings.Contains(string(src), name+" = redis.NewScript(`"+script+"`)") {
			t.Errorf("../bench_test.go has no %s with the script of this module:%s", name, script)
		}
	}
}

// TestPipelinedFloorAsIdem holds the pipelined floor's number of pipelines
// equal to idem's default (options.go), so that it runs on the transport
// idem's Do runs on.
func TestPipelinedFloorAsIdem(t *testing.T) {
	src, err := os.ReadFile("../options.go")
	if err != nil {
		t.Fatalf("the root's options: %v", err)
	}
	if want := "const defaultPipelines = " + strconv.Itoa(idemPipelines) + "\n"; !strings.Contains(string(src), want) {
		t.Errorf("../options.go has no %q: idemPipelines is not idem's default of WithPipelines", strings.TrimSpace(want))
	}
}
