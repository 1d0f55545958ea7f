package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// TestBootstrapShrinks checks that the intervals narrow as the trace
// grows: the same traffic, 25 times more of it, should give intervals of
// about a fifth the width (1/√25), for each retention's duplicate rate and
// for the searched retention; and that each interval holds its estimate.
func TestBootstrapShrinks(t *testing.T) {
	t.Parallel()
	policies := []time.Duration{time.Minute, 10 * time.Minute, time.Hour}
	const target = 0.002
	type widths struct {
		rate      []float64
		retention time.Duration
	}
	measure := func(ops int) widths {
		cfg, err := parseFlags([]string{"-ops", itoa(ops), "-rate", "1", "-seed", "3"})
		if err != nil {
			t.Fatal(err)
		}
		p := cfg.work.Plan(false)
		a := analyse(p, 30*time.Second, policies)
		bs := a.bootstrapKeys(policies, target, 400, 1)
		var w widths
		for i, r := range policies {
			rate := float64(a.duplicatesAt(r)) / float64(p.Ops())
			iv := bs.rate[i]
			if rate < iv[0] || rate > iv[1] {
				t.Errorf("%d ops, %s: rate %v outside its interval %v", ops, units.ShortDuration(r), rate, iv)
			}
			w.rate = append(w.rate, iv[1]-iv[0])
		}
		best := roundRetention(a.smallest(target), 30*time.Second)
		if best < bs.retention[0] || best > bs.retention[1] {
			t.Errorf("%d ops: retention %s outside its interval %v", ops, best, bs.retention)
		}
		w.retention = bs.retention[1] - bs.retention[0]
		t.Logf("%d ops: rate interval widths %v, retention interval %v (%s)", ops, w.rate, bs.retention, w.retention)
		return w
	}
	small, big := measure(4000), measure(100000)
	for i, r := range policies {
		if !(big.rate[i] > 0 && big.rate[i] < small.rate[i]/3) {
			t.Errorf("%s: interval width %v with 25 times the traffic, against %v; want under a third", units.ShortDuration(r), big.rate[i], small.rate[i])
		}
	}
	if !(big.retention < small.retention/2) {
		t.Errorf("retention interval %s with 25 times the traffic, against %s; want under half", big.retention, small.retention)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
