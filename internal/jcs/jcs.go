// Package jcs writes the canonical form of a JSON text under RFC 8785, the
// JSON Canonicalization Scheme, in time and memory linear in the text's
// size (and n log n in an object's member count, for sorting them).
//
// The text is read once into a flat tree: scalars as spans of the input,
// or of a side buffer where their canonical form differs; arrays and
// objects as runs of their elements and members, each run moved once when
// its array or object closes, where members are sorted and their names
// checked for duplicates. The tree is then written out once. Nothing is
// copied into each enclosing value, so nesting costs no more than width.
package jcs

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxLen bounds the input, so that the offsets into it, and into the
// canonical forms of its scalars (at most 6 times as long), fit an int32.
const maxLen = 1 << 28

// MaxDepth bounds the nesting of arrays and objects, as encoding/json does.
const MaxDepth = 10000

// ErrTooDeep is wrapped by the error for a text nested deeper than
// MaxDepth: a limit, where the other errors say the text is not JSON.
var ErrTooDeep = fmt.Errorf("nested deeper than %d", MaxDepth)

// domain begins every input that Digest hashes. Its first byte, 0xFF,
// never begins idem.Fingerprint's encoding (which starts with a printable
// kind tag, or is empty), so the two never give one digest for two things.
const domain = "\xffidem/jcs/v1\x00"

// Digest returns the digest of a canonical form that idem.FingerprintJSON
// returns: the first 16 bytes of SHA-256 over a domain prefix and canon,
// in hexadecimal.
func Digest(canon []byte) string {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write(canon)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// Canonical returns the canonical form of a JSON text under RFC 8785: no
// whitespace; object members sorted by their names compared as UTF-16
// code units; strings with only '"', '\\' and the control characters
// escaped (as \b, \t, \n, \f, \r or \u00xx, lowercase), everything else
// as UTF-8; numbers written as ECMAScript writes a double (-0 as 0, 1e+21,
// 0.000001, 1e-7, 4.5).
//
// body must be one JSON value (RFC 8259) with optional whitespace around
// it, and an I-JSON message (RFC 7493) as RFC 8785 requires: an error is
// returned for invalid UTF-8, an escaped lone surrogate ("\ud800"), an
// object with two members of one name, a number out of the range of a
// double (1e400), or nesting deeper than MaxDepth (wrapping ErrTooDeep).
// Every error starts with "idem: " and gives the byte offset of the
// problem.
func Canonical(body []byte) ([]byte, error) { return canonical(body, false) }

// CanonicalExact is Canonical, but numbers keep their exact decimal value:
// a number that is exactly the shortest decimal of its double (100, 0.1,
// 1.5e300: nearly every number people write) has its RFC 8785 form, and
// any other (9007199254740993, 0.10000000000000001, 1e-400) has its own
// decimal digits in the same notation, so two numbers get one form only if
// they are one value. What it refuses is what Canonical refuses, and also
// an exponent of more than 15 digits.
func CanonicalExact(body []byte) ([]byte, error) { return canonical(body, true) }

func canonical(body []byte, exact bool) ([]byte, error) {
	if len(body) > maxLen {
		return nil, fmt.Errorf("idem: JSON text of %d bytes, over the limit of %d", len(body), maxLen)
	}
	p := parser{in: body, exact: exact}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return nil, p.errorf("data after the JSON value")
	}
	return p.write(make([]byte, 0, len(body)), v), nil
}

// parser reads one JSON text into a tree of values (see the package
// comment), checking it as it goes.
type parser struct {
	in    []byte
	pos   int
	exact bool

	text     []byte   // canonical forms of scalars, and decoded names, that are not spans of in
	vals     []value  // the elements of closed arrays, each array's in a run
	mems     []member // the members of closed objects, each object's in a run, sorted
	openVals []value  // the elements read so far of the arrays still open
	openMems []member // the members read so far of the objects still open
	scratch  []byte   // a decoded string, a number's digits
}

// kind says what a value's span [lo, hi) is a span of.
type kind uint8

const (
	inInput kind = iota // in: a scalar whose canonical form is its text, or a name without escapes
	inText              // text: a scalar's canonical form, or a decoded name
	array               // vals: the elements
	object              // mems: the members
)

type value struct {
	kind   kind
	lo, hi int32
}

