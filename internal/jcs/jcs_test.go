package jcs_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/jcs"
)

// The example of RFC 8785, section 3.2.2: whitespace, number forms and
// string escapes.
func TestCanonicalRFCExample(t *testing.T) {
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
	got, err := jcs.Canonical([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("Canonical:\n got %s\nwant %s", got, want)
	}
	// The same as the bytes of section 3.2.4.
	wantHex := "7b226c69746572616c73223a5b6e756c6c2c747275652c66616c73655d2c226e756d62657273223a" +
		"5b3333333333333333332e333333333333332c31652b33302c342e352c302e3030322c31652d3237" +
		"5d2c22737472696e67223a22e282ac245c753030" + "30665c6e4127425c225c5c5c5c5c222f227d"
	if h := hex.EncodeToString(got); h != wantHex {
		t.Errorf("Canonical bytes:\n got %s\nwant %s", h, wantHex)
	}
}

// The example of RFC 8785, section 3.2.3: members sorted by their names as
// UTF-16 code units, so the emoji (a surrogate pair, D83D DE00) comes
// before U+FB33 although its code point is larger.
func TestCanonicalSortsByUTF16(t *testing.T) {
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := `{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","ö":"Latin Small Letter O With Diaeresis",` +
		`"€":"Euro Sign","😀":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`
	got, err := jcs.Canonical([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("Canonical:\n got %q\nwant %q", got, want)
	}
}

// The number examples of RFC 8785, appendix B: IEEE 754 doubles (in hex)
// and the text ECMAScript writes for them.
func TestCanonicalNumbersRFC(t *testing.T) {
	for _, tc := range []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	} {
		// Go writes the double with 17 significant digits, which read back
		// as the same double; Canonical must write ECMAScript's form.
		in := []byte(strconv.FormatFloat(math.Float64frombits(tc.bits), 'g', 17, 64))
		got, err := jcs.Canonical(in)
		if err != nil {
			t.Errorf("%016x (%s): %v", tc.bits, in, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%016x (%s): got %s, want %s", tc.bits, in, got, tc.want)
		}
	}
}

// More numbers around ECMAScript's switches between plain and exponent
// notation, and JSON's spellings of one value.
func TestCanonicalNumbers(t *testing.T) {
	for in, want := range map[string]string{
		"1":                      "1",
		"1.0":                    "1",
		"1e0":                    "1",
		"10E-1":                  "1",
		"-0":                     "0",
		"-0.0e5":                 "0",
		"4.50":                   "4.5",
		"123e-2":                 "1.23",
		"1e20":                   "100000000000000000000",
		"1e21":                   "1e+21",
		"123456789012345680000":  "123456789012345680000",
		"1e-6":                   "0.000001",
		"1.5e-6":                 "0.0000015",
		"1e-7":                   "1e-7",
		"-1.5e-7":                "-1.5e-7",
		"1e-400":                 "0", // underflows to zero, as in ECMAScript
		"9007199254740993":       "9007199254740992",
		"0.1":                    "0.1",
		"0.30000000000000004":    "0.30000000000000004",
		"1.7976931348623157e308": "1.7976931348623157e+308",
	} {
		got, err := jcs.Canonical([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if string(got) != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}

func TestCanonicalStrings(t *testing.T) {
	for in, want := range map[string]string{
		`"plain"`:                 `"plain"`,
		`"\u0000\u001f\u007f"`:    `"\u0000\u001f` + "\x7f" + `"`,
		`"\b\f\n\r\t\/"`:          `"\b\f\n\r\t/"`,
		`"\u0008\u000C\u000a"`:    `"\b\f\n"`,
		`"\u00e9"`:                `"é"`,
		`"é"`:                     `"é"`,
		`"\u2028\u2029"`:          "\"\u2028\u2029\"",
		`"\uD83D\uDE00"`:          `"😀"`,
		`"<>&"`:                   `"<>&"`,
		`"\"\\"`:                  `"\"\\"`,
		`["a" , "b"]`:             `["a","b"]`,
		` { } `:                   `{}`,
		"[\n]":                    `[]`,
		`{"a":{"c":[],"b":null}}`: `{"a":{"b":null,"c":[]}}`,
		`true`:                    `true`,
		`[false,null]`:            `[false,null]`,
	} {
		got, err := jcs.Canonical([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if string(got) != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
}

func TestCanonicalRefuses(t *testing.T) {
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	for name, in := range map[string]string{
		"empty":                  ``,
		"only whitespace":        "  \n",
		"two values":             `1 2`,
		"trailing comma array":   `[1,]`,
		"trailing comma object":  `{"a":1,}`,
		"unquoted name":          `{a:1}`,
		"single quotes":          `'a'`,
		"missing colon":          `{"a" 1}`,
		"missing value":          `{"a":}`,
		"unclosed array":         `[1`,
		"unclosed object":        `{"a":1`,
		"unclosed string":        `"abc`,
		"leading zero":           `01`,
		"plus sign":              `+1`,
		"bare dot":               `.5`,
		"dot without digits":     `1.`,
		"exponent without digit": `1e+`,
		"hex":                    `0x10`,
		"NaN":                    `NaN`,
		"Infinity":               `Infinity`,
		"out of range":           `1e400`,
		"negative out of range":  `-1e309`,
		"truncated literal":      `tru`,
		"capital literal":        `True`,
		"control character":      "\"a\tb\"",
		"invalid escape":         `"\x41"`,
		"short unicode escape":   `"\u12"`,
		"lone high surrogate":    `"\ud800"`,
		"lone low surrogate":     `"\udc00"`,
		"reversed surrogates":    `"\ude00\ud83d"`,
		"high then non-low":      `"\ud83d\u0041"`,
		"invalid UTF-8":          "\"\xff\"",
		"UTF-8 surrogate":        "\"\xed\xa0\x80\"",
		"duplicate name":         `{"a":1,"a":1}`,
		"duplicate once decoded": `{"a":1,"\u0061":2}`,
		"nested duplicate":       `[{"x":{"b":1,"b":2}}]`,
		"too deep":               deep,
	} {
		got, err := jcs.Canonical([]byte(in))
		if err == nil {
			t.Errorf("%s: Canonical(%.40q) = %s, want an error", name, in, got)
			continue
		}
		if !strings.HasPrefix(err.Error(), "idem: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	// Just within the nesting limit.
	ok := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	if _, err := jcs.Canonical([]byte(ok)); err != nil {
		t.Errorf("10000 levels: %v", err)
	}
}

// FuzzCanonical: what Canonical accepts, encoding/json accepts too
// and reads as the same value; the canonical form is valid JSON and its own
// canonical form; and Canonical never panics.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":[true,false,null,"x\u0000"]}`, `1e21`, `-0.0000015`, `"\ud83d\ude00"`,
		`{"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}`, `[[[[]]]]`, `{"a":{"a":{"a":1}}}`, `"\u2028"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := jcs.Canonical(in)
		if err != nil {
			return
		}
		if !json.Valid(c) {
			t.Fatalf("Canonical(%q) = %q, not valid JSON", in, c)
		}
		again, err := jcs.Canonical(c)
		if err != nil || !bytes.Equal(again, c) {
			t.Fatalf("Canonical(%q) = %q, whose canonical form is %q, %v", in, c, again, err)
		}
		var a, b any
		if err := json.Unmarshal(in, &a); err != nil {
			t.Fatalf("Canonical accepted %q, which encoding/json refuses: %v", in, err)
		}
		if err := json.Unmarshal(c, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q reads as %v, its canonical form %q as %v", in, a, c, b)
		}
	})
}

func TestCanonicalErrorOffset(t *testing.T) {
	_, err := jcs.Canonical([]byte(`{"a":1, "a":2}`))
	if err == nil || !strings.Contains(err.Error(), "offset 8") || !strings.Contains(err.Error(), `duplicate member name "a"`) {
		t.Errorf("error %v, want the duplicate name at offset 8", err)
	}
	if errors.Unwrap(err) != nil {
		t.Errorf("error %v wraps another; want a plain error", err)
	}
}
