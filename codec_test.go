package idem

// Tests of the typed Do's results: round trips of generated types and
// values (rapid), schema changes, types refused before fn runs, and
// values that cannot be encoded after it ran.

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
	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
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

// money is a fixed-point amount with unexported state and a text form.
type money struct{ cents int64 }

func (m money) MarshalText() ([]byte, error) { return []byte(fmt.Sprint(m.cents)), nil }
func (m *money) UnmarshalText(b []byte) error {
	_, err := fmt.Sscan(string(b), &m.cents)
	return err
}

// sameValue reports whether a replayed value b is the owner's value a:
// reflect.DeepEqual, except that floats compare by bits (NaN is NaN),
// times by instant and location, and big numbers by value.
func sameValue(a, b reflect.Value) bool {
	if a.Type() != b.Type() {
		return false
	}
	switch x := a.Interface().(type) {
	case time.Time:
		y := b.Interface().(time.Time)
		return x.Equal(y) && x.Location().String() == y.Location().String()
	case *big.Int:
		y := b.Interface().(*big.Int)
		return (x == nil) == (y == nil) && (x == nil || x.Cmp(y) == 0)
	case big.Rat:
		y := b.Interface().(big.Rat)
		return x.Cmp(&y) == 0
	}
	switch a.Kind() {
	case reflect.Float32, reflect.Float64:
		fa, fb := a.Float(), b.Float()
		return math.Float64bits(fa) == math.Float64bits(fb) || (math.IsNaN(fa) && math.IsNaN(fb))
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return sameValue(a.Elem(), b.Elem())
	case reflect.Slice:
		if a.IsNil() != b.IsNil() {
			return false
		}
		fallthrough
	case reflect.Array:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !sameValue(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		it := a.MapRange()
		for it.Next() {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !sameValue(it.Value(), bv) {
				return false
			}
		}
		return true
	case reflect.Struct:
		for i := range a.NumField() {
			if !sameValue(readField(addressable(a), i), readField(addressable(b), i)) {
				return false
			}
		}
		return true
	}
	return a.Equal(b)
}

// typeGen draws result types: leaves, and slices, arrays, maps, pointers
// and structs of them, nested a few levels.
func typeGen(depth int) *rapid.Generator[reflect.Type] {
	leaves := []reflect.Type{
		reflect.TypeFor[bool](), reflect.TypeFor[int](), reflect.TypeFor[int8](), reflect.TypeFor[int16](),
		reflect.TypeFor[int32](), reflect.TypeFor[int64](), reflect.TypeFor[uint](), reflect.TypeFor[uint8](),
		reflect.TypeFor[uint16](), reflect.TypeFor[uint32](), reflect.TypeFor[uint64](),
		reflect.TypeFor[float32](), reflect.TypeFor[float64](), reflect.TypeFor[string](),
		reflect.TypeFor[[]byte](), reflect.TypeFor[[3]byte](), reflect.TypeFor[time.Time](),
		reflect.TypeFor[*big.Int](), reflect.TypeFor[netip.Addr](), reflect.TypeFor[money](),
	}
	keys := []reflect.Type{
		reflect.TypeFor[string](), reflect.TypeFor[int32](), reflect.TypeFor[uint8](),
		reflect.TypeFor[[2]int8](), reflect.TypeFor[netip.Addr](), reflect.TypeFor[bool](),
	}
	return rapid.Custom(func(t *rapid.T) reflect.Type {
		kind := 0
		if depth < 3 {
			kind = rapid.IntRange(0, 5).Draw(t, "kind")
		}
		switch kind {
		case 1:
			return reflect.SliceOf(typeGen(depth+1).Draw(t, "elem"))
		case 2:
			return reflect.ArrayOf(rapid.IntRange(0, 3).Draw(t, "len"), typeGen(depth+1).Draw(t, "elem"))
		case 3:
			return reflect.MapOf(rapid.SampledFrom(keys).Draw(t, "key"), typeGen(depth+1).Draw(t, "elem"))
		case 4:
			e := typeGen(depth+1).Draw(t, "elem")
			switch e.Kind() {
			case reflect.Pointer, reflect.Slice, reflect.Map: // refused
				return e
			}
			return reflect.PointerTo(e)
		case 5:
			n := rapid.IntRange(0, 4).Draw(t, "fields")
			fields := make([]reflect.StructField, n)
			for i := range fields {
				fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: typeGen(depth+1).Draw(t, "field")}
			}
			return reflect.StructOf(fields)
		}
		return rapid.SampledFrom(leaves).Draw(t, "leaf")
	})
}

