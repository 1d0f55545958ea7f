package idem_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/jcs"
)

// FingerprintJSON refuses what the canonicaliser refuses.
func TestFingerprintJSONRefuses(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	for _, in := range []string{``, `{"a":1,"a":2}`, "\"\xff\"", `"\ud800"`, `1e400`, `[1,]`, deep} {
		if _, err := jcs.Canonical([]byte(in)); err == nil {
			t.Errorf("jcs.Canonical(%.20q) accepted it", in)
		}
		if fp, err := idem.FingerprintJSON([]byte(in)); err == nil || !strings.HasPrefix(err.Error(), "idem: ") {
			t.Errorf("FingerprintJSON(%.20q) = %q, %v; want an error prefixed idem: ", in, fp, err)
		}
	}
}

func TestFingerprintJSONIgnoresOrderAndSpace(t *testing.T) {
	t.Parallel()
	same := [][]string{
		{`{"a":1,"b":2}`, `{ "b":2, "a":1 }`, "{\n\t\"b\": 2.0,\r\n\t\"a\": 1e0\n}", `{"\u0061":1,"b":2}`},
		{`{"account":"A","amount":100,"meta":{"x":[1,2],"y":null}}`, `{"meta":{"y":null,"x":[1,2]},"amount":1E2,"account":"A"}`},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
	}
	seen := map[string]string{}
	for _, group := range same {
		want, err := idem.FingerprintJSON([]byte(group[0]))
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range group[1:] {
			got, err := idem.FingerprintJSON([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("FingerprintJSON(%s) = %s, want %s as for %s", in, got, want, group[0])
			}
		}
		if other, ok := seen[want]; ok {
			t.Errorf("%s and %s share the fingerprint %s", group[0], other, want)
		}
		seen[want] = group[0]
	}
}

func TestFingerprintJSONTellsValuesApart(t *testing.T) {
	t.Parallel()
	distinct := []string{
		`{"a":1,"b":2}`, `{"a":1,"b":3}`, `{"a":"1","b":2}`, `{"a":1}`, `{"b":2,"c":1}`,
		`[1,2]`, `[2,1]`, `[[1],2]`, `[1,[2]]`, `"a"`, `"a "`, `null`, `false`, `0`, `"0"`, `[]`, `{}`, `""`,
		`{"a":{}}`, `{"a":[]}`, `{"a":null}`, `[null]`, `1.5`, `15e-1e`,
	}
	seen := map[string]string{}
	for _, in := range distinct {
		fp, err := idem.FingerprintJSON([]byte(in))
		if err != nil {
			continue // the last one is not JSON
		}
		if len(fp) != 32 {
			t.Errorf("FingerprintJSON(%s) = %q, want 32 hexadecimal digits", in, fp)
		}
		if other, ok := seen[fp]; ok {
			t.Errorf("%s and %s share the fingerprint %s", in, other, fp)
		}
		seen[fp] = in
		// Never one of Fingerprint's, for the same text as a string or as
		// bytes, or for its canonical form.
		c, _ := jcs.Canonical([]byte(in))
		for _, f := range []string{idem.Fingerprint(in), idem.Fingerprint([]byte(in)), idem.Fingerprint(string(c)), idem.Fingerprint(c), idem.Fingerprint()} {
			if f == fp {
				t.Errorf("FingerprintJSON(%s) equals a Fingerprint: %s", in, fp)
			}
		}
	}
	if len(seen) != len(distinct)-1 {
		t.Errorf("%d fingerprints for %d JSON texts", len(seen), len(distinct)-1)
	}
}

// Golden values: fingerprints are stored in Redis, so they must not change
// from one release to the next. A change here is a breaking change.
func TestFingerprintJSONGolden(t *testing.T) {
	t.Parallel()
	// The digests were computed apart from this code: the first 16 bytes of
	// SHA-256 over "\xffidem/jcs/v1\x00" and the canonical text, in hex.
	for _, tc := range []struct{ in, want string }{
		{`{"a":1,"b":2}`, "751777fcd532c9edaf5f15224e69d83e"},
		{`{ "b":2, "a":1 }`, "751777fcd532c9edaf5f15224e69d83e"},
		{`{"account":"A","amount":100}`, "e19beb6f3b4bf3731f9e7edfdfc32564"},
		{`[]`, "ab4c49f2af7bac3aaa59fa40df31971e"},
		{`"\u00e9"`, "1062c2cd99002d2bf9230941085f3a1f"},
		{`1e21`, "7193458a6bee925ddd259fa7a3723288"},
	} {
		got, err := idem.FingerprintJSON([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("FingerprintJSON(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
