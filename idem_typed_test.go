package idem

// Tests of the typed Do's results end to end: round trips of generated
// values (rapid), schema changes, types refused before fn runs, and
// values that cannot be encoded after it ran. The codec's own tests are
// in internal/codec.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/internal/codec/codectest"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// codecClient returns a Client on a fresh miniredis: the codec does not
// depend on which Redis stores its bytes.
func codecClient(t testing.TB) *Client {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	c := New(rdb)
	t.Cleanup(func() {
		_ = c.Close()
		_ = rdb.Close()
	})
	return c
}

// propResult is a result type with a field of every kind the typed Do
// stores, for the end-to-end property test.
type propResult struct {
	ID     string
	Amount int64
	Small  uint8
	Ratio  float32
	At     time.Time
	Big    *big.Int
	Addr   netip.Addr
	Money  codectest.Money
	Lines  []propLine
	Tags   map[string][]byte
	Note   *string
	Flags  [2]bool
	Nested struct{ A, B int16 }
}

type propLine struct {
	SKU string `msgpack:"sku"`
	Qty int32  `msgpack:"qty,omitempty"`
}

// TestTypedReplayEqualsOwnerProperty runs the typed Do end to end: the
// owner gets fn's value, and a replay the same value.
func TestTypedReplayEqualsOwnerProperty(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	ctx := context.Background()
	var n atomic.Int64
	rapid.Check(t, func(t *rapid.T) {
		want := codectest.DrawValue(t, reflect.TypeFor[propResult](), "r").Interface().(propResult)
		key := fmt.Sprint("prop-", n.Add(1))
		fn := func(context.Context) (propResult, error) { return want, nil }
		owner, err := Do(ctx, c, key, "", fn)
		if err != nil || !codectest.SameValue(reflect.ValueOf(want), reflect.ValueOf(owner)) {
			t.Fatalf("owner: got %+v, %v; want %+v", owner, err, want)
		}
		replay, err := Do(ctx, c, key, "", func(context.Context) (propResult, error) {
			t.Fatal("fn ran on a replay")
			return propResult{}, nil
		})
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if !codectest.SameValue(reflect.ValueOf(want), reflect.ValueOf(replay)) {
			t.Fatalf("replay:\n got %+v\nwant %+v", replay, want)
		}
	})
}

// replayAs stores v with the typed Do under key, then replays the key as
// type R, as a newer version of the service with R in place of V would.
func replayAs[R, V any](t *testing.T, c *Client, key string, v V) (R, error) {
	t.Helper()
	ctx := context.Background()
	if _, err := Do(ctx, c, key, "", func(context.Context) (V, error) { return v, nil }); err != nil {
		t.Fatalf("store %T: %v", v, err)
	}
	return Do(ctx, c, key, "", func(context.Context) (R, error) {
		t.Fatalf("fn ran for %s on a replay", key)
		var zero R
		return zero, nil
	})
}

