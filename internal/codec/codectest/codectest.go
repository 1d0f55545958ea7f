// Package codectest has what the tests of the typed Do and of its codec
// share: generators of result types and values (rapid), and the equality
// a replay must meet.
package codectest

import (
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"reflect"
	"time"
	"unsafe"

	"pgregory.net/rapid"
)

// Money is a fixed-point amount with unexported state and a text form.
type Money struct{ cents int64 }

// NewMoney returns an amount of cents.
func NewMoney(cents int64) Money { return Money{cents} }

func (m Money) MarshalText() ([]byte, error) { return []byte(fmt.Sprint(m.cents)), nil }
func (m *Money) UnmarshalText(b []byte) error {
	_, err := fmt.Sscan(string(b), &m.cents)
	return err
}

// SameValue reports whether a replayed value b is the owner's value a:
// reflect.DeepEqual, except that floats compare by bits (NaN is NaN),
// times by instant and location, and big numbers by value.
func SameValue(a, b reflect.Value) bool {
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
		return SameValue(a.Elem(), b.Elem())
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
			if !SameValue(a.Index(i), b.Index(i)) {
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
			if !bv.IsValid() || !SameValue(it.Value(), bv) {
				return false
			}
		}
		return true
	case reflect.Struct:
		for i := range a.NumField() {
			if !SameValue(field(a, i), field(b, i)) {
				return false
			}
		}
		return true
	}
	return a.Equal(b)
}

// TypeGen draws result types: leaves, and slices, arrays, maps, pointers
// and structs of them, nested a few levels.
func TypeGen(depth int) *rapid.Generator[reflect.Type] {
	leaves := []reflect.Type{
		reflect.TypeFor[bool](), reflect.TypeFor[int](), reflect.TypeFor[int8](), reflect.TypeFor[int16](),
		reflect.TypeFor[int32](), reflect.TypeFor[int64](), reflect.TypeFor[uint](), reflect.TypeFor[uint8](),
		reflect.TypeFor[uint16](), reflect.TypeFor[uint32](), reflect.TypeFor[uint64](),
		reflect.TypeFor[float32](), reflect.TypeFor[float64](), reflect.TypeFor[string](),
		reflect.TypeFor[[]byte](), reflect.TypeFor[[3]byte](), reflect.TypeFor[time.Time](),
		reflect.TypeFor[*big.Int](), reflect.TypeFor[netip.Addr](), reflect.TypeFor[Money](),
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
			return reflect.SliceOf(TypeGen(depth+1).Draw(t, "elem"))
		case 2:
			return reflect.ArrayOf(rapid.IntRange(0, 3).Draw(t, "len"), TypeGen(depth+1).Draw(t, "elem"))
		case 3:
			return reflect.MapOf(rapid.SampledFrom(keys).Draw(t, "key"), TypeGen(depth+1).Draw(t, "elem"))
		case 4:
			e := TypeGen(depth+1).Draw(t, "elem")
			switch e.Kind() {
			case reflect.Pointer, reflect.Slice, reflect.Map: // refused
				return e
			}
			return reflect.PointerTo(e)
		case 5:
			n := rapid.IntRange(0, 4).Draw(t, "fields")
			fields := make([]reflect.StructField, n)
			for i := range fields {
				fields[i] = reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: TypeGen(depth+1).Draw(t, "field")}
			}
			return reflect.StructOf(fields)
		}
		return rapid.SampledFrom(leaves).Draw(t, "leaf")
	})
}

// DrawValue draws a value of type ty, nil and empty slices and maps, NaNs
// and infinities, and values at the edges of their types included.
func DrawValue(t *rapid.T, ty reflect.Type, label string) reflect.Value {
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
	case reflect.TypeFor[Money]():
		v.Set(reflect.ValueOf(Money{rapid.Int64().Draw(t, label)}))
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
			v.Index(i).Set(DrawValue(t, ty.Elem(), label+"[]"))
		}
	case reflect.Array:
		for i := range v.Len() {
			v.Index(i).Set(DrawValue(t, ty.Elem(), label+"[]"))
		}
	case reflect.Map:
		if rapid.Bool().Draw(t, label+"nil") {
			return v
		}
		v.Set(reflect.MakeMap(ty))
		for range rapid.IntRange(0, 3).Draw(t, label+"len") {
			k := DrawValue(t, ty.Key(), label+"key")
			if k.Kind() == reflect.Float32 || k.Kind() == reflect.Float64 {
				continue
			}
			v.SetMapIndex(k, DrawValue(t, ty.Elem(), label+"value"))
		}
	case reflect.Pointer:
		if !rapid.Bool().Draw(t, label+"nil") {
			p := reflect.New(ty.Elem())
			p.Elem().Set(DrawValue(t, ty.Elem(), label+"*"))
			v.Set(p)
		}
	case reflect.Struct:
		for i := range ty.NumField() {
			v.Field(i).Set(DrawValue(t, ty.Field(i).Type, label+"."+ty.Field(i).Name))
		}
	default:
		t.Fatalf("drawValue: %s", ty)
	}
	return v
}

// field returns field i of struct v, readable even when unexported.
func field(v reflect.Value, i int) reflect.Value {
	if !v.CanAddr() {
		c := reflect.New(v.Type()).Elem()
		c.Set(v)
		v = c
	}
	f := v.Field(i)
	if f.CanInterface() {
		return f
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}
