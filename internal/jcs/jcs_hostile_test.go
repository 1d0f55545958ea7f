package jcs_test

import (
	"encoding/json"
	"runtime"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/jcs"
)

// minTime returns the shortest of n runs of f.
func minTime(n int, f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range n {
		t0 := time.Now()
		f()
		best = min(best, time.Since(t0))
	}
	return best
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestCanonicalHostileIsLinear: FAULTS.md row 41. The canonical form of
// an object of 80,000 members, and of objects nested 10,000 deep, costs
// about what checking the same bytes with json.Valid costs (a linear
// scan), measured in turns in this run: never seconds of CPU (a duplicate
// scan quadratic in the members took 2,000 times json.Valid's time), and
// never gigabytes (a copy of each subtree into its parent allocated 5,000
// times the body). The bounds leave a margin of 10 or more on both sides.
func TestCanonicalHostileIsLinear(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hostile bodies take a few seconds under -race")
	}
	wide, deep := hostileJSON(80000, 10000)
	for name, body := range map[string][]byte{"members=80000": wide, "depth=10000": deep} {
		t.Run(name, func(t *testing.T) {
			var err error
			bytes := allocated(func() { _, err = jcs.Canonical(body) })
			if err != nil {
				t.Fatal(err)
			}
			if max := 64 * uint64(len(body)); bytes > max {
				t.Errorf("Canonical of %d bytes allocated %d bytes, over %d", len(body), bytes, max)
			}
			var scan, canon time.Duration
			for range 3 {
				scan += minTime(1, func() { json.Valid(body) })
				canon += minTime(1, func() { _, _ = jcs.Canonical(body) })
			}
			ratio := float64(canon) / float64(scan)
			t.Logf("%d bytes: Canonical %v, json.Valid %v (×%.1f)", len(body), canon/3, scan/3, ratio)
			if ratio > 100 {
				t.Errorf("Canonical took %.0f times json.Valid's time on the same %d bytes; want a linear cost", ratio, len(body))
			}
		})
	}
}