func TestTypedSchemaChanges(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	type v1 struct {
		Amount   int64
		Currency string
	}
	wantDecodeError := func(t *testing.T, key string, got any, err error, typ string) {
		t.Helper()
		if !errors.Is(err, ErrDecode) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("got %+v, %v; want ErrDecode (and ErrCorrupt)", got, err)
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%q", key)) || !strings.Contains(msg, typ) {
			t.Errorf("error %q names neither the key %q nor the type %s", msg, key, typ)
		}
	}
	t.Run("field added", func(t *testing.T) {
		type v2 struct {
			Amount   int64
			Currency string
			Note     string
			Lines    []string
		}
		got, err := replayAs[v2](t, c, "added", v1{100, "EUR"})
		if err != nil || !reflect.DeepEqual(got, v2{Amount: 100, Currency: "EUR"}) {
			t.Fatalf("got %+v, %v; want {100 EUR  []}", got, err)
		}
	})
	t.Run("field renamed", func(t *testing.T) {
		type v2 struct {
			AmountCents int64
			Currency    string
		}
		got, err := replayAs[v2](t, c, "renamed", v1{100, "EUR"})
		wantDecodeError(t, "renamed", got, err, "v2")
		if !strings.Contains(err.Error(), `"Amount"`) {
			t.Errorf("error %q does not name the field", err)
		}
	})
	t.Run("field removed", func(t *testing.T) {
		type v2 struct{ Currency string }
		got, err := replayAs[v2](t, c, "removed", v1{100, "EUR"})
		wantDecodeError(t, "removed", got, err, "v2")
	})
	t.Run("field renamed, stored name kept by a tag", func(t *testing.T) {
		type v2 struct {
			Cents    int64 `msgpack:"Amount"`
			Currency string
		}
		got, err := replayAs[v2](t, c, "tagged", v1{100, "EUR"})
		if err != nil || got != (v2{100, "EUR"}) {
			t.Fatalf("got %+v, %v; want {100 EUR}", got, err)
		}
	})
	t.Run("widened", func(t *testing.T) {
		type n1 struct {
			I int32
			U uint8
			F float32
			N int
		}
		type n2 struct {
			I int64
			U uint16
			F float64
			N float64
		}
		got, err := replayAs[n2](t, c, "widened", n1{-7, 200, 0.25, 3})
		if err != nil || got != (n2{-7, 200, 0.25, 3}) {
			t.Fatalf("got %+v, %v; want {-7 200 0.25 3}", got, err)
		}
	})
	t.Run("narrowed, value fits", func(t *testing.T) {
		type n1 struct{ N int64 }
		type n2 struct{ N int8 }
		got, err := replayAs[n2](t, c, "fits", n1{100})
		if err != nil || got.N != 100 {
			t.Fatalf("got %+v, %v; want {100}", got, err)
		}
	})
	for _, c2 := range []struct {
		name   string
		replay func(t *testing.T, c *Client, key string) (any, error)
	}{
		{"300 into uint8", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N uint8 }](t, c, key, struct{ N int }{300})
		}},
		{"-1 into uint64", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N uint64 }](t, c, key, struct{ N int64 }{-1})
		}},
		{"1.5 into int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N int }](t, c, key, struct{ N float64 }{1.5})
		}},
		{"2.0 into int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N int }](t, c, key, struct{ N float64 }{2})
		}},
		{"0.1 into float32", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N float32 }](t, c, key, struct{ N float64 }{0.1})
		}},
		{"string into int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N int }](t, c, key, struct{ N string }{"7"})
		}},
		{"nil pointer into int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[struct{ N int }](t, c, key, struct{ N *int }{})
		}},
		{"[3]int into [2]int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[[2]int](t, c, key, [3]int{1, 2, 3})
		}},
		{"struct into int", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[int](t, c, key, v1{1, "EUR"})
		}},
		{"int into bool", func(t *testing.T, c *Client, key string) (any, error) {
			return replayAs[bool](t, c, key, 1)
		}},
	} {
		t.Run(c2.name, func(t *testing.T) {
			key := "narrowed " + c2.name
			got, err := c2.replay(t, c, key)
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("got %+v, %v; want ErrDecode", got, err)
			}
			if reflect.ValueOf(got).IsZero() == false {
				t.Errorf("got %+v with the error, want the zero value", got)
			}
		})
	}
}

// refusedType runs the typed Do with a result type that is refused: the
// error must come before fn runs, and leave the key untouched.
func refusedType[T any](t *testing.T, c *Client, want string) {
	t.Helper()
	ctx := context.Background()
	var ran bool
	key := fmt.Sprintf("refused %T", *new(T))
	_, err := Do(ctx, c, key, "", func(context.Context) (T, error) {
		ran = true
		var zero T
		return zero, nil
	})
	if !errors.Is(err, ErrEncode) || ran {
		t.Fatalf("%T: got %v (fn ran: %v); want ErrEncode before fn runs", *new(T), err, ran)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%T: error %q does not say %q", *new(T), err, want)
	}
	if st, err := c.Status(ctx, key); err != nil || st.State != StateAbsent {
		t.Errorf("%T: key state %v, %v; want absent", *new(T), st.State, err)
	}
}

