package jcs_test

import (
	"bytes"
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/jcs"
)

// CanonicalExact writes a number as RFC 8785 does when that is its exact
// value, and its own digits, in the same notation, when not.
func TestCanonicalExactNumbers(t *testing.T) {
	for in, want := range map[string]string{
		"1":                        "1",
		"1.0":                      "1",
		"10E-1":                    "1",
		"-0":                       "0",
		"-0.0e5":                   "0",
		"4.50":                     "4.5",
		"1e21":                     "1e+21",
		"1e-7":                     "1e-7",
		"0.1":                      "0.1",
		"100.000000000000000000":   "100",
		"9007199254740992":         "9007199254740992",
		"9007199254740993":         "9007199254740993",
		"-9007199254740993":        "-9007199254740993",
		"9007199254740993e3":       "9007199254740993000",
		"12345678901234567890123":  "1.2345678901234567890123e+22",
		"0.10000000000000001":      "0.10000000000000001",
		"0.1000000000000000055511": "0.1000000000000000055511",
		"1e-400":                   "1e-400",
		"-2.5e-400":                "-2.5e-400",
		"0.000001000000000000001":  "0.000001000000000000001",
		"1.7976931348623157e308":   "1.7976931348623157e+308",
		"1e000000000000000000021":  "1e+21",
		"[1e-400,0,1]":             "[1e-400,0,1]",
	} {
		got, err := jcs.CanonicalExact([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if string(got) != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
	for _, in := range []string{"1e400", "1e-1000000000000000", "[1,]"} {
		if got, err := jcs.CanonicalExact([]byte(in)); err == nil {
			t.Errorf("%s: got %s, want an error", in, got)
		}
	}
	deep := strings.Repeat("[", jcs.MaxDepth+1) + strings.Repeat("]", jcs.MaxDepth+1)
	if _, err := jcs.CanonicalExact([]byte(deep)); !errors.Is(err, jcs.ErrTooDeep) {
		t.Errorf("too deep: %v, want ErrTooDeep", err)
	}
}

// FuzzCanonicalExact: a number's exact form has its value (read as a
// big.Rat); two numbers get one exact form only if they are one value; the
// exact form is its own exact form; and where the RFC 8785 form has the
// number's value, the two forms are one.
func FuzzCanonicalExact(f *testing.F) {
	for _, s := range []string{"1", "9007199254740993", "0.1", "1e-400", "-0", "12345678901234567890123", "4.50", "1e21", "0.000001"} {
		f.Add(s, "1.0")
	}
	rat := func(s []byte) (*big.Rat, bool) {
		if bytes.ContainsAny(s, "eE") && len(s) > 2 {
			// big.Rat builds 10^exp: keep exponents small.
			i := bytes.IndexAny(s, "eE")
			if e := strings.TrimLeft(string(s[i+1:]), "+-0"); len(e) > 3 {
				return nil, false
			}
		}
		return new(big.Rat).SetString(string(s))
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, err := jcs.CanonicalExact([]byte(a))
		if err != nil || bytes.ContainsAny([]byte(a), "[{\"tfn") {
			return // not a number, or refused
		}
		ra, ok := rat([]byte(a))
		if !ok {
			return
		}
		if got, ok := rat(ea); !ok || got.Cmp(ra) != 0 {
			t.Fatalf("%s: exact form %s has another value", a, ea)
		}
		if again, err := jcs.CanonicalExact(ea); err != nil || !bytes.Equal(again, ea) {
			t.Fatalf("%s: exact form %s, whose exact form is %s, %v", a, ea, again, err)
		}
		if c, err := jcs.Canonical([]byte(a)); err == nil {
			if rc, ok := rat(c); ok && rc.Cmp(ra) == 0 && !bytes.Equal(c, ea) {
				t.Fatalf("%s: RFC 8785 form %s has its value, but the exact form is %s", a, c, ea)
			}
		}
		eb, err := jcs.CanonicalExact([]byte(b))
		if err != nil || bytes.ContainsAny([]byte(b), "[{\"tfn") {
			return
		}
		if rb, ok := rat([]byte(b)); ok && (rb.Cmp(ra) == 0) != bytes.Equal(ea, eb) {
			t.Fatalf("%s and %s: exact forms %s and %s", a, b, ea, eb)
		}
	})
}
