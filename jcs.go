package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jcsDomain begins every input that FingerprintJSON hashes. Its first byte,
// 0xFF, never begins Fingerprint's encoding (which starts with a printable
// kind tag, or is empty), so the two functions hash different inputs and
// never give one digest for two things.
const jcsDomain = "\xffidem/jcs/v1\x00"

// maxJSONDepth bounds the nesting of arrays and objects that CanonicalJSON
// accepts, as encoding/json does.
const maxJSONDepth = 10000

// FingerprintJSON returns a fingerprint of a JSON text, to pass to Do:
// texts that are one JSON value once canonicalised (see CanonicalJSON) get
// one fingerprint, whatever their key order and whitespace, so that
// {"a":1,"b":2} and { "b":2, "a":1 } are one operation. It has the format
// of Fingerprint's (32 hexadecimal digits: the first 16 bytes of a SHA-256)
// but never equals a Fingerprint of anything: the hashed input starts with
// a domain prefix that Fingerprint's never starts with.
//
// Invalid JSON, and JSON that CanonicalJSON refuses, is an error.
//
// Numbers are compared as IEEE 754 doubles, as RFC 8785 prescribes:
// 1, 1.0 and 1e0 are one number, and so are integers that differ only
// beyond 2^53 (9007199254740993 and 9007199254740992). Send values that
// must compare exactly (large ids, amounts with more than 15 significant
// digits) as JSON strings.
//
// The fingerprint of a JSON text is stable across releases: a change to it
// is a breaking change (golden values pin it in the tests).
func FingerprintJSON(body []byte) (string, error) {
	c, err := CanonicalJSON(body)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(jcsDomain))
	h.Write(c)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16]), nil
}

// CanonicalJSON returns the canonical form of a JSON text under RFC 8785,
// the JSON Canonicalization Scheme: no whitespace; object members sorted by
// their names compared as UTF-16 code units; strings with only '"', '\\'
// and the control characters escaped (as \b, \t, \n, \f, \r or \u00xx,
// lowercase), everything else as UTF-8; numbers written as ECMAScript
// writes a double (-0 as 0, 1e+21, 0.000001, 1e-7, 4.5).
//
// The input must be one JSON value (RFC 8259) with optional whitespace
// around it, and also an I-JSON message (RFC 7493) as RFC 8785 requires: an
// error is returned for invalid UTF-8, an escaped lone surrogate (such as
// "\ud800"), an object with two members of one name, a number out of the
// range of a double (1e400), or nesting deeper than 10000. Every error is
// prefixed with "idem: " and gives the byte offset of the problem.
func CanonicalJSON(body []byte) ([]byte, error) {
	p := jcsParser{in: body}
	p.skipSpace()
	out, err := p.value(make([]byte, 0, len(body)), 0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return nil, p.errorf("data after the JSON value")
	}
	return out, nil
}

// jcsParser reads one JSON text and writes its canonical form as it goes;
// objects are written once their members are read and sorted.
type jcsParser struct {
	in  []byte
	pos int
}

func (p *jcsParser) errorf(format string, args ...any) error {
	return fmt.Errorf("idem: invalid JSON at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *jcsParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value appends the canonical form of the value at p.pos to out.
func (p *jcsParser) value(out []byte, depth int) ([]byte, error) {
	if p.pos >= len(p.in) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(out, depth+1)
	case c == '[':
		return p.array(out, depth+1)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return appendJCSString(out, s), nil
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number(out)
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(p.in)-p.pos >= len(lit) && string(p.in[p.pos:p.pos+len(lit)]) == lit {
				p.pos += len(lit)
				return append(out, lit...), nil
			}
		}
		return nil, p.errorf("unexpected character %q", c)
	}
}

func (p *jcsParser) array(out []byte, depth int) ([]byte, error) {
	if depth > maxJSONDepth {
		return nil, p.errorf("nested deeper than %d", maxJSONDepth)
	}
	p.pos++ // '['
	out = append(out, '[')
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return append(out, ']'), nil
	}
	for i := 0; ; i++ {
		if i > 0 {
			out = append(out, ',')
		}
		p.skipSpace()
		var err error
		if out, err = p.value(out, depth); err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) {
			return nil, p.errorf("unexpected end of input in an array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return append(out, ']'), nil
		default:
			return nil, p.errorf("expected ',' or ']' in an array, found %q", p.in[p.pos])
		}
	}
}

// member is an object member: its name (decoded), the name as UTF-16 code
// units (the sort key), and its canonical value.
type member struct {
	name  string
	units []uint16
	value []byte
}