func TestTypedRefusedBeforeFnRuns(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	type withChan struct {
		ID   string
		Done chan struct{}
	}
	type withFunc struct{ F func() }
	type withAny struct{ V any }
	type withError struct{ Err error }
	type withUnexported struct {
		ID     string
		secret string //lint:ignore U1000 the field is what is refused
	}
	type withDash struct {
		ID   string
		Skip int `msgpack:"-"`
	}
	type withPtrKey struct{ M map[*int]int }
	type withPtrSlice struct{ P *[]int }
	type withComplex struct{ C complex128 }
	type withRatInMap struct{ M map[string]big.Rat }
	type embedded struct{ A int }
	type withEmbeddedPtr struct{ *embedded }
	type inner struct{ Amount int64 }
	type withNestedBad struct {
		Lines []struct {
			Inner inner
			Ch    chan int
		}
	}
	refusedType[withChan](t, c, "withChan.Done")
	refusedType[withFunc](t, c, "func")
	refusedType[withAny](t, c, "interface")
	refusedType[withError](t, c, "interface")
	refusedType[any](t, c, "interface")
	refusedType[withUnexported](t, c, "secret is unexported")
	refusedType[withDash](t, c, `msgpack:"-"`)
	refusedType[withPtrKey](t, c, "map keys")
	refusedType[withPtrSlice](t, c, "pointer to a slice")
	refusedType[withComplex](t, c, "complex128")
	refusedType[withRatInMap](t, c, "pointer receiver")
	refusedType[withEmbeddedPtr](t, c, "embedded pointer")
	refusedType[withNestedBad](t, c, "Lines[].Ch")
	refusedType[chan int](t, c, "chan")
}

