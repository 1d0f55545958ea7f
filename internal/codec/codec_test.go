package codec_test

import (
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/codec"
	"github.com/idem-go/idem/internal/codec/codectest"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"
)

// TestRoundTripProperty: for generated types and values, the decoded
// value is the encoded one exactly, and results written by msgpack.Marshal
// (as every earlier version stored them) decode exactly too.
func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ty := codectest.TypeGen(0).Draw(t, "type")
		c := codec.For(ty)
		if ty.Kind() == reflect.Pointer && (ty.Elem().Kind() == reflect.Pointer || ty.Elem().Kind() == reflect.Slice || ty.Elem().Kind() == reflect.Map) {
			if c.Err() == nil {
				t.Fatalf("%s: accepted, want refused", ty)
			}
			return
		}
		if c.Err() != nil {
			t.Fatalf("%s refused: %v", ty, c.Err())
		}
		v := codectest.DrawValue(t, ty, "v")
		p := reflect.New(ty)
		p.Elem().Set(v)
		b, err := c.Encode(p.Interface())
		if err != nil {
			t.Fatalf("encode %#v: %v", v, err)
		}
		for _, stored := range [][]byte{b, must(msgpack.Marshal(v.Interface()))} {
			q := reflect.New(ty)
			if err := c.Decode(stored, q.Interface()); err != nil {
				t.Fatalf("decode %x into %s: %v", stored, ty, err)
			}
			if !codectest.SameValue(v, q.Elem()) {
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

// TestNumbersFitExactly: a stored integer or float decodes into a
// numeric type exactly when the type holds it; otherwise it is an error.
func TestNumbersFitExactly(t *testing.T) {
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
		err := codec.For(target).Decode(b, q.Interface())
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

func TestRejectsDamagedResults(t *testing.T) {
	type r struct {
		ID    string
		Lines []int64
		Tags  map[string]string
	}
	c := codec.For(reflect.TypeFor[r]())
	b := must(msgpack.Marshal(r{"x", []int64{1, 2, 3}, map[string]string{"a": "b"}}))
	for i := range len(b) {
		var got r
		if err := c.Decode(b[:i], &got); err == nil {
			t.Errorf("%d of %d bytes: decoded %+v, want an error", i, len(b), got)
		}
	}
	var got r
	if err := c.Decode(append(b[:len(b):len(b)], 0), &got); err == nil {
		t.Errorf("a trailing byte: decoded %+v, want an error", got)
	}
	for _, huge := range [][]byte{
		{0x81, 0xa5, 'L', 'i', 'n', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff},          // an array of 4G elements
		{0x81, 0xa4, 'T', 'a', 'g', 's', 0xdf, 0xff, 0xff, 0xff, 0xff},               // a map of 4G entries
		{0x81, 0xa2, 'I', 'D', 0xdb, 0xff, 0xff, 0xff, 0xff},                         // a string of 4 GiB
		{0x81, 0xa5, 'L', 'i', 'n', 'e', 's', 0x91, 0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0}, // 2^64-ish into int64
	} {
		if err := c.Decode(huge, &got); err == nil {
			t.Errorf("%x: decoded %+v, want an error", huge, got)
		}
	}
}

type zeroByMethod struct{ A, B int }

func (z zeroByMethod) IsZero() bool { return z.A == 0 }

// TestOmitEmpty: msgpack's omitempty is refused, naming the field, where a
// field left out would decode as another value; accepted where its empty
// value is Go's zero value.
func TestOmitEmpty(t *testing.T) {
	type embedded struct {
		_msgpack struct{} `msgpack:",omitempty"` //lint:ignore U1000 msgpack reads its tag
		Tags     []string
	}
	for _, tc := range []struct {
		t    reflect.Type
		want string // in the error; "" for accepted
	}{
		{reflect.TypeFor[struct {
			S []int `msgpack:",omitempty"`
		}](), ".S is tagged omitempty"},
		{reflect.TypeFor[struct {
			M map[int]int `msgpack:"m,omitempty"`
		}](), ".M is tagged omitempty"},
		{reflect.TypeFor[struct {
			F float32 `msgpack:",omitempty"`
		}](), "-0 would come back as 0"},
		{reflect.TypeFor[struct {
			Z zeroByMethod `msgpack:",omitempty"`
		}](), "IsZero"},
		{reflect.TypeFor[struct {
			Z *zeroByMethod `msgpack:",omitempty"`
		}](), "IsZero"},
		{reflect.TypeFor[struct {
			T time.Time `msgpack:",omitempty"`
		}](), "IsZero"},
		{reflect.TypeFor[struct {
			B big.Rat `msgpack:",omitempty"`
		}](), ".B is tagged omitempty"},
		{reflect.TypeFor[struct {
			A        int
			_msgpack struct{} `msgpack:",omitempty"` //lint:ignore U1000 msgpack reads its tag
			L        []int
		}](), ".L is tagged omitempty"},
		{reflect.TypeFor[struct {
			embedded
			ID string
		}](), ".Tags is tagged omitempty"},
		// Before _msgpack, a field is not left out.
		{reflect.TypeFor[struct {
			L        []int
			_msgpack struct{} `msgpack:",omitempty"` //lint:ignore U1000 msgpack reads its tag
			N        int
		}](), ""},
		{reflect.TypeFor[struct {
			N int64   `msgpack:",omitempty"`
			U uint    `msgpack:",omitempty"`
			S string  `msgpack:",omitempty"`
			B bool    `msgpack:",omitempty"`
			P *string `msgpack:",omitempty"`
			A [2]int  `msgpack:",omitempty"`
		}](), ""},
	} {
		err := codec.For(tc.t).Err()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", tc.t, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.t, err, tc.want)
		}
	}
}
