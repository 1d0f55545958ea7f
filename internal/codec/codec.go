// Package codec stores the results of idem's typed Do: msgpack, with the
// result type checked before fn first runs, and stored results decoded
// strictly, so that a replay is the owner's value or an error, never a
// guess.
package codec

import (
	"bytes"
	"encoding"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The format is msgpack as msgpack.Marshal writes it (so that results
// stored by earlier versions still decode): structs as maps from field
// names (or their msgpack tag names) to values, with embedded structs
// inlined as msgpack inlines them; time.Time as msgpack's timestamp; types
// with msgpack's or encoding's marshalers as their marshalers write them.
// What msgpack would lose is refused (see checkType), and decoding is
// written here, not left to msgpack, because msgpack's decoding is
// lenient: it truncates 300 into a uint8, drops unknown fields, and
// rounds 1.5 into an int.

// maxDepth bounds the nesting of a stored result: a cyclic value would
// nest forever, and a damaged record should not exhaust the stack.
const maxDepth = 10000

// A Codec encodes and decodes the values of one type T.
type Codec struct {
	t   reflect.Type
	err error // why T is refused, or nil
	// recursive is whether T can contain itself (through pointers,
	// slices or maps): only then can a value be cyclic, so only then is
	// each value walked before it is encoded.
	recursive bool
}

var codecs sync.Map // reflect.Type -> *Codec

// For returns the codec of t, checking t the first time.
func For(t reflect.Type) *Codec {
	if c, ok := codecs.Load(t); ok {
		return c.(*Codec)
	}
	c := &Codec{t: t}
	ch := typeChecker{on: map[reflect.Type]bool{}}
	c.err = ch.check(t, t.String(), true)
	c.recursive = ch.recursive
	v, _ := codecs.LoadOrStore(t, c)
	return v.(*Codec)
}

// Type returns T.
func (c *Codec) Type() reflect.Type { return c.t }

// Err says why some values of T would not come back exactly as they were
// stored, naming the field or element; nil if every value does. Encode and
// Decode must not be used then.
func (c *Codec) Err() error { return c.err }

// Encode returns the msgpack encoding of *p, a pointer to a T, or an error
// for a value that cannot be stored (a cyclic one, or one whose marshaler
// fails).
func (c *Codec) Encode(p any) ([]byte, error) {
	if c.recursive {
		w := valueWalker{on: map[ref]bool{}}
		if err := w.walk(reflect.ValueOf(p).Elem(), c.t.String(), 0); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	if err := msgpack.NewEncoder(&buf).Encode(p); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Decode decodes b, as Encode (or msgpack.Marshal) wrote a T, into *p, a
// pointer to a zero T: exactly, or an error that says where it does not
// fit.
func (c *Codec) Decode(b []byte, p any) error {
	r := bytes.NewReader(b)
	d := decoder{d: msgpack.NewDecoder(r), r: r}
	if err := d.value(reflect.ValueOf(p).Elem(), 0); err != nil {
		return err
	}
	if r.Len() > 0 {
		return fmt.Errorf("%d bytes after the value", r.Len())
	}
	return nil
}

// A family is how msgpack encodes the values of a type: by their own
// marshaler, by the timestamp extension (time.Time), or by their kind.
type family uint8

const (
	byKind family = iota
	byTime
	byCustom    // msgpack.CustomEncoder, msgpack.CustomDecoder
	byMsgpack   // msgpack.Marshaler, msgpack.Unmarshaler
	byBinary    // encoding.BinaryMarshaler, encoding.BinaryUnmarshaler
	byText      // encoding.TextMarshaler, encoding.TextUnmarshaler
	byMismatch  // the encoder's marshaler and the decoder's differ
	byEncodeOne // a marshaler without its unmarshaler
)

var familyNames = [...]string{
	byCustom: "msgpack.CustomEncoder", byMsgpack: "msgpack.Marshaler",
	byBinary: "encoding.BinaryMarshaler", byText: "encoding.TextMarshaler",
}

var (
	encoders = [...]reflect.Type{
		reflect.TypeFor[msgpack.CustomEncoder](), reflect.TypeFor[msgpack.Marshaler](),
		reflect.TypeFor[encoding.BinaryMarshaler](), reflect.TypeFor[encoding.TextMarshaler](),
	}
	decoders = [...]reflect.Type{
		reflect.TypeFor[msgpack.CustomDecoder](), reflect.TypeFor[msgpack.Unmarshaler](),
		reflect.TypeFor[encoding.BinaryUnmarshaler](), reflect.TypeFor[encoding.TextUnmarshaler](),
	}
)

// typeFamily is what msgpack does with the values of a type, and whether
// its marshaler needs an addressable value (a method on the pointer).
type typeFamily struct {
	f       family
	pointer bool // the encoder's method has a pointer receiver
}

var families sync.Map // reflect.Type -> typeFamily

// familyOf returns how msgpack encodes and decodes t, found as msgpack
// finds it: the type's own method set first, then its pointer's, each in
// the order custom, msgpack, binary, text.
func familyOf(t reflect.Type) typeFamily {
	if f, ok := families.Load(t); ok {
		return f.(typeFamily)
	}
	var tf typeFamily
	switch {
	case t == timeType:
		tf.f = byTime
	case t.Kind() == reflect.Pointer && t.Elem() == timeType:
		// msgpack encodes *time.Time as a pointer to its registered type.
	case t.Kind() == reflect.Interface:
		// Refused by check, whatever methods it lists.
	default:
		enc, encPtr := find(t, encoders[:])
		dec, _ := find(t, decoders[:])
		switch {
		case enc == byKind && dec == byKind:
		case enc == byKind || dec == byKind:
			tf.f = byEncodeOne
		case enc != dec:
			tf.f = byMismatch
		default:
			tf.f = enc
		}
		tf.pointer = encPtr
	}
	families.Store(t, tf)
	return tf
}

// find returns the first of ifaces (in family order) that t implements,
// or its pointer does when t is not a pointer itself.
func find(t reflect.Type, ifaces []reflect.Type) (f family, pointer bool) {
	for i, it := range ifaces {
		if t.Implements(it) {
			return byCustom + family(i), false
		}
	}
	if t.Kind() != reflect.Pointer {
		pt := reflect.PointerTo(t)
		for i, it := range ifaces {
			if pt.Implements(it) {
				return byCustom + family(i), true
			}
		}
	}
	return byKind, false
}

// A typeChecker checks that every value of a type round-trips exactly.
type typeChecker struct {
	on        map[reflect.Type]bool // types being checked, to stop at recursion
	recursive bool
}

// check reports why values of t, at path, cannot round-trip exactly, or
// nil. addressable says whether the values are addressable when encoded
// (not map keys and values): a marshaler with a pointer receiver needs it.
func (ch *typeChecker) check(t reflect.Type, path string, addressable bool) error {
	tf := familyOf(t)
	switch tf.f {
	case byTime:
		return nil
	case byMismatch:
		return fmt.Errorf("%s: %s encodes with one marshaler and decodes with another", path, t)
	case byEncodeOne:
		return fmt.Errorf("%s: %s has a marshaler without the matching unmarshaler, or the reverse", path, t)
	case byKind:
	default:
		if tf.pointer && !addressable {
			return fmt.Errorf("%s: the %s of %s has a pointer receiver, which msgpack cannot call in a map (use *%s)",
				path, familyNames[tf.f], t, t)
		}
		return nil // the marshaler's business
	}
	if ch.on[t] {
		ch.recursive = true
		return nil
	}
	ch.on[t] = true
	defer delete(ch.on, t)
	switch k := t.Kind(); k {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return nil
	case reflect.Pointer:
		switch t.Elem().Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
			// A pointer to a nil slice is stored as nil: it would come
			// back as a nil pointer.
			return fmt.Errorf("%s: %s: a pointer to a %s does not round-trip (a pointer to nil is stored as nil)", path, t, t.Elem().Kind())
		}
		return ch.check(t.Elem(), "(*"+path+")", true)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil // bytes
		}
		return ch.check(t.Elem(), path+"[]", true)
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
		return ch.check(t.Elem(), path+"[]", addressable)
	case reflect.Map:
		if hasPointer(t.Key(), map[reflect.Type]bool{}) {
			return fmt.Errorf("%s: map keys of %s would not come back equal (they hold pointers or times)", path, t.Key())
		}
		if err := ch.check(t.Key(), path+"[key]", false); err != nil {
			return err
		}
		return ch.check(t.Elem(), path+"[value]", false)
	case reflect.Struct:
		fields, err := structFields(t)
		if err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
		for _, f := range fields.list {
			if f.omitEmpty {
				if err := omitsExactly(f.t); err != nil {
					return fmt.Errorf("%s.%s is tagged omitempty (on the field or on _msgpack): %v", path, f.goName, err)
				}
			}
			if err := ch.check(f.t, path+"."+f.goName, addressable); err != nil {
				return err
			}
		}
		return nil
	case reflect.Interface:
		return fmt.Errorf("%s: %s: an interface value does not come back as its own type (an int may come back as an int8)", path, t)
	default: // chan, func, complex, uintptr, unsafe.Pointer
		return fmt.Errorf("%s: %s: msgpack cannot store a %s", path, t, k)
	}
}

var isZeroer = reflect.TypeFor[interface{ IsZero() bool }]()

// omitsExactly says why a field of type t that msgpack leaves out when
// empty (omitempty) may decode as another value, or nil: msgpack calls a
// value empty when its IsZero method says so, or by its kind, and a field
// left out decodes as Go's zero value.
func omitsExactly(t reflect.Type) error {
	if t.Implements(isZeroer) {
		return fmt.Errorf("a %s whose IsZero is true would come back as the zero value", t)
	}
	switch t.Kind() {
	case reflect.Bool, reflect.String, reflect.Pointer, reflect.Array,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return nil // empty only as Go's zero value (an array: only if of length 0)
	case reflect.Float32, reflect.Float64:
		return fmt.Errorf("-0 would come back as 0")
	case reflect.Slice, reflect.Map:
		return fmt.Errorf("an empty %s that is not nil would come back nil", t)
	}
	return fmt.Errorf("msgpack would leave out a %s whose fields it leaves out, or has none, and it would come back as the zero value", t)
}

// hasPointer reports whether values of t hold pointers (or interfaces),
// which are compared by address: a map key that holds one would not
// equal the original key after a round trip. Marshaled types are compared
// as their marshalers write them; time.Time holds its location.
func hasPointer(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if f := familyOf(t).f; f != byKind && f != byTime {
		return false
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Slice, reflect.Map, reflect.UnsafePointer, reflect.Chan, reflect.Func:
		return true
	case reflect.Array:
		return hasPointer(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointer(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// fieldSet is how msgpack stores a struct type: its fields by stored name.
type fieldSet struct {
	list   []storedField
	byName map[string]*storedField // names and aliases
}

type storedField struct {
	pos       int    // in fieldSet.list
	name      string // as stored
	goName    string // for messages
	index     []int  // for reflect.Value.FieldByIndex
	t         reflect.Type
	omitEmpty bool // msgpack leaves the field out when it finds it empty
}

var fieldSets sync.Map // reflect.Type -> *fieldSet or error

// structFields returns the fields msgpack stores for struct type t, found
// as msgpack finds them, or why t cannot round-trip: a field msgpack skips
// (unexported, or tagged "-") would come back as its zero value.
func structFields(t reflect.Type) (*fieldSet, error) {
	if v, ok := fieldSets.Load(t); ok {
		if err, ok := v.(error); ok {
			return nil, err
		}
		return v.(*fieldSet), nil
	}
	fs := &fieldSet{byName: map[string]*storedField{}}
	err := fs.add(t, nil)
	if err == nil {
		for i := range fs.list {
			fs.list[i].pos = i
			fs.byName[fs.list[i].name] = &fs.list[i]
		}
		for i := range fs.list { // aliases, which add checked for clashes
			for _, a := range fs.list[i].aliases(t) {
				fs.byName[a] = &fs.list[i]
			}
		}
		fieldSets.Store(t, fs)
		return fs, nil
	}
	fieldSets.Store(t, err)
	return nil, err
}

// add appends the stored fields of struct type t, whose values sit at
// index within the outer struct, as msgpack's getFields lists them.
func (fs *fieldSet) add(t reflect.Type, index []int) error {
	has := func(name string) bool {
		for _, f := range fs.list {
			if f.name == name {
				return true
			}
		}
		return false
	}
	omitAll := false // a _msgpack field tagged omitempty, for the fields after it
	for i := range t.NumField() {
		f := t.Field(i)
		tag, err := parseTag(f.Tag.Get("msgpack"))
		if err != nil {
			return fmt.Errorf("field %s: %v", f.Name, err)
		}
		if f.Name == "_msgpack" {
			if tag.options["as_array"] || tag.options["asArray"] {
				return fmt.Errorf("msgpack:%q on _msgpack is not supported", f.Tag.Get("msgpack"))
			}
			omitAll = omitAll || tag.options["omitempty"]
			continue
		}
		if f.Name == "_" {
			continue // holds nothing
		}
		if tag.name == "-" {
			return fmt.Errorf("field %s is tagged msgpack:\"-\": it would come back as its zero value", f.Name)
		}
		if !f.IsExported() && !f.Anonymous {
			return fmt.Errorf("field %s is unexported: msgpack does not store it, so it would come back as its zero value", f.Name)
		}
		if tag.options["intern"] {
			return fmt.Errorf("field %s: msgpack's intern option is not supported", f.Name)
		}
		name := tag.name
		if name == "" {
			name = f.Name
		}
		at := append(index[:len(index):len(index)], i)
		if f.Anonymous && !tag.options["noinline"] {
			inline, err := fs.inline(f, tag, has)
			if err != nil {
				return err
			}
			if inline {
				if err := fs.add(f.Type, at); err != nil {
					return err
				}
				continue
			}
		}
		if !f.IsExported() {
			return fmt.Errorf("embedded field %s is unexported: msgpack cannot set it", f.Name)
		}
		if has(name) {
			return fmt.Errorf("field %s: two fields are stored as %q", f.Name, name)
		}
		fs.list = append(fs.list, storedField{name: name, goName: f.Name, index: at, t: f.Type,
			omitEmpty: omitAll || tag.options["omitempty"]})
	}
	return nil
}

// inline reports whether msgpack inlines the embedded field f (its fields
// stored as the outer struct's), refusing what it would inline lossily.
func (fs *fieldSet) inline(f reflect.StructField, tag structTag, has func(string) bool) (bool, error) {
	t := f.Type
	plain := func(t reflect.Type) bool { return t.Kind() == reflect.Struct && familyOf(t).f == byKind }
	if t.Kind() == reflect.Pointer {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if plain(t) {
			// msgpack would inline it, and a nil pointer comes back as
			// a pointer to a zero struct.
			return false, fmt.Errorf("embedded field %s: msgpack inlines an embedded pointer to a struct, which does not round-trip; embed the struct or give the field a name", f.Name)
		}
		return false, nil
	}
	if !plain(t) {
		if tag.options["inline"] {
			return false, fmt.Errorf("embedded field %s: msgpack's inline option on %s is not supported", f.Name, t)
		}
		return false, nil
	}
	inner, err := structFields(t)
	if err != nil {
		return false, fmt.Errorf("embedded field %s: %v", f.Name, err)
	}
	for _, g := range inner.list {
		if has(g.name) {
			if tag.options["inline"] {
				return false, fmt.Errorf("embedded field %s: its field %s is shadowed, so msgpack would not store it", f.Name, g.goName)
			}
			return false, nil // msgpack stores it as one field then
		}
	}
	return true, nil
}

// aliases returns the alias names msgpack decodes into f (tag option
// alias), found again from the outer struct type t.
func (f *storedField) aliases(t reflect.Type) []string {
	sf := t.FieldByIndex(f.index)
	tag, _ := parseTag(sf.Tag.Get("msgpack"))
	if a, ok := tag.values["alias"]; ok && a != "" {
		return []string{a}
	}
	return nil
}

// structTag is a msgpack struct tag: name,option,option:value.
type structTag struct {
	name    string
	options map[string]bool
	values  map[string]string
}

// parseTag parses a msgpack struct tag in the forms msgpack documents;
// quoted and escaped forms are refused rather than guessed at.
func parseTag(s string) (structTag, error) {
	tag := structTag{options: map[string]bool{}, values: map[string]string{}}
	if strings.ContainsAny(s, `'\()`) {
		return tag, fmt.Errorf("msgpack tag %q: quoted or escaped tags are not supported", s)
	}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		k, v, hasValue := strings.Cut(part, ":")
		switch {
		case i == 0 && !hasValue:
			tag.name = part
		case hasValue:
			tag.options[strings.TrimSpace(k)] = true
			tag.values[strings.TrimSpace(k)] = strings.TrimSpace(v)
		case part != "":
			tag.options[part] = true
		}
	}
	return tag, nil
}

// A valueWalker looks for cycles (and absurd depth) in a value of a
// recursive type before it is encoded: msgpack would recurse forever.
type valueWalker struct {
	on map[ref]bool
}

// ref identifies a pointer, map or slice on the walker's path: where it
// points, its type and, for a slice, its length.
type ref struct {
	p   uintptr
	t   reflect.Type
	len int
}

var timeType = reflect.TypeFor[time.Time]()

func (w *valueWalker) walk(v reflect.Value, path string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%s: nested more than %d levels deep", path, maxDepth)
	}
	t := v.Type()
	if familyOf(t).f != byKind {
		return nil
	}
	enter := func(r ref) error {
		if w.on[r] {
			return fmt.Errorf("%s: a cyclic value (it contains itself)", path)
		}
		w.on[r] = true
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		r := ref{p: v.Pointer(), t: t}
		if err := enter(r); err != nil {
			return err
		}
		defer delete(w.on, r)
		return w.walk(v.Elem(), "(*"+path+")", depth+1)
	case reflect.Slice:
		if v.Len() == 0 || t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
		r := ref{p: v.Pointer(), t: t, len: v.Len()}
		if err := enter(r); err != nil {
			return err
		}
		defer delete(w.on, r)
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			if err := w.walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	case reflect.Map:
		if v.Len() == 0 {
			return nil
		}
		r := ref{p: v.Pointer(), t: t}
		if err := enter(r); err != nil {
			return err
		}
		defer delete(w.on, r)
		it := v.MapRange()
		for it.Next() {
			if err := w.walk(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key()), depth+1); err != nil {
				return err
			}
		}
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() || f.Anonymous {
				if err := w.walk(v.Field(i), path+"."+f.Name, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// A decoder decodes a stored result into a value of the result type,
// strictly: anything that would not give back the stored value exactly is
// an error that says where.
type decoder struct {
	d    *msgpack.Decoder
	r    *bytes.Reader // what d reads, to bound lengths by the bytes left
	name []byte        // the field name being read, reused
}

// value decodes the next stored value into the addressable zero value v.
func (d *decoder) value(v reflect.Value, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested more than %d levels deep", maxDepth)
	}
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	t := v.Type()
	tf := familyOf(t)
	switch tf.f {
	case byTime:
		tm, err := d.d.DecodeTime()
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(tm))
		return nil
	case byCustom, byMsgpack:
		return d.d.DecodeValue(v) // the type's own decoder
	case byBinary, byText:
		if c == msgpcode.Nil {
			return d.d.DecodeNil() // v stays zero, as msgpack leaves it
		}
		data, err := d.d.DecodeBytes()
		if err != nil {
			return err
		}
		target := v
		if t.Kind() != reflect.Pointer {
			target = v.Addr()
		} else {
			v.Set(reflect.New(t.Elem()))
		}
		if tf.f == byBinary {
			return target.Interface().(encoding.BinaryUnmarshaler).UnmarshalBinary(data)
		}
		return target.Interface().(encoding.TextUnmarshaler).UnmarshalText(data)
	}
	if msgpcode.IsExt(c) || msgpcode.IsFixedExt(c) {
		// A type registered with msgpack.RegisterExt: its own decoder.
		return d.d.DecodeValue(v)
	}
	switch t.Kind() {
	case reflect.Bool:
		if c != msgpcode.True && c != msgpcode.False {
			return d.mismatch(c, t)
		}
		b, err := d.d.DecodeBool()
		v.SetBool(b)
		return err
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := d.number(c, t)
		if err != nil {
			return err
		}
		return n.setInt(v)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := d.number(c, t)
		if err != nil {
			return err
		}
		return n.setUint(v)
	case reflect.Float32, reflect.Float64:
		n, err := d.number(c, t)
		if err != nil {
			return err
		}
		return n.setFloat(v)
	case reflect.String:
		if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
			return d.mismatch(c, t)
		}
		b, err := d.bytes()
		v.SetString(string(b))
		return err
	case reflect.Pointer:
		if c == msgpcode.Nil {
			return d.d.DecodeNil()
		}
		p := reflect.New(t.Elem())
		if err := d.value(p.Elem(), depth+1); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case reflect.Slice:
		if c == msgpcode.Nil {
			return d.d.DecodeNil()
		}
		if t.Elem().Kind() == reflect.Uint8 {
			if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
				return d.mismatch(c, t)
			}
			n, err := d.d.DecodeBytesLen()
			if err != nil {
				return err
			}
			if n > d.r.Len() {
				return fmt.Errorf("%d bytes stored, %d left", n, d.r.Len())
			}
			s := reflect.MakeSlice(t, n, n)
			v.Set(s)
			return d.d.ReadFull(s.Bytes())
		}
		n, err := d.arrayLen(c, t)
		if err != nil {
			return err
		}
		v.Set(reflect.MakeSlice(t, n, n))
		return d.elements(v, depth)
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
				return d.mismatch(c, t)
			}
			n, err := d.d.DecodeBytesLen()
			if err != nil {
				return err
			}
			if n != t.Len() {
				return fmt.Errorf("%d bytes stored, %s holds %d", n, t, t.Len())
			}
			return d.d.ReadFull(v.Bytes())
		}
		n, err := d.arrayLen(c, t)
		if err != nil {
			return err
		}
		if n != t.Len() {
			return fmt.Errorf("%d elements stored, %s holds %d", n, t, t.Len())
		}
		return d.elements(v, depth)
	case reflect.Map:
		if c == msgpcode.Nil {
			return d.d.DecodeNil()
		}
		if !isMap(c) {
			return d.mismatch(c, t)
		}
		n, err := d.d.DecodeMapLen()
		if err != nil {
			return err
		}
		if 2*n > d.r.Len() {
			return fmt.Errorf("%d entries stored, %d bytes left", n, d.r.Len())
		}
		m := reflect.MakeMapWithSize(t, n)
		for range n {
			k := reflect.New(t.Key()).Elem()
			if err := d.value(k, depth+1); err != nil {
				return fmt.Errorf("a key: %w", err)
			}
			e := reflect.New(t.Elem()).Elem()
			if err := d.value(e, depth+1); err != nil {
				return fmt.Errorf("[%v]: %w", k, err)
			}
			if m.MapIndex(k).IsValid() {
				return fmt.Errorf("key %v stored twice", k)
			}
			m.SetMapIndex(k, e)
		}
		v.Set(m)
		return nil
	case reflect.Struct:
		return d.structure(v, c, depth)
	}
	return fmt.Errorf("cannot decode into %s", t) // refused by check
}

// structure decodes a struct stored as a map of its fields.
func (d *decoder) structure(v reflect.Value, c byte, depth int) error {
	t := v.Type()
	fields, err := structFields(t)
	if err != nil {
		return err
	}
	if !isMap(c) {
		return d.mismatch(c, t)
	}
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return err
	}
	var (
		seenSmall [16]bool
		seen      []bool // by field position: a field stored twice is an error
	)
	if len(fields.list) <= len(seenSmall) {
		seen = seenSmall[:len(fields.list)]
	} else {
		seen = make([]bool, len(fields.list))
	}
	for range n {
		c, err := d.d.PeekCode()
		if err != nil {
			return err
		}
		if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
			return fmt.Errorf("%s: a field name stored as %s", t, codeName(c))
		}
		n, err := d.d.DecodeBytesLen()
		if err != nil {
			return err
		}
		if n < 0 || n > d.r.Len() {
			return fmt.Errorf("a field name of %d bytes, %d left", n, d.r.Len())
		}
		d.name = append(d.name[:0], make([]byte, n)...)
		if err := d.d.ReadFull(d.name); err != nil {
			return err
		}
		f := fields.byName[string(d.name)]
		if f == nil {
			return fmt.Errorf("stored field %q is not in %s (renamed or removed?)", d.name, t)
		}
		if seen[f.pos] {
			return fmt.Errorf("field %s of %s stored twice", f.goName, t)
		}
		seen[f.pos] = true
		if err := d.value(v.FieldByIndex(f.index), depth+1); err != nil {
			return fmt.Errorf(".%s: %w", f.goName, err)
		}
	}
	return nil
}

