package traffic

import (
	"slices"
	"testing"
	"time"
)

func TestWorkloadPlan(t *testing.T) {
	t.Parallel()
	w := Workload{
		Ops: 2000, Rate: 50, TimeoutShare: 0.3, Retries: 3,
		RetryBase: time.Second, RetryFactor: 2, RetryJitter: 0.2, RetryCap: 10 * time.Second,
		LateShare: 0.1, LateMedian: time.Minute, LateP99: time.Hour,
		OpTime: 20 * time.Millisecond, Seed: 7,
	}
	p := w.Plan(true)
	if p.Ops() != w.Ops || len(p.Keys) != w.Ops {
		t.Fatalf("%d operations, %d keys; want %d", p.Ops(), len(p.Keys), w.Ops)
	}
	if !slices.IsSorted(p.At) {
		t.Fatal("requests not in time order")
	}
	if got := p.Count(First); got != w.Ops {
		t.Errorf("%d first attempts, want one per operation, %d", got, w.Ops)
	}
	// Each kind's share is drawn: a wide band around its expectation.
	if r := p.Count(Retry); r < w.Ops/5 || r > w.Ops {
		t.Errorf("%d retries for %d ops with a 30%% timeout share", r, w.Ops)
	}
	if l := p.Count(Late); l < w.Ops/20 || l > w.Ops/5 {
		t.Errorf("%d late redeliveries for %d ops with a 10%% share", l, w.Ops)
	}
	if p.Len() != p.Count(First)+p.Count(Retry)+p.Count(Late) {
		t.Errorf("%d requests, not the sum of their kinds", p.Len())
	}
	first := map[int32]time.Duration{}
	for i, op := range p.Op {
		if p.Kind[i] == First {
			first[op] = p.At[i]
		} else if at, ok := first[op]; !ok || p.At[i] < at {
			t.Fatalf("request %d (%v) of operation %d comes before its first attempt", i, p.Kind[i], op)
		}
		if p.Duration(i) != w.OpTime || p.Fingerprint(i) == "" {
			t.Fatalf("request %d: fn time %v, fingerprint %q", i, p.Duration(i), p.Fingerprint(i))
		}
		if int(p.KeyLen[op]) != len(p.Keys[op]) {
			t.Fatalf("operation %d: key length %d for %q", op, p.KeyLen[op], p.Keys[op])
		}
	}
	q := w.Plan(false)
	if !slices.Equal(p.At, q.At) || !slices.Equal(p.Op, q.Op) || !slices.Equal(p.Kind, q.Kind) || q.Keys != nil {
		t.Error("the same workload planned twice differs (or kept keys unasked)")
	}
	w.Seed++
	if r := w.Plan(false); slices.Equal(p.At, r.At) {
		t.Error("another seed planned the same traffic")
	}
}

func TestSortByTimeRelabels(t *testing.T) {
	t.Parallel()
	p := &Plan{
		At:     []time.Duration{3, 1, 2, 1},
		Op:     []int32{0, 1, 0, 0},
		FP:     []uint64{1, 2, 3, 4},
		KeyLen: []uint16{1, 1},
	}
	p.SortByTime(true)
	if want := []time.Duration{1, 1, 2, 3}; !slices.Equal(p.At, want) {
		t.Fatalf("At = %v, want %v", p.At, want)
	}
	// Equal times keep their order: request 1 (op 1) before request 3 (op 0).
	if want := []uint64{2, 4, 3, 1}; !slices.Equal(p.FP, want) {
		t.Fatalf("FP = %v, want %v", p.FP, want)
	}
	if want := []Kind{First, First, Retry, Retry}; !slices.Equal(p.Kind, want) {
		t.Fatalf("Kind = %v, want %v", p.Kind, want)
	}
	if p.Span() != 3 || p.Arrivals() != 1 {
		t.Errorf("span %v, arrivals %v; want 3, 1", p.Span(), p.Arrivals())
	}
}

func TestEscapedLen(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int{"": 0, "abc": 3, `a\b`: 4, "a}b}": 6, "{x}": 4} {
		if got := EscapedLen(key); got != want {
			t.Errorf("EscapedLen(%q) = %d, want %d", key, got, want)
		}
		if got := EscapedLen([]byte(key)); got != want {
			t.Errorf("EscapedLen([]byte(%q)) = %d, want %d", key, got, want)
		}
	}
}
