// fingerprint.go: Fingerprint, a stable digest of an operation's parameters,
// and FingerprintJSON, of a JSON text.

package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"reflect"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/idem-go/idem/internal/jcs"
)

// Fingerprint returns a stable digest of an operation's parameters, to pass
// to Do: calls with equal parts get equal fingerprints, in any process and
// run, and parts that differ get different ones. Only the digest is ever
// stored, never the raw values.
//
// Values are hashed by what they hold: a time.Time by its instant; a type
// with a binary or text marshaler by its type's name and marshaled bytes
// (big.Int, netip.Addr, decimal types); integers by value whatever their
// size; structs by every field, exported or not; sync types, funcs and
// channels by their type's name only; cyclic values by reference. The
// package documentation has the rules (Fingerprints).
//
// A change of the fingerprint of any value is a breaking change: a retry
// after the upgrade would get ErrConflict.
func Fingerprint(parts ...any) string {
	var b bytes.Buffer
	e := fpEncoder{b: &b, top: true}
	for _, p := range parts {
		e.value(addressable(reflect.ValueOf(p)))
	}
	var sum [sha256.Size]byte
	if e.h == nil {
		sum = sha256.Sum256(b.Bytes())
	} else {
		e.h.Write(b.Bytes())
		copy(sum[:], e.h.Sum(nil))
	}
	return hex.EncodeToString(sum[:16])
}

// fpEncoder writes the canonical encoding of values: a kind tag, then the
// value, with lengths before variable-size parts. Every value it is handed
// is addressable and readable (see field), so that marshalers with pointer
// receivers and unexported state can be reached.
type fpEncoder struct {
	b *bytes.Buffer
	// h is the hash that a large encoding streams into, once it has
	// outgrown fpSpill: what b holds then goes there. top is whether b is
	// the encoding itself, not a map entry's (sorted before it is written).
	h   hash.Hash
	top bool
	// path holds the pointers, maps and slices being encoded, outermost
	// first; on holds their positions in path, to find a cycle at once.
	path []fpRef
	on   map[fpRef]int
}

// fpRef identifies a pointer, map or slice on the path: where it points,
// its type and, for a slice, its length.
type fpRef struct {
	p   uintptr
	t   reflect.Type
	len int
}

var (
	timeType = reflect.TypeFor[time.Time]()
	binaryM  = reflect.TypeFor[encoding.BinaryMarshaler]()
	textM    = reflect.TypeFor[encoding.TextMarshaler]()
)

// value writes v, which is invalid (a nil part) or addressable.
func (e *fpEncoder) value(v reflect.Value) {
	if e.top && e.b.Len() >= fpSpill {
		e.spill()
	}
	b := e.b
	if !v.IsValid() {
		b.WriteByte('0')
		return
	}
	t := v.Type()
	if t == timeType {
		tm := v.Interface().(time.Time)
		b.WriteByte('T')
		writeUint(b, uint64(tm.Unix()))
		writeUint(b, uint64(tm.Nanosecond()))
		return
	}
	if m := marshalerOf(t); m != noMarshaler {
		if data, ok := marshal(v, m); ok {
			b.WriteByte(m.tag())
			writeBytes(b, []byte(t.String()))
			writeBytes(b, data)
			return
		}
		b.WriteByte('!')
		writeBytes(b, []byte(t.String()))
	}
	switch t.Kind() {
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
		e.large(stringBytes(v.String()))
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			b.WriteByte('B')
			if t.Kind() == reflect.Slice || v.CanAddr() {
				e.large(v.Bytes())
				return
			}
			by := make([]byte, v.Len())
			reflect.Copy(reflect.ValueOf(by), v)
			writeBytes(b, by)
			return
		}
		if t.Kind() == reflect.Slice && v.Len() > 0 {
			if !e.enter(fpRef{p: v.Pointer(), t: t, len: v.Len()}) {
				return
			}
			defer e.leave()
		}
		b.WriteByte('l')
		writeUint(b, uint64(v.Len()))
		for i := range v.Len() {
			e.value(v.Index(i))
		}
	case reflect.Map:
		if v.Len() > 0 {
			if !e.enter(fpRef{p: v.Pointer(), t: t}) {
				return
			}
			defer e.leave()
		}
		e.mapEntries(v)
	case reflect.Struct:
		b.WriteByte('S')
		writeBytes(b, []byte(t.String()))
		if pkg := t.PkgPath(); pkg == "sync" || pkg == "sync/atomic" {
			return
		}
		for i := range t.NumField() {
			writeBytes(b, []byte(t.Field(i).Name))
			e.value(readField(v, i))
		}
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteByte('0')
			return
		}
		if !e.enter(fpRef{p: v.Pointer(), t: t}) {
			return
		}
		defer e.leave()
		e.value(v.Elem())
	case reflect.Interface:
		if v.IsNil() {
			b.WriteByte('0')
			return
		}
		e.value(addressable(v.Elem()))
	default:
		b.WriteByte('?')
		writeBytes(b, []byte(t.String()))
	}
}

// mapEntries writes the entries of map v, sorted by their keys' encodings.
func (e *fpEncoder) mapEntries(v reflect.Value) {
	e.b.WriteByte('m')
	writeUint(e.b, uint64(v.Len()))
	type entry struct{ k, v []byte }
	entries := make([]entry, 0, v.Len())
	outer, top := e.b, e.top
	e.top = false
	it := v.MapRange()
	for it.Next() {
		var kb, vb bytes.Buffer
		e.b = &kb
		e.value(addressable(it.Key()))
		e.b = &vb
		e.value(addressable(it.Value()))
		entries = append(entries, entry{kb.Bytes(), vb.Bytes()})
	}
	e.b, e.top = outer, top
	// By key; by value too, for keys that encode alike (NaNs).
	slices.SortFunc(entries, func(x, y entry) int {
		if c := bytes.Compare(x.k, y.k); c != 0 {
			return c
		}
		return bytes.Compare(x.v, y.v)
	})
	for _, en := range entries {
		e.b.Write(en.k)
		e.b.Write(en.v)
	}
}