// TestTypedUnexportedStateThroughMarshalers: types that keep their state
// unexported round-trip through their marshalers.
func TestTypedUnexportedStateThroughMarshalers(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	type result struct {
		Big   *big.Int
		Rat   big.Rat
		Addr  netip.Addr
		URL   *url.URL
		Money codectest.Money
		Cash  map[string]codectest.Money
	}
	u, _ := url.Parse("https://bank.example/pay?id=7#x")
	want := result{Big: big.NewInt(-12345678901234), Addr: netip.MustParseAddr("fe80::1%eth0"), URL: u,
		Money: codectest.NewMoney(-250), Cash: map[string]codectest.Money{"EUR": codectest.NewMoney(100)}}
	want.Rat.SetFrac64(1, 3)
	got, err := replayAs[result](t, c, "marshalers", want)
	if err != nil {
		t.Fatal(err)
	}
	if got.Big.Cmp(want.Big) != 0 || got.Rat.Cmp(&want.Rat) != 0 || got.Addr != want.Addr ||
		got.URL.String() != u.String() || got.Money != want.Money || got.Cash["EUR"] != want.Cash["EUR"] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

type cyclic struct {
	Name string
	Next *cyclic
}

// TestTypedCyclicValue: a cyclic value cannot be stored; fn has acted, so
// the key is finished as a failure that says so, and the process lives.
func TestTypedCyclicValue(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	ctx := context.Background()
	var runs int
	loop := &cyclic{Name: "a"}
	loop.Next = &cyclic{Name: "b", Next: loop}
	fn := func(context.Context) (*cyclic, error) {
		runs++
		return loop, nil
	}
	got, err := Do(ctx, c, "cycle", "", fn)
	if got != loop || !errors.Is(err, ErrEncode) || !strings.Contains(err.Error(), "cyclic") {
		t.Fatalf("owner: got %p, %v; want its value and ErrEncode saying cyclic", got, err)
	}
	got, err = Do(ctx, c, "cycle", "", fn)
	var se *StoredError
	if got != nil || !errors.As(err, &se) || !errors.Is(err, ErrEncode) || se.Code != "idem.encode" {
		t.Fatalf("replay: got %p, %v; want a *StoredError matching ErrEncode", got, err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
	// A long chain that is no cycle is stored.
	var chain *cyclic
	for i := range 1000 {
		chain = &cyclic{Name: fmt.Sprint(i), Next: chain}
	}
	back, err := replayAs[*cyclic](t, c, "chain", chain)
	if err != nil || back.Name != "999" || back.Next.Next.Name != "997" {
		t.Fatalf("chain: got %v", err)
	}
}

// TestCodecRejectsDamagedResults: truncated or inflated stored results are
// errors, not partial values, and huge stored lengths allocate nothing.
// priceZ is a value whose IsZero is true for a value other than Go's zero
// value: msgpack's omitempty drops it, and a replay would lose the
// currency.
type priceZ struct {
	Amount   int64
	Currency string
}

func (p priceZ) IsZero() bool { return p.Amount == 0 }

// TestTypedOmitEmptyNeverDiffers: msgpack's omitempty (on a field, or for
// a whole struct on its _msgpack field) drops values that decode back as
// something else: a non-nil empty slice or map comes back nil, a value
// whose IsZero is true comes back as the zero value, -0.0 as +0. Such
// types are refused before fn runs, naming the field; where omitting
// loses nothing (integers, strings, booleans, plain pointers), the replay
// equals the owner's value.
func TestTypedOmitEmptyNeverDiffers(t *testing.T) {
	t.Parallel()
	c := codecClient(t)
	type emptySlice struct {
		ID    string
		Items []int `msgpack:"items,omitempty"`
	}
	type emptyMap struct {
		M map[string]int `msgpack:",omitempty"`
	}
	type zeroer struct {
		Price priceZ `msgpack:",omitempty"`
	}
	type zeroerPtr struct {
		Price *priceZ `msgpack:",omitempty"`
	}
	type negZero struct {
		F float64 `msgpack:",omitempty"`
	}
	type structLevel struct {
		_msgpack struct{} `msgpack:",omitempty"` //lint:ignore U1000 msgpack reads its tag
		ID       string
		Items    []int
	}
	type inner struct {
		_msgpack struct{} `msgpack:",omitempty"` //lint:ignore U1000 msgpack reads its tag
		Tags     map[string]string
	}
	type embeddedStructLevel struct {
		inner
		ID string
	}
	refused := func(name string, want string, f func(key string) error) {
		t.Helper()
		err := f("omitempty " + name)
		if !errors.Is(err, ErrEncode) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "omitempty") {
			t.Errorf("%s: got %v; want ErrEncode naming %s and omitempty, before fn runs", name, err, want)
		}
	}
	refused("slice", "Items", func(key string) error {
		return ownAndReplay(t, c, key, emptySlice{ID: "a", Items: []int{}})
	})
	refused("map", "emptyMap.M", func(key string) error {
		return ownAndReplay(t, c, key, emptyMap{M: map[string]int{}})
	})
	refused("IsZero", "zeroer.Price", func(key string) error {
		return ownAndReplay(t, c, key, zeroer{Price: priceZ{0, "EUR"}})
	})
	refused("pointer to IsZero", "zeroerPtr.Price", func(key string) error {
		return ownAndReplay(t, c, key, zeroerPtr{Price: &priceZ{0, "EUR"}})
	})
	refused("float", "negZero.F", func(key string) error {
		return ownAndReplay(t, c, key, negZero{F: math.Copysign(0, -1)})
	})
	refused("_msgpack", "structLevel.Items", func(key string) error {
		return ownAndReplay(t, c, key, structLevel{ID: "a", Items: []int{}})
	})
	refused("embedded _msgpack", "Tags", func(key string) error {
		return ownAndReplay(t, c, key, embeddedStructLevel{inner: inner{Tags: map[string]string{}}, ID: "a"})
	})

	// Omitting these loses nothing: their empty value is Go's zero value.
	type lossless struct {
		N  int64   `msgpack:",omitempty"`
		U  uint8   `msgpack:",omitempty"`
		S  string  `msgpack:",omitempty"`
		B  bool    `msgpack:",omitempty"`
		P  *int    `msgpack:",omitempty"`
		PS *string `msgpack:",omitempty"`
	}
	one, empty := 1, ""
	for i, v := range []lossless{{}, {N: 1, U: 2, S: "s", B: true, P: &one, PS: &empty}} {
		if err := ownAndReplay(t, c, fmt.Sprintf("omitempty lossless %d", i), v); err != nil {
			t.Errorf("%+v: %v", v, err)
		}
	}
}

// ownAndReplay stores v under key with the typed Do and replays it: it
// returns the owner's error (fn must not have run then), or fails the test
// if the replay differs from v.
func ownAndReplay[T any](t *testing.T, c *Client, key string, v T) error {
	t.Helper()
	ctx := context.Background()
	ran := false
	if _, err := Do(ctx, c, key, "", func(context.Context) (T, error) { ran = true; return v, nil }); err != nil {
		if ran {
			t.Errorf("%T: fn ran, then %v", v, err)
		}
		return err
	}
	got, err := Do(ctx, c, key, "", func(context.Context) (T, error) {
		t.Errorf("%T: fn ran for a replay", v)
		return v, nil
	})
	if err != nil {
		t.Errorf("%T: replay: %v", v, err)
		return nil
	}
	if !codectest.SameValue(reflect.ValueOf(v), reflect.ValueOf(got)) {
		t.Errorf("%T: replay differs:\n got %#v\nwant %#v", v, got, v)
	}
	return nil
}