type member struct {
	name value // inInput or inText: the name, decoded
	at   int32 // the name's offset in the input, for errors
	v    value
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("idem: invalid JSON at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// bytes returns the bytes of a scalar or a name.
func (p *parser) bytes(v value) []byte {
	if v.kind == inInput {
		return p.in[v.lo:v.hi]
	}
	return p.text[v.lo:v.hi]
}

// textSince returns the value of what was appended to p.text since from.
func (p *parser) textSince(from int) value {
	return value{kind: inText, lo: int32(from), hi: int32(len(p.text))}
}

// value reads the value at p.pos; depth is the nesting of its container.
func (p *parser) value(depth int) (value, error) {
	if p.pos >= len(p.in) {
		return value{}, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.stringValue()
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(p.in)-p.pos >= len(lit) && string(p.in[p.pos:p.pos+len(lit)]) == lit {
				p.pos += len(lit)
				return value{kind: inInput, lo: int32(p.pos - len(lit)), hi: int32(p.pos)}, nil
			}
		}
		return value{}, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) array(depth int) (value, error) {
	if depth > MaxDepth {
		return value{}, fmt.Errorf("idem: invalid JSON at offset %d: %w", p.pos, ErrTooDeep)
	}
	p.pos++ // '['
	p.skipSpace()
	mark := len(p.openVals)
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return value{kind: array}, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		p.openVals = append(p.openVals, v)
		p.skipSpace()
		if p.pos >= len(p.in) {
			return value{}, p.errorf("unexpected end of input in an array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			lo := len(p.vals)
			p.vals = append(p.vals, p.openVals[mark:]...)
			p.openVals = p.openVals[:mark]
			return value{kind: array, lo: int32(lo), hi: int32(len(p.vals))}, nil
		default:
			return value{}, p.errorf("expected ',' or ']' in an array, found %q", p.in[p.pos])
		}
	}
}

func (p *parser) object(depth int) (value, error) {
	if depth > MaxDepth {
		return value{}, fmt.Errorf("idem: invalid JSON at offset %d: %w", p.pos, ErrTooDeep)
	}
	p.pos++ // '{'
	p.skipSpace()
	mark := len(p.openMems)
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return value{kind: object}, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return value{}, p.errorf("expected a member name in an object")
		}
		at := p.pos
		name, err := p.name()
		if err != nil {
			return value{}, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return value{}, p.errorf("expected ':' after a member name")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		p.openMems = append(p.openMems, member{name: name, at: int32(at), v: v})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return value{}, p.errorf("unexpected end of input in an object")
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.in[p.pos] != ',' {
			return value{}, p.errorf("expected ',' or '}' in an object, found %q", p.in[p.pos])
		}
		p.pos++
	}
	lo := len(p.mems)
	p.mems = append(p.mems, p.openMems[mark:]...)
	p.openMems = p.openMems[:mark]
	ms := p.mems[lo:]
	// Stable, so that of members with one name the first read comes first
	// and the error names the first repeat, as a scan in order would.
	slices.SortStableFunc(ms, func(a, b member) int { return compareUTF16(p.bytes(a.name), p.bytes(b.name)) })
	dup := -1
	for i := 1; i < len(ms); i++ {
		if string(p.bytes(ms[i].name)) == string(p.bytes(ms[i-1].name)) && (dup < 0 || ms[i].at < ms[dup].at) {
			dup = i
		}
	}
	if dup >= 0 {
		p.pos = int(ms[dup].at)
		return value{}, p.errorf("duplicate member name %q", p.bytes(ms[dup].name))
	}
	return value{kind: object, lo: int32(lo), hi: int32(len(p.mems))}, nil
}

// compareUTF16 compares two valid UTF-8 strings as RFC 8785 sorts member
// names: as sequences of UTF-16 code units. UTF-8's byte order is code
// point order, which differs only where a character beyond U+FFFF (a
// surrogate pair, D800 to DBFF first) meets one from U+E000 to U+FFFF.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return cmp.Compare(len(a), len(b))
	}
	for i > 0 && !utf8.RuneStart(a[i]) {
		i-- // the common prefix ends inside a character: compare it whole
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	if c := cmp.Compare(firstUnit(ra), firstUnit(rb)); c != 0 {
		return c
	}
	return cmp.Compare(ra, rb) // both beyond U+FFFF, one high surrogate: code point order
}

// firstUnit returns the first UTF-16 code unit of r.
func firstUnit(r rune) rune {
	if r > 0xFFFF {
		r1, _ := utf16.EncodeRune(r)
		return r1
	}
	return r
}

// name reads the member name at p.pos: a span of the input when it has no
// escapes, else its decoded form in p.text.
func (p *parser) name() (value, error) {
	start := p.pos + 1
	plain, err := p.str()
	if err != nil {
		return value{}, err
	}
	if plain {
		return value{kind: inInput, lo: int32(start), hi: int32(p.pos - 1)}, nil
	}
	from := len(p.text)
	p.text = append(p.text, p.scratch...)
	return p.textSince(from), nil
}