// drawValue draws a value of type ty, nil and empty slices and maps, NaNs
// and infinities, and values at the edges of their types included.
func drawValue(t *rapid.T, ty reflect.Type, label string) reflect.Value {
	v := reflect.New(ty).Elem()
	switch ty {
	case reflect.TypeFor[time.Time]():
		if rapid.Bool().Draw(t, label+"zero") {
			return v
		}
		tm := time.Unix(rapid.Int64Range(-1e11, 1e11).Draw(t, label), rapid.Int64Range(0, 999_999_999).Draw(t, label))
		v.Set(reflect.ValueOf(tm))
		return v
	case reflect.TypeFor[*big.Int]():
		if !rapid.Bool().Draw(t, label+"nil") {
			x := new(big.Int).SetUint64(rapid.Uint64().Draw(t, label))
			x.Mul(x, x).Neg(x)
			v.Set(reflect.ValueOf(x))
		}
		return v
	case reflect.TypeFor[netip.Addr]():
		var a [16]byte
		copy(a[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, label))
		addr := netip.AddrFrom16(a)
		if rapid.Bool().Draw(t, label+"v4") {
			addr = netip.AddrFrom4([4]byte(a[:4]))
		}
		v.Set(reflect.ValueOf(addr))
		return v
	case reflect.TypeFor[money]():
		v.Set(reflect.ValueOf(money{rapid.Int64().Draw(t, label)}))
		return v
	}
	switch ty.Kind() {
	case reflect.Bool:
		v.SetBool(rapid.Bool().Draw(t, label))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := uint(ty.Bits())
		v.SetInt(rapid.Int64Range(-1<<(bits-1), 1<<(bits-1)-1).Draw(t, label))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(rapid.Uint64Range(0, math.MaxUint64>>(64-ty.Bits())).Draw(t, label))
	case reflect.Float32, reflect.Float64:
		f := rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0.1})).Draw(t, label)
		v.SetFloat(f)
	case reflect.String:
		v.SetString(rapid.String().Draw(t, label))
	case reflect.Slice:
		if rapid.Bool().Draw(t, label+"nil") {
			return v
		}
		n := rapid.IntRange(0, 3).Draw(t, label+"len")
		v.Set(reflect.MakeSlice(ty, n, n))
		for i := range n {
			v.Index(i).Set(drawValue(t, ty.Elem(), label+"[]"))
		}
	case reflect.Array:
		for i := range v.Len() {
			v.Index(i).Set(drawValue(t, ty.Elem(), label+"[]"))
		}
	case reflect.Map:
		if rapid.Bool().Draw(t, label+"nil") {
			return v
		}
		v.Set(reflect.MakeMap(ty))
		for range rapid.IntRange(0, 3).Draw(t, label+"len") {
			k := drawValue(t, ty.Key(), label+"key")
			if k.Kind() == reflect.Float32 || k.Kind() == reflect.Float64 {
				continue
			}
			v.SetMapIndex(k, drawValue(t, ty.Elem(), label+"value"))
		}
	case reflect.Pointer:
		if !rapid.Bool().Draw(t, label+"nil") {
			p := reflect.New(ty.Elem())
			p.Elem().Set(drawValue(t, ty.Elem(), label+"*"))
			v.Set(p)
		}
	case reflect.Struct:
		for i := range ty.NumField() {
			v.Field(i).Set(drawValue(t, ty.Field(i).Type, label+"."+ty.Field(i).Name))
		}
	default:
		t.Fatalf("drawValue: %s", ty)
	}
	return v
}