func (p *jcsParser) object(out []byte, depth int) ([]byte, error) {
	if depth > maxJSONDepth {
		return nil, p.errorf("nested deeper than %d", maxJSONDepth)
	}
	p.pos++ // '{'
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return append(out, '{', '}'), nil
	}
	var members []member
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return nil, p.errorf("expected a member name in an object")
		}
		at := p.pos
		name, err := p.str()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return nil, p.errorf("expected ':' after a member name")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(nil, depth)
		if err != nil {
			return nil, err
		}
		for _, m := range members {
			if m.name == name {
				p.pos = at
				return nil, p.errorf("duplicate member name %q", name)
			}
		}
		members = append(members, member{name: name, units: utf16.Encode([]rune(name)), value: v})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return nil, p.errorf("unexpected end of input in an object")
		}
		if p.in[p.pos] == '}' {
			p.pos++
			break
		}
		if p.in[p.pos] != ',' {
			return nil, p.errorf("expected ',' or '}' in an object, found %q", p.in[p.pos])
		}
		p.pos++
	}
	slices.SortFunc(members, func(a, b member) int { return slices.Compare(a.units, b.units) })
	out = append(out, '{')
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendJCSString(out, m.name)
		out = append(out, ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), nil
}

// str reads the string at p.pos and returns it decoded.
func (p *jcsParser) str() (string, error) {
	p.pos++ // '"'
	start := p.pos
	// The usual case: no escapes, plain ASCII.
	for p.pos < len(p.in) {
		c := p.in[p.pos]
		if c == '"' {
			p.pos++
			return string(p.in[start : p.pos-1]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		p.pos++
	}
	buf := append([]byte(nil), p.in[start:p.pos]...)
	for {
		if p.pos >= len(p.in) {
			return "", p.errorf("unexpected end of input in a string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("control character %q in a string", c)
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8 in a string")
			}
			buf = append(buf, p.in[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

// escape reads the escape sequence at p.pos (a backslash and what follows;
// a surrogate pair is two \u escapes) and returns the character.
func (p *jcsParser) escape() (rune, error) {
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
func (p *jcsParser) hex4() (rune, error) {
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
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and appends its
// canonical form.
func (p *jcsParser) number(out []byte) ([]byte, error) {
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
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return nil, p.errorf("invalid number")
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return nil, p.errorf("invalid number: no digit after '.'")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, p.errorf("invalid number: no digit in the exponent")
		}
	}
	f, err := strconv.ParseFloat(string(p.in[start:p.pos]), 64)
	if err != nil {
		// The syntax is checked above: only the range can be wrong.
		p.pos = start
		return nil, p.errorf("number %s is out of the range of a double", f64Text(p.in[start:]))
	}
	return appendJCSNumber(out, f)
}

// f64Text returns the number at the start of b, for an error message.
func f64Text(b []byte) string {
	n := 0
	for n < len(b) && n < 40 && (b[n] == '-' || b[n] == '+' || b[n] == '.' || b[n] == 'e' || b[n] == 'E' || ('0' <= b[n] && b[n] <= '9')) {
		n++
	}
	return string(b[:n])
}

// appendJCSNumber appends f as ECMAScript's Number.prototype.toString
// writes it (ECMA-262, Number::toString), which RFC 8785 adopts: the
// shortest digits that read back as f, in plain notation for magnitudes in
// [1e-6, 1e21), else in exponent notation with a sign ("1e+21", "1e-7").
// NaN and infinities have no JSON form: they are an error.
func appendJCSNumber(out []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, errors.New("idem: NaN or infinity has no JSON form")
	}
	if f == 0 {
		return append(out, '0'), nil // and -0
	}
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	// The shortest digits that round-trip, as "d.ddde±x" or "de±x": the
	// same digits ECMAScript chooses (the fewest; of equally few, the
	// closest to f).
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	i := slices.Index(e, 'e')
	exp, _ := strconv.Atoi(string(e[i+1:]))
	digits := make([]byte, 0, 17)
	digits = append(digits, e[0])
	if i > 1 {
		digits = append(digits, e[2:i]...)
	}
	k, n := len(digits), exp+1 // f = 0.digits × 10^n
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
		out = strconv.AppendInt(out, int64(n-1), 10)
	}
	return out, nil
}

// appendJCSString appends s as a JSON string in RFC 8785's form: '"' and
// '\\' escaped, control characters as \b \t \n \f \r or \u00xx (lowercase
// hex), everything else as its UTF-8 bytes.
func appendJCSString(out []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
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