// stringValue reads the string at p.pos: a span of the input (quotes
// included) when that is its canonical form, else its canonical form in
// p.text.
func (p *parser) stringValue() (value, error) {
	start := p.pos
	plain, err := p.str()
	if err != nil {
		return value{}, err
	}
	if plain {
		return value{kind: inInput, lo: int32(start), hi: int32(p.pos)}, nil
	}
	from := len(p.text)
	p.text = appendString(p.text, p.scratch)
	return p.textSince(from), nil
}

// str reads the string at p.pos and reports whether it has no escapes
// (its canonical form is then its text, and its decoded form the text
// inside the quotes); if it has, its decoded form is left in p.scratch.
func (p *parser) str() (plain bool, err error) {
	p.pos++ // '"'
	start := p.pos
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return true, nil
		case c == '\\':
			p.scratch = append(p.scratch[:0], p.in[start:p.pos]...)
			return false, p.escaped()
		case c < 0x20:
			return false, p.errorf("control character %q in a string", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return false, p.errorf("invalid UTF-8 in a string")
			}
			p.pos += size
		}
	}
	return false, p.errorf("unexpected end of input in a string")
}

// escaped reads the rest of a string from its first escape on, decoding
// it after what p.scratch holds.
func (p *parser) escaped() error {
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return nil
		case c < 0x20:
			return p.errorf("control character %q in a string", c)
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return err
			}
			p.scratch = utf8.AppendRune(p.scratch, r)
		case c < utf8.RuneSelf:
			p.scratch = append(p.scratch, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return p.errorf("invalid UTF-8 in a string")
			}
			p.scratch = append(p.scratch, p.in[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
	return p.errorf("unexpected end of input in a string")
}

// escape reads the escape sequence at p.pos (a backslash and what follows;
// a surrogate pair is two \u escapes) and returns the character.
func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.in) {
		return 0, p.errorf("unexpected end of input in an escape")
	}
	c := p.in[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if utf16.IsSurrogate(r) {
			if r >= 0xDC00 || p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
				return 0, p.errorf("lone surrogate \\u%04x in a string", r)
			}
			p.pos += 2
			r2, err := p.hex4()
			if err != nil {
				return 0, err
			}
			if r2 < 0xDC00 || r2 > 0xDFFF {
				return 0, p.errorf("lone surrogate \\u%04x in a string", r)
			}
			return utf16.DecodeRune(r, r2), nil
		}
		return r, nil
	}
	p.pos--
	return 0, p.errorf("invalid escape '\\%c'", c)
}

// hex4 reads the four hexadecimal digits of a \u escape.
func (p *parser) hex4() (rune, error) {
	if len(p.in)-p.pos < 4 {
		return 0, p.errorf("unexpected end of input in a \\u escape")
	}
	var r rune
	for _, c := range p.in[p.pos : p.pos+4] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.errorf("invalid \\u escape")
		}
		r = r<<4 | rune(d)
	}
	p.pos += 4
	return r, nil
}

// number reads a number with JSON's grammar,
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and returns its
// canonical form: a span of the input when that is its text.
func (p *parser) number() (value, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && '0' <= p.in[p.pos] && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.in[p.pos] == '-' {
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return value{}, p.errorf("invalid number")
	}
	intEnd, fracStart, fracEnd, expStart := p.pos, p.pos, p.pos, -1
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		fracStart = p.pos
		if digits() == 0 {
			return value{}, p.errorf("invalid number: no digit after '.'")
		}
		fracEnd = p.pos
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		expStart = p.pos
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return value{}, p.errorf("invalid number: no digit in the exponent")
		}
	}
	f, err := strconv.ParseFloat(string(p.in[start:p.pos]), 64)
	if err != nil {
		// The syntax is checked above: only the range can be wrong.
		p.pos = start
		return value{}, p.errorf("number %s is out of the range of a double", numberText(p.in[start:]))
	}
	neg := p.in[start] == '-'
	var buf [32]byte
	d, n := shortest(buf[:0], f)
	from := len(p.text)
	if p.exact {
		exp, ok := exponent(p.in, expStart, p.pos)
		if !ok {
			p.pos = start
			return value{}, p.errorf("number %s has an exponent of more than 15 digits", numberText(p.in[start:]))
		}
		// The input's value is 0.digits × 10^xn, digits without leading
		// or trailing zeros (none at all for zero).
		p.scratch = append(append(p.scratch[:0], p.in[intStart:intEnd]...), p.in[fracStart:fracEnd]...)
		lead := 0
		for lead < len(p.scratch) && p.scratch[lead] == '0' {
			lead++
		}
		trail := len(p.scratch)
		for trail > lead && p.scratch[trail-1] == '0' {
			trail--
		}
		xd := p.scratch[lead:trail]
		xn := int64(len(p.scratch)-lead) - int64(fracEnd-fracStart) + exp
		if len(xd) > 0 && !(string(xd) == string(d) && xn == int64(n) && neg == (f < 0)) {
			p.text = appendNumber(p.text, neg, xd, xn)
			return p.textSince(from), nil
		}
	}
	p.text = appendNumber(p.text, f < 0, d, int64(n))
	if string(p.text[from:]) == string(p.in[start:p.pos]) {
		p.text = p.text[:from]
		return value{kind: inInput, lo: int32(start), hi: int32(p.pos)}, nil
	}
	return p.textSince(from), nil
}

