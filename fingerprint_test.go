package idem_test

import (
	"context"
	"math/big"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// goldenParams is a package-level type: its name is part of what
// Fingerprint hashes, so the golden values pin it.
type goldenParams struct {
	Account string
	Amount  int64
	Tags    []string
}

// fixed is a fixed-point amount as money is often held in Go: unexported
// state, no marshaler.
type fixed struct {
	units int64
	scale uint8
}

// textAmount has unexported state and a TextMarshaler, which Fingerprint
// prefers to the state.
type textAmount struct {
	cents int64
	cache string // not part of the value: MarshalText ignores it
}

func (a textAmount) MarshalText() ([]byte, error) {
	return []byte(big.NewRat(a.cents, 100).FloatString(2)), nil
}

// binAmount has both marshalers: BinaryMarshaler wins.
type binAmount struct{ v int64 }

func (a binAmount) MarshalBinary() ([]byte, error) { return []byte{byte(a.v)}, nil }
func (a binAmount) MarshalText() ([]byte, error)   { return []byte("same text for all"), nil }

// withLock holds a mutex: its state is not a parameter.
type withLock struct {
	mu     sync.Mutex
	Amount int64
}

type node struct {
	V    int
	Next *node
}

// ring returns a cycle of n nodes with the values vals[i%len(vals)].
func ring(n int, vals ...int) *node {
	first := &node{V: vals[0]}
	cur := first
	for i := 1; i < n; i++ {
		cur.Next = &node{V: vals[i%len(vals)]}
		cur = cur.Next
	}
	cur.Next = first
	return first
}

func bigInt(s string) *big.Int {
	x, ok := new(big.Int).SetString(s, 10)
	if !ok {
		panic(s)
	}
	return x
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func TestFingerprintDistinguishesValues(t *testing.T) {
	t.Parallel()
	type params struct {
		Account string
		Amount  int64
		meta    string
	}
	type hidden struct{ p *int }
	one, two := 1, 2
	for _, c := range []struct {
		name string
		a, b []any
	}{
		{"big.Int", []any{"acct", big.NewInt(100)}, []any{"acct", big.NewInt(1_000_000)}},
		{"big.Int by value", []any{*big.NewInt(100)}, []any{*big.NewInt(1_000_000)}},
		{"big.Int sign", []any{big.NewInt(-5)}, []any{big.NewInt(5)}},
		{"big.Float", []any{big.NewFloat(1.5)}, []any{big.NewFloat(2.5)}},
		{"big.Rat", []any{big.NewRat(1, 3)}, []any{big.NewRat(2, 3)}},
		{"netip.Addr", []any{netip.MustParseAddr("10.0.0.1")}, []any{netip.MustParseAddr("192.168.1.1")}},
		{"netip.Addr zone", []any{netip.MustParseAddr("fe80::1%eth0")}, []any{netip.MustParseAddr("fe80::1%eth1")}},
		{"netip.Prefix", []any{netip.MustParsePrefix("10.0.0.0/8")}, []any{netip.MustParsePrefix("10.0.0.0/16")}},
		{"url.URL", []any{mustURL("https://a.example/x?q=1")}, []any{mustURL("https://a.example/x?q=2")}},
		{"fixed-point, unexported", []any{fixed{100, 2}}, []any{fixed{250, 2}}},
		{"fixed-point, scale", []any{fixed{100, 2}}, []any{fixed{100, 3}}},
		{"TextMarshaler", []any{textAmount{cents: 100}}, []any{textAmount{cents: 250}}},
		{"BinaryMarshaler first", []any{binAmount{1}}, []any{binAmount{2}}},
		{"unexported field", []any{params{"A", 1, "x"}}, []any{params{"A", 1, "y"}}},
		{"unexported pointer", []any{hidden{&one}}, []any{hidden{&two}}},
		{"map of big.Int", []any{map[string]*big.Int{"a": big.NewInt(1)}}, []any{map[string]*big.Int{"a": big.NewInt(2)}}},
		{"big.Int in any", []any{[]any{big.NewInt(1)}}, []any{[]any{big.NewInt(2)}}},
		{"big.Int or big.Float", []any{big.NewInt(100)}, []any{big.NewFloat(100)}},
		{"address or its text", []any{netip.MustParseAddr("10.0.0.1")}, []any{"10.0.0.1"}},
		{"ring of 2 or 3", []any{ring(2, 7)}, []any{ring(3, 7)}},
		{"rings of other values", []any{ring(2, 1, 2)}, []any{ring(2, 1, 3)}},
		{"nil or a value", []any{(*big.Int)(nil)}, []any{big.NewInt(0)}},
	} {
		if fa, fb := idem.Fingerprint(c.a...), idem.Fingerprint(c.b...); fa == fb {
			t.Errorf("%s: %v and %v share the fingerprint %s", c.name, c.a, c.b, fa)
		}
	}
}

func TestFingerprintEqualValues(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	hundred := new(big.Int).Mul(big.NewInt(10), big.NewInt(10)) // another internal capacity
	var locked withLock
	locked.mu.Lock()
	defer locked.mu.Unlock()
	for _, c := range []struct {
		name string
		a, b []any
	}{
		{"big.Int built two ways", []any{big.NewInt(100)}, []any{hundred}},
		{"big.Int by value and pointer", []any{*big.NewInt(100)}, []any{bigInt("100")}},
		{"big.Rat normalized", []any{big.NewRat(1, 2)}, []any{big.NewRat(2, 4)}},
		{"big.Float precision", []any{big.NewFloat(1.5)}, []any{new(big.Float).SetPrec(200).SetFloat64(1.5)}},
		{"netip.Addr parsed twice", []any{netip.MustParseAddr("10.0.0.1")}, []any{netip.AddrFrom4([4]byte{10, 0, 0, 1})}},
		{"TextMarshaler ignores the cache", []any{textAmount{cents: 100}}, []any{textAmount{cents: 100, cache: "1.00"}}},
		{"time in two zones", []any{at}, []any{at.In(time.FixedZone("X", 3600))}},
		{"value and pointer", []any{fixed{1, 2}}, []any{&fixed{1, 2}}},
		{"map order", []any{map[string]*big.Int{"a": big.NewInt(1), "b": big.NewInt(2)}},
			[]any{map[string]*big.Int{"b": big.NewInt(2), "a": big.NewInt(1)}}},
		{"rings built apart", []any{ring(3, 1, 2, 3)}, []any{ring(3, 1, 2, 3)}},
		{"a mutex's state", []any{&withLock{Amount: 5}}, []any{&withLock{Amount: 5}}},
	} {
		if fa, fb := idem.Fingerprint(c.a...), idem.Fingerprint(c.b...); fa != fb {
			t.Errorf("%s: %v and %v: fingerprints %s and %s differ", c.name, c.a, c.b, fa, fb)
		}
	}
	// A locked mutex hashes like an unlocked one.
	if fa, fb := idem.Fingerprint(&locked), idem.Fingerprint(&withLock{}); fa != fb {
		t.Errorf("a locked and an unlocked mutex: fingerprints %s and %s differ", fa, fb)
	}
}

func TestFingerprintCycles(t *testing.T) {
	t.Parallel()
	self := &node{V: 1}
	self.Next = self
	m := map[string]any{"v": 1}
	m["self"] = m
	s := []any{nil, 2}
	s[0] = s
	type pair struct{ A, B *node }
	shared := &node{V: 9} // reached twice, but no cycle
	for _, v := range []any{self, m, s, ring(5, 1, 2), pair{shared, shared}} {
		a, b := idem.Fingerprint(v), idem.Fingerprint(v)
		if a != b || len(a) != 32 {
			t.Errorf("%T: fingerprints %q and %q of one value", v, a, b)
		}
	}
	// A node that points to itself is another value than a node that
	// points to a copy of itself that ends there.
	end := &node{V: 1, Next: &node{V: 1}}
	if idem.Fingerprint(self) == idem.Fingerprint(end) {
		t.Error("a self-loop and a chain of two share a fingerprint")
	}
}

// TestFingerprintGolden pins fingerprints: a change of any of them makes
// every stored fingerprint of such values differ, so that a retry after
// an upgrade would get ErrConflict. Changing them is a breaking change.
func TestFingerprintGolden(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	amount := int64(100)
	for _, c := range []struct {
		parts []any
		want  string
	}{
		// Plain values: the same as before Fingerprint read unexported
		// state and marshalers.
		{nil, "e3b0c44298fc1c149afbf4c8996fb924"},
		{[]any{nil}, "5feceb66ffc86f38d952786c6d696c79"},
		{[]any{"acct-A", 100}, "9590ea2bb6232e145ec5e8a9aa4aa329"},
		{[]any{int64(-1), uint8(7), 1.5, float32(0.25), true, complex(1, 2)}, "0407f71e14321bad9311da06e69f1006"},
		{[]any{[]byte("abc"), [3]byte{1, 2, 3}}, "8f62992bb363aa2c5eeaf0eb081d23df"},
		{[]any{[]string{"a", "b"}, map[string]int{"a": 1, "b": 2}}, "d09cd7afb920c5bd1a09940f9732b649"},
		{[]any{goldenParams{"acct-A", 100, []string{"x"}}}, "6cf229e662fe8c8eb4096a43fc7967b9"},
		{[]any{&goldenParams{Account: "acct-B"}, (*int)(nil), &amount}, "de5afb111e27ed9e320b3bd7b30ca097"},
		{[]any{at}, "8303379434135e52d82975a03139bb19"},
		// Values hashed by their marshalers or their unexported state.
		{[]any{big.NewInt(100)}, "9379ee0933e5ddd4ff634d86b53a11d0"},
		{[]any{big.NewFloat(1.5), big.NewRat(1, 3)}, "195f6b1832482effc1752597699b6da2"},
		{[]any{netip.MustParseAddr("10.0.0.1"), mustURL("https://a.example/x?q=1")}, "2c0a437075a13a5e39fdfa7e8a2c08bc"},
		{[]any{fixed{100, 2}, textAmount{cents: 100}, binAmount{3}}, "4c39898b223bfd33706f05bbe243cad7"},
		{[]any{ring(2, 7)}, "5b5feb2e4235880bb9bb36759a6dc136"},
	} {
		if got := idem.Fingerprint(c.parts...); got != c.want {
			t.Errorf("Fingerprint(%#v) = %q, want %q", c.parts, got, c.want)
		}
	}
}

func TestFingerprintIsHex(t *testing.T) {
	t.Parallel()
	fp := idem.Fingerprint("4111-1111-1111-1111", big.NewInt(7))
	if len(fp) != 32 || strings.Trim(fp, "0123456789abcdef") != "" {
		t.Errorf("fingerprint %q is not a 32-digit hex digest", fp)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	type params struct {
		Account string
		Amount  int64
		meta    string
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	same := [][2]string{
		{idem.Fingerprint(map[string]int{"a": 1, "b": 2, "c": 3}), idem.Fingerprint(map[string]int{"c": 3, "b": 2, "a": 1})},
		{idem.Fingerprint(params{"A", 1, "x"}), idem.Fingerprint(&params{"A", 1, "x"})},
		{idem.Fingerprint(at), idem.Fingerprint(at.In(time.FixedZone("X", 3600)))},
		{idem.Fingerprint("acct", 100), idem.Fingerprint("acct", 100)},
	}
	for i, p := range same {
		if p[0] != p[1] {
			t.Errorf("pair %d: %s != %s", i, p[0], p[1])
		}
	}
	distinct := []string{
		idem.Fingerprint("ab", "c"), idem.Fingerprint("a", "bc"), idem.Fingerprint("abc"),
		idem.Fingerprint(int64(1)), idem.Fingerprint(uint64(1)), idem.Fingerprint("1"),
		idem.Fingerprint([]byte("1")), idem.Fingerprint(nil), idem.Fingerprint(),
		idem.Fingerprint(params{"A", 1, ""}), idem.Fingerprint(params{"A", 2, ""}), idem.Fingerprint(params{"A", 1, "y"}),
		idem.Fingerprint([]int{1, 2}), idem.Fingerprint([]int{2, 1}),
		idem.Fingerprint(map[string]int{"a": 1}), idem.Fingerprint(map[string]int{"a": 2}),
	}
	seen := map[string]int{}
	for i, fp := range distinct {
		if j, ok := seen[fp]; ok {
			t.Errorf("values %d and %d share fingerprint %s", j, i, fp)
		}
		seen[fp] = i
		if len(fp) != 32 || strings.Contains(fp, "acct") {
			t.Errorf("fingerprint %q is not a 32-digit hex digest", fp)
		}
	}
}

func TestRawParametersNeverStored(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t)
	secret := "4111-1111-1111-1111"
	if _, err := c.Do(context.Background(), "k", secret, func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	rec, err := b.MR.Get(idem.RecordKey(c, "k"))
	if err != nil || !strings.HasSuffix(rec, ":ok") {
		t.Fatalf("record: %q, %v", rec, err)
	}
	if strings.Contains(rec, secret) || strings.Contains(rec, "4111") {
		t.Fatalf("the record holds the raw fingerprint: %q", rec)
	}
}