// elements decodes the elements of the slice or array v.
func (d *decoder) elements(v reflect.Value, depth int) error {
	for i := range v.Len() {
		if err := d.value(v.Index(i), depth+1); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return nil
}

// arrayLen reads the length of a stored array, bounded by the bytes left.
func (d *decoder) arrayLen(c byte, t reflect.Type) (int, error) {
	if !msgpcode.IsFixedArray(c) && c != msgpcode.Array16 && c != msgpcode.Array32 {
		return 0, d.mismatch(c, t)
	}
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("%d elements stored, %d bytes left", n, d.r.Len())
	}
	return n, nil
}

// bytes reads a stored string or byte string.
func (d *decoder) bytes() ([]byte, error) {
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > d.r.Len() {
		return nil, fmt.Errorf("%d bytes stored, %d left", n, d.r.Len())
	}
	b := make([]byte, max(n, 0))
	return b, d.d.ReadFull(b)
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func (d *decoder) mismatch(c byte, t reflect.Type) error {
	return fmt.Errorf("%s stored where %s was expected", codeName(c), t)
}

// codeName names what a msgpack code starts, for messages.
func codeName(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "a bool"
	case msgpcode.IsFixedNum(c), c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		return "an integer"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "a float"
	case msgpcode.IsString(c):
		return "a string"
	case msgpcode.IsBin(c):
		return "bytes"
	case msgpcode.IsFixedArray(c), c == msgpcode.Array16, c == msgpcode.Array32:
		return "an array"
	case isMap(c):
		return "a map"
	case msgpcode.IsExt(c), msgpcode.IsFixedExt(c):
		return "an extension"
	}
	return fmt.Sprintf("code %#x", c)
}