// exponent returns the exponent in in[from:to] (a sign and digits), or 0
// when from is -1; false if it has more than 15 digits after its leading
// zeros.
func exponent(in []byte, from, to int) (int64, bool) {
	if from < 0 {
		return 0, true
	}
	neg := in[from] == '-'
	if in[from] == '-' || in[from] == '+' {
		from++
	}
	for from < to-1 && in[from] == '0' {
		from++
	}
	if to-from > 15 {
		return 0, false
	}
	e, _ := strconv.ParseInt(string(in[from:to]), 10, 64) // digits only: cannot fail
	if neg {
		e = -e
	}
	return e, true
}

// numberText returns the number at the start of b, for an error message.
func numberText(b []byte) string {
	n := 0
	for n < len(b) && n < 40 && (b[n] == '-' || b[n] == '+' || b[n] == '.' || b[n] == 'e' || b[n] == 'E' || ('0' <= b[n] && b[n] <= '9')) {
		n++
	}
	return string(b[:n])
}

// shortest returns the shortest decimal digits that read back as |f|, the
// ones ECMAScript chooses (the fewest; of equally few, the closest to f),
// and n such that |f| = 0.digits × 10^n; no digits for zero.
func shortest(buf []byte, f float64) (digits []byte, n int) {
	if f == 0 {
		return nil, 0
	}
	e := strconv.AppendFloat(buf, math.Abs(f), 'e', -1, 64) // d.ddde±x or de±x
	i := slices.Index(e, 'e')
	exp, _ := strconv.Atoi(string(e[i+1:]))
	if i > 1 {
		copy(e[1:], e[2:i]) // drop the point
		i--
	}
	return e[:i], exp + 1
}

// appendNumber appends the number 0.digits × 10^n (negative if neg) as
// ECMAScript's Number.prototype.toString writes a double (ECMA-262,
// Number::toString), which RFC 8785 adopts: plain notation for
// magnitudes in [1e-6, 1e21), else exponent notation with a sign ("1e+21",
// "1e-7"). No digits is zero, written "0".
func appendNumber(out []byte, neg bool, digits []byte, n int64) []byte {
	k := int64(len(digits))
	if k == 0 {
		return append(out, '0')
	}
	if neg {
		out = append(out, '-')
	}
	switch {
	case k <= n && n <= 21:
		out = append(out, digits...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		out = append(out, digits[:n]...)
		out = append(out, '.')
		out = append(out, digits[n:]...)
	case -6 < n && n <= 0:
		out = append(out, '0', '.')
		for range -n {
			out = append(out, '0')
		}
		out = append(out, digits...)
	default:
		out = append(out, digits[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, digits[1:]...)
		}
		out = append(out, 'e')
		if n-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, n-1, 10)
	}
	return out
}

// appendString appends s as a JSON string in RFC 8785's form: '"' and
// '\\' escaped, control characters as \b \t \n \f \r or \u00xx (lowercase
// hex), everything else as its UTF-8 bytes.
func appendString(out, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c >= 0x20:
			out = append(out, c)
		case c == '\b':
			out = append(out, '\\', 'b')
		case c == '\t':
			out = append(out, '\\', 't')
		case c == '\n':
			out = append(out, '\\', 'n')
		case c == '\f':
			out = append(out, '\\', 'f')
		case c == '\r':
			out = append(out, '\\', 'r')
		default:
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
	}
	return append(out, '"')
}

// write appends the canonical form of v to out.
func (p *parser) write(out []byte, v value) []byte {
	switch v.kind {
	case inInput, inText:
		return append(out, p.bytes(v)...)
	case array:
		out = append(out, '[')
		for i, e := range p.vals[v.lo:v.hi] {
			if i > 0 {
				out = append(out, ',')
			}
			out = p.write(out, e)
		}
		return append(out, ']')
	default:
		out = append(out, '{')
		for i, m := range p.mems[v.lo:v.hi] {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendString(out, p.bytes(m.name))
			out = append(out, ':')
			out = p.write(out, m.v)
		}
		return append(out, '}')
	}
}
