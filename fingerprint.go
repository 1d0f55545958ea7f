// fingerprint.go: Fingerprint, a stable digest of an operation's parameters.

package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"
)

// Fingerprint returns a stable digest of an operation's parameters, to pass
// to Do: calls with equal parts get equal fingerprints, in any process and
// run. Maps are hashed in sorted key order; structs by their exported
// fields in order; pointers by what they point to; time.Time by its instant
// (not its location). Values of other kinds (funcs, channels) are hashed by
// their type only. Only the digest is ever stored, never the raw values.
func Fingerprint(parts ...any) string {
	var b bytes.Buffer
	for _, p := range parts {
		encodeValue(&b, reflect.ValueOf(p))
	}
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:16])
}

var timeType = reflect.TypeFor[time.Time]()

// encodeValue writes a canonical, self-delimiting encoding of v: a kind tag,
// then the value, with lengths before variable-size parts.
func encodeValue(b *bytes.Buffer, v reflect.Value) {
	if !v.IsValid() {
		b.WriteByte('0')
		return
	}
	if v.Type() == timeType {
		t := v.Interface().(time.Time)
		b.WriteByte('T')
		writeUint(b, uint64(t.Unix()))
		writeUint(b, uint64(t.Nanosecond()))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			b.WriteString("b1")
		} else {
			b.WriteString("b0")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteByte('i')
		writeUint(b, uint64(v.Int()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		b.WriteByte('u')
		writeUint(b, v.Uint())
	case reflect.Float32, reflect.Float64:
		b.WriteByte('f')
		writeUint(b, math.Float64bits(v.Float()))
	case reflect.Complex64, reflect.Complex128:
		b.WriteByte('c')
		writeUint(b, math.Float64bits(real(v.Complex())))
		writeUint(b, math.Float64bits(imag(v.Complex())))
	case reflect.String:
		b.WriteByte('s')
		writeBytes(b, []byte(v.String()))
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b.WriteByte('B')
			by := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(by), v)
			writeBytes(b, by)
			return
		}
		b.WriteByte('l')
		writeUint(b, uint64(v.Len()))
		for i := range v.Len() {
			encodeValue(b, v.Index(i))
		}
	case reflect.Map:
		b.WriteByte('m')
		writeUint(b, uint64(v.Len()))
		type entry struct{ k, v []byte }
		entries := make([]entry, 0, v.Len())
		it := v.MapRange()
		for it.Next() {
			var kb, vb bytes.Buffer
			encodeValue(&kb, it.Key())
			encodeValue(&vb, it.Value())
			entries = append(entries, entry{kb.Bytes(), vb.Bytes()})
		}
		slices.SortFunc(entries, func(x, y entry) int { return bytes.Compare(x.k, y.k) })
		for _, e := range entries {
			b.Write(e.k)
			b.Write(e.v)
		}
	case reflect.Struct:
		t := v.Type()
		b.WriteByte('S')
		writeBytes(b, []byte(t.String()))
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() {
				writeBytes(b, []byte(f.Name))
				encodeValue(b, v.Field(i))
			}
		}
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteByte('0')
			return
		}
		encodeValue(b, v.Elem())
	default:
		b.WriteByte('?')
		writeBytes(b, []byte(fmt.Sprint(v.Type())))
	}
}

func writeUint(b *bytes.Buffer, x uint64) {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], x)
	b.Write(buf[:])
}

func writeBytes(b *bytes.Buffer, p []byte) {
	writeUint(b, uint64(len(p)))
	b.Write(p)
}
