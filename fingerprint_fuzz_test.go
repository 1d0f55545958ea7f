package idem_test

// FuzzFingerprint builds arbitrary nested values from the fuzzer's bytes,
// cyclic ones included, and checks that Fingerprint never crashes and is
// a function of the value: the same bytes, built twice into values that
// share nothing, get one fingerprint. The seeds run in every go test;
// fuzz with
//
//	go test -run='^$' -fuzz=FuzzFingerprint -fuzztime=60s .

import (
	"math"
	"math/big"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// fuzzNode is a node of a value under construction: its fields, exported
// and not, hold nested values, and a later value may point back to it.
type fuzzNode struct {
	V    any
	next *fuzzNode
	m    map[string]any
	mu   sync.Mutex //lint:ignore U1000 its state is skipped: the point
}

// fuzzStruct has unexported fields of several kinds.
type fuzzStruct struct {
	a int8
	b string
	c []any
	d *big.Int
	E any
}

// valueBuilder reads a value from bytes: each value starts with an
// opcode byte; missing bytes read as zero. Nesting stops at depth 6.
type valueBuilder struct {
	b     []byte
	nodes []*fuzzNode // the nodes enclosing the value being built
}

func (r *valueBuilder) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *valueBuilder) u64() uint64 {
	var x uint64
	for range 8 {
		x = x<<8 | uint64(r.byte())
	}
	return x
}

func (r *valueBuilder) str() string {
	n := int(r.byte() % 8)
	s := make([]byte, n)
	for i := range s {
		s[i] = r.byte()
	}
	return string(s)
}

func (r *valueBuilder) value(depth int) any {
	op := r.byte() % 24
	if depth >= 6 && op >= 12 {
		op %= 12 // only leaves from here
	}
	switch op {
	case 0:
		return nil
	case 1:
		return int64(r.u64())
	case 2:
		return int8(r.byte())
	case 3:
		return r.u64()
	case 4:
		return math.Float64frombits(r.u64()) // NaNs and -0 too
	case 5:
		return float32(math.Float32frombits(uint32(r.u64())))
	case 6:
		return r.str()
	case 7:
		return []byte(r.str())
	case 8:
		return r.byte()&1 == 1
	case 9:
		return new(big.Int).SetUint64(r.u64())
	case 10:
		return netip.AddrFrom4([4]byte{r.byte(), r.byte(), r.byte(), r.byte()})
	case 11:
		return time.Unix(int64(r.u64()%1e10), int64(r.byte()))
	case 12:
		n := int(r.byte() % 4)
		s := make([]any, n)
		for i := range s {
			s[i] = r.value(depth + 1)
		}
		return s
	case 13:
		n := int(r.byte() % 4)
		m := make(map[string]any, n)
		for range n {
			m[r.str()] = r.value(depth + 1)
		}
		return m
	case 14:
		n := int(r.byte() % 4)
		m := make(map[int16]any, n)
		for range n {
			m[int16(r.byte())] = r.value(depth + 1)
		}
		return m
	case 15:
		v := r.value(depth + 1)
		return &v
	case 16:
		return fuzzStruct{a: int8(r.byte()), b: r.str(), c: []any{r.value(depth + 1)}, d: big.NewInt(int64(r.byte())), E: r.value(depth + 1)}
	case 17, 18:
		n := &fuzzNode{}
		r.nodes = append(r.nodes, n)
		n.V = r.value(depth + 1)
		if r.byte()&1 == 1 {
			n.next, _ = r.value(depth + 1).(*fuzzNode)
		}
		n.m = map[string]any{"x": r.value(depth + 1)}
		r.nodes = r.nodes[:len(r.nodes)-1]
		return n
	case 19:
		// A pointer back to an enclosing node: a cycle.
		if len(r.nodes) == 0 {
			return nil
		}
		return r.nodes[int(r.byte())%len(r.nodes)]
	case 20:
		return func() {}
	case 21:
		return make(chan int)
	case 22:
		return [2]any{r.value(depth + 1), r.value(depth + 1)}
	default:
		return big.NewRat(int64(r.byte())+1, int64(r.byte())+1)
	}
}

// build returns the values that b describes.
func build(b []byte) []any {
	r := &valueBuilder{b: b}
	var parts []any
	for len(r.b) > 0 && len(parts) < 4 {
		parts = append(parts, r.value(0))
	}
	return parts
}

func FuzzFingerprint(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		{0},
		{1, 0, 0, 0, 0, 0, 0, 0, 42},
		{4, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1},   // a NaN
		{17, 19, 0, 0, 1, 19, 0},            // a node that holds itself, and points to itself
		{12, 3, 17, 19, 0, 0, 13, 1, 0, 19}, // a slice of a cyclic node
		{13, 2, 1, 'a', 6, 1, 'b', 1, 'b', 9, 1, 2, 3, 4, 5, 6, 7, 8},
		{16, 1, 2, 'h', 'i', 12, 2, 0, 0, 7, 23, 3, 4},
		{22, 15, 15, 15, 6, 1, 'x', 20, 21},
		{18, 17, 17, 19, 1, 1, 19, 2, 0, 19, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a := idem.Fingerprint(build(b)...)
		again := idem.Fingerprint(build(b)...)
		if a != again || len(a) != 32 {
			t.Fatalf("one description, two fingerprints: %q and %q", a, again)
		}
	})
}