// TestCodecRoundTripProperty: for generated types and values, the decoded
// value is the encoded one exactly, and results written by msgpack.Marshal
// (as every earlier version stored them) decode exactly too.
func TestCodecRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ty := typeGen(0).Draw(t, "type")
		c := codecFor(ty)
		if ty.Kind() == reflect.Pointer && (ty.Elem().Kind() == reflect.Pointer || ty.Elem().Kind() == reflect.Slice || ty.Elem().Kind() == reflect.Map) {
			if !errors.Is(c.err, ErrEncode) {
				t.Fatalf("%s: got %v, want ErrEncode", ty, c.err)
			}
			return
		}
		if c.err != nil {
			t.Fatalf("%s refused: %v", ty, c.err)
		}
		v := drawValue(t, ty, "v")
		p := reflect.New(ty)
		p.Elem().Set(v)
		b, err := c.encode(p.Interface())
		if err != nil {
			t.Fatalf("encode %#v: %v", v, err)
		}
		for _, stored := range [][]byte{b, must(msgpack.Marshal(v.Interface()))} {
			q := reflect.New(ty)
			if err := c.decode(stored, q.Interface()); err != nil {
				t.Fatalf("decode %x into %s: %v", stored, ty, err)
			}
			if !sameValue(v, q.Elem()) {
				t.Fatalf("%s: stored %#v, decoded %#v", ty, v, q.Elem())
			}
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCodecNumbersFitExactly: a stored integer or float decodes into a
// numeric type exactly when the type holds it; otherwise it is an error.
func TestCodecNumbersFitExactly(t *testing.T) {
	targets := []reflect.Type{
		reflect.TypeFor[int8](), reflect.TypeFor[int16](), reflect.TypeFor[int32](), reflect.TypeFor[int64](),
		reflect.TypeFor[uint8](), reflect.TypeFor[uint16](), reflect.TypeFor[uint32](), reflect.TypeFor[uint64](),
		reflect.TypeFor[float32](), reflect.TypeFor[float64](),
	}
	rapid.Check(t, func(t *rapid.T) {
		var stored any
		var want *big.Float // the stored value, exactly
		switch rapid.IntRange(0, 3).Draw(t, "form") {
		case 0:
			n := rapid.Int64().Draw(t, "int")
			stored, want = n, new(big.Float).SetInt64(n)
		case 1:
			n := rapid.Int64Range(-70000, 70000).Draw(t, "small int")
			stored, want = n, new(big.Float).SetInt64(n)
		case 2:
			n := rapid.Uint64().Draw(t, "uint")
			stored, want = n, new(big.Float).SetUint64(n)
		default:
			f := rapid.OneOf(rapid.Float64(), rapid.SampledFrom([]float64{0.5, 1, 2, 1e300, 3.0000001})).Draw(t, "float")
			stored, want = f, big.NewFloat(f)
		}
		_, isFloat := stored.(float64)
		target := rapid.SampledFrom(targets).Draw(t, "target")
		b := must(msgpack.Marshal(stored))
		q := reflect.New(target)
		err := codecFor(target).decode(b, q.Interface())
		// Whether target holds the value exactly.
		var fits bool
		switch target.Kind() {
		case reflect.Float32, reflect.Float64:
			f, _ := want.Float64()
			if target.Kind() == reflect.Float32 {
				f = float64(float32(f))
			}
			fits = big.NewFloat(f).Cmp(want) == 0 && !math.IsInf(f, 0)
		default:
			if !isFloat && want.IsInt() {
				i, _ := want.Int(nil)
				lo, hi := new(big.Int), new(big.Int)
				if target.Kind() >= reflect.Uint {
					hi.Lsh(big.NewInt(1), uint(target.Bits())).Sub(hi, big.NewInt(1))
				} else {
					lo.Lsh(big.NewInt(1), uint(target.Bits()-1)).Neg(lo)
					hi.Lsh(big.NewInt(1), uint(target.Bits()-1)).Sub(hi, big.NewInt(1))
				}
				fits = i.Cmp(lo) >= 0 && i.Cmp(hi) <= 0
			}
		}
		if !fits {
			if err == nil {
				t.Fatalf("%v (%T) into %s: decoded %v, want an error", stored, stored, target, q.Elem())
			}
			return
		}
		if err != nil {
			t.Fatalf("%v (%T) into %s: %v", stored, stored, target, err)
		}
		var got *big.Float
		switch target.Kind() {
		case reflect.Float32, reflect.Float64:
			got = big.NewFloat(q.Elem().Float())
		case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			got = new(big.Float).SetInt64(q.Elem().Int())
		default:
			got = new(big.Float).SetUint64(q.Elem().Uint())
		}
		if got.Cmp(want) != 0 {
			t.Fatalf("%v (%T) into %s: decoded %v", stored, stored, target, got)
		}
	})
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
	Money  money
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
	c := codecClient(t)
	ctx := context.Background()
	var n atomic.Int64
	rapid.Check(t, func(t *rapid.T) {
		want := drawValue(t, reflect.TypeFor[propResult](), "r").Interface().(propResult)
		key := fmt.Sprint("prop-", n.Add(1))
		fn := func(context.Context) (propResult, error) { return want, nil }
		owner, err := Do(ctx, c, key, "", fn)
		if err != nil || !sameValue(reflect.ValueOf(want), reflect.ValueOf(owner)) {
			t.Fatalf("owner: got %+v, %v; want %+v", owner, err, want)
		}
		replay, err := Do(ctx, c, key, "", func(context.Context) (propResult, error) {
			t.Fatal("fn ran on a replay")
			return propResult{}, nil
		})
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if !sameValue(reflect.ValueOf(want), reflect.ValueOf(replay)) {
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
	c := codecClient(t)
	type result struct {
		Big   *big.Int
		Rat   big.Rat
		Addr  netip.Addr
		URL   *url.URL
		Money money
		Cash  map[string]money
	}
	u, _ := url.Parse("https://bank.example/pay?id=7#x")
	want := result{Big: big.NewInt(-12345678901234), Addr: netip.MustParseAddr("fe80::1%eth0"), URL: u,
		Money: money{-250}, Cash: map[string]money{"EUR": {100}}}
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
func TestCodecRejectsDamagedResults(t *testing.T) {
	type r struct {
		ID    string
		Lines []int64
		Tags  map[string]string
	}
	c := codecFor(reflect.TypeFor[r]())
	b := must(msgpack.Marshal(r{"x", []int64{1, 2, 3}, map[string]string{"a": "b"}}))
	for i := range len(b) {
		var got r
		if err := c.decode(b[:i], &got); err == nil {
			t.Errorf("%d of %d bytes: decoded %+v, want an error", i, len(b), got)
		}
	}
	var got r
	if err := c.decode(append(b[:len(b):len(b)], 0), &got); err == nil {
		t.Errorf("a trailing byte: decoded %+v, want an error", got)
	}
	for _, huge := range [][]byte{
		{0x81, 0xa5, 'L', 'i', 'n', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff},          // an array of 4G elements
		{0x81, 0xa4, 'T', 'a', 'g', 's', 0xdf, 0xff, 0xff, 0xff, 0xff},               // a map of 4G entries
		{0x81, 0xa2, 'I', 'D', 0xdb, 0xff, 0xff, 0xff, 0xff},                         // a string of 4 GiB
		{0x81, 0xa5, 'L', 'i', 'n', 'e', 's', 0x91, 0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0}, // 2^64-ish into int64
	} {
		if err := c.decode(huge, &got); err == nil {
			t.Errorf("%x: decoded %+v, want an error", huge, got)
		}
	}
}