// enter puts r on the path and reports true, or, when r is on the path
// already (a cycle), writes a reference to it and reports false.
func (e *fpEncoder) enter(r fpRef) bool {
	if i, ok := e.on[r]; ok {
		e.b.WriteByte('R')
		writeUint(e.b, uint64(len(e.path)-i))
		return false
	}
	if e.on == nil {
		e.on = make(map[fpRef]int)
	}
	e.on[r] = len(e.path)
	e.path = append(e.path, r)
	return true
}

// leave takes the innermost entry off the path.
func (e *fpEncoder) leave() {
	r := e.path[len(e.path)-1]
	e.path = e.path[:len(e.path)-1]
	delete(e.on, r)
}

// readField returns field i of the addressable struct v, readable even when
// the field is unexported: Fingerprint hashes a value's whole state.
func readField(v reflect.Value, i int) reflect.Value {
	f := v.Field(i)
	if f.CanInterface() {
		return f
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}

// addressable returns v, or an addressable copy of it.
func addressable(v reflect.Value) reflect.Value {
	if !v.IsValid() || v.CanAddr() {
		return v
	}
	c := reflect.New(v.Type()).Elem()
	c.Set(v)
	return c
}

// fpMarshaler is how Fingerprint hashes a type: by a marshaler of the type
// itself or of a pointer to it, or by its structure.
type fpMarshaler uint8

const (
	noMarshaler fpMarshaler = iota
	binaryValue
	binaryPointer
	textValue
	textPointer
)

func (m fpMarshaler) tag() byte {
	if m == binaryValue || m == binaryPointer {
		return 'M'
	}
	return 'X'
}

var fpMarshalers sync.Map // reflect.Type -> fpMarshaler

// marshalerOf returns the marshaler that Fingerprint uses for t.
func marshalerOf(t reflect.Type) fpMarshaler {
	if m, ok := fpMarshalers.Load(t); ok {
		return m.(fpMarshaler)
	}
	m := noMarshaler
	if k := t.Kind(); k != reflect.Pointer && k != reflect.Interface {
		pt := reflect.PointerTo(t)
		switch {
		case t.Implements(binaryM):
			m = binaryValue
		case pt.Implements(binaryM):
			m = binaryPointer
		case t.Implements(textM):
			m = textValue
		case pt.Implements(textM):
			m = textPointer
		}
	}
	fpMarshalers.Store(t, m)
	return m
}

// marshal returns what marshaler m makes of the addressable v; false if
// it fails or panics.
func marshal(v reflect.Value, m fpMarshaler) (data []byte, ok bool) {
	defer func() {
		if recover() != nil {
			data, ok = nil, false
		}
	}()
	if m == binaryPointer || m == textPointer {
		v = v.Addr()
	}
	var err error
	switch m {
	case binaryValue, binaryPointer:
		data, err = v.Interface().(encoding.BinaryMarshaler).MarshalBinary()
	default:
		data, err = v.Interface().(encoding.TextMarshaler).MarshalText()
	}
	return data, err == nil
}

// fpSpill is the size from which an encoding streams into the hash.
const fpSpill = 64 << 10

// spill moves what e.b holds into the hash.
func (e *fpEncoder) spill() {
	if e.h == nil {
		e.h = sha256.New()
	}
	e.h.Write(e.b.Bytes())
	e.b.Reset()
}

// large writes p as writeBytes does, straight into the hash when it is
// large: a large string or byte slice is hashed where it lies.
func (e *fpEncoder) large(p []byte) {
	if !e.top || len(p) < fpSpill {
		writeBytes(e.b, p)
		return
	}
	writeUint(e.b, uint64(len(p)))
	e.spill()
	e.h.Write(p)
}

// stringBytes returns the bytes of s without a copy, for a hash to read.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func writeUint(b *bytes.Buffer, x uint64) {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], x)
	b.Write(buf[:])
}

func writeBytes(b *bytes.Buffer, p []byte) {
	writeUint(b, uint64(len(p)))
	b.Write(p)
}

// FingerprintJSON returns a fingerprint of a JSON text, to pass to Do:
// texts that are one JSON value once canonicalised under RFC 8785 (the
// JSON Canonicalization Scheme) get one fingerprint, whatever their
// member order and whitespace, so that {"a":1,"b":2} and { "b":2, "a":1 }
// are one operation. It has the format of Fingerprint's (32 hexadecimal
// digits) but never equals a Fingerprint of anything.
//
// Invalid JSON is an error, and so is what RFC 8785 refuses: invalid
// UTF-8, a lone surrogate, two members of one name, a number beyond a
// double's range, nesting deeper than 10000. Its cost is linear in the
// text's size.
//
// Numbers are compared as IEEE 754 doubles, as RFC 8785 prescribes:
// 1, 1.0 and 1e0 are one number, and so are integers that differ only
// beyond 2^53 (9007199254740993 and 9007199254740992). Send values that
// must compare exactly (large ids, amounts with more than 15 significant
// digits) as JSON strings, or see httpidem.DefaultFingerprint, which
// compares numbers exactly.
//
// The fingerprint of a JSON text is stable across releases: a change to it
// is a breaking change.
func FingerprintJSON(body []byte) (string, error) {
	c, err := jcs.Canonical(body)
	if err != nil {
		return "", err
	}
	return jcs.Digest(c), nil
}