// A number is a stored number: an integer (i, or u when it does not fit
// an int64) or a float.
type number struct {
	kind byte // 'i', 'u' or 'f'
	i    int64
	u    uint64
	f    float64
}

// number reads a stored number for a field of type t.
func (d *decoder) number(c byte, t reflect.Type) (number, error) {
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := d.d.DecodeFloat64()
		return number{kind: 'f', f: f}, err
	case c == msgpcode.Uint64:
		u, err := d.d.DecodeUint64()
		if u > math.MaxInt64 {
			return number{kind: 'u', u: u}, err
		}
		return number{kind: 'i', i: int64(u)}, err
	case msgpcode.IsFixedNum(c), c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		i, err := d.d.DecodeInt64()
		return number{kind: 'i', i: i}, err
	}
	return number{}, d.mismatch(c, t)
}

func (n number) String() string {
	switch n.kind {
	case 'i':
		return fmt.Sprint(n.i)
	case 'u':
		return fmt.Sprint(n.u)
	}
	return fmt.Sprint(n.f)
}

func (n number) doesNotFit(t reflect.Type) error {
	return fmt.Errorf("stored value %v does not fit %s", n, t)
}

func (n number) setInt(v reflect.Value) error {
	if n.kind == 'f' {
		return fmt.Errorf("stored float %v where the integer type %s was expected", n.f, v.Type())
	}
	if n.kind == 'u' || v.OverflowInt(n.i) {
		return n.doesNotFit(v.Type())
	}
	v.SetInt(n.i)
	return nil
}

func (n number) setUint(v reflect.Value) error {
	if n.kind == 'f' {
		return fmt.Errorf("stored float %v where the integer type %s was expected", n.f, v.Type())
	}
	u := n.u
	if n.kind == 'i' {
		if n.i < 0 {
			return n.doesNotFit(v.Type())
		}
		u = uint64(n.i)
	}
	if v.OverflowUint(u) {
		return n.doesNotFit(v.Type())
	}
	v.SetUint(u)
	return nil
}

// setFloat sets v to n if v's type holds n exactly: an integer stored
// before a field became a float fits when the float holds it exactly.
func (n number) setFloat(v reflect.Value) error {
	f := n.f
	switch n.kind {
	case 'i':
		f = float64(n.i)
		if f >= math.MaxInt64 || int64(f) != n.i {
			return n.doesNotFit(v.Type())
		}
	case 'u':
		f = float64(n.u)
		if f >= math.MaxUint64 || uint64(f) != n.u {
			return n.doesNotFit(v.Type())
		}
	}
	if v.Kind() == reflect.Float32 && !math.IsNaN(f) && float64(float32(f)) != f {
		return n.doesNotFit(v.Type())
	}
	v.SetFloat(f)
	return nil
}
