package idem_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// BenchmarkSteps measures Do on a new key whose fn runs three steps,
// beside the same Do with no step, in one run: on attempt 1 a step costs
// one script call (its checkpoint's write), pipelined with concurrent
// calls'. The -takeover pairs measure the same on attempt 2: each
// iteration is a Do whose fn fails transiently (the claim is given back),
// then the Do that takes the key over, where each step first reads the
// checkpoint an earlier attempt may have left: two script calls.
func BenchmarkSteps(b *testing.B) {
	srv := benchRedis(b)
	ctx := context.Background()
	one := func(context.Context) (int, error) { return 1, nil }
	for _, tc := range []struct {
		name string
		fn   func(context.Context) (int, error)
	}{
		{"no-steps", one},
		{"3-steps", func(ctx context.Context) (int, error) {
			sum := 0
			for _, name := range []string{"reserve", "charge", "notify"} {
				v, err := idem.Step(ctx, name, one)
				if err != nil {
					return 0, err
				}
				sum += v
			}
			return sum, nil
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchIdem(b, srv.addr, idem.WithRetention(time.Minute))
			prefix := "s" + strconv.FormatInt(benchRuns.Add(1), 10) + ":"
			n := 0
			if _, err := idem.Do(ctx, c, prefix+"warm", "", tc.fn); err != nil { // caches the scripts
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				n++
				if _, err := idem.Do(ctx, c, prefix+strconv.Itoa(n), "", tc.fn); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"-takeover", func(b *testing.B) {
			c := benchIdem(b, srv.addr, idem.WithRetention(time.Minute))
			prefix := "s" + strconv.FormatInt(benchRuns.Add(1), 10) + ":"
			transient := errors.New("transient")
			fail := func(context.Context) (int, error) { return 0, transient }
			takeOver := func(key string) {
				if _, err := idem.Do(ctx, c, key, "", fail); !errors.Is(err, transient) {
					b.Fatalf("attempt 1: %v, want %v", err, transient)
				}
				if _, err := idem.Do(ctx, c, key, "", tc.fn); err != nil {
					b.Fatal(err)
				}
			}
			takeOver(prefix + "warm") // caches the scripts, release's too
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n++
				takeOver(prefix + strconv.Itoa(n))
			}
		})
	}
}
