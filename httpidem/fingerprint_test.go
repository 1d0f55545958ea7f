package httpidem_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/httpidem"
)

func fingerprint(t *testing.T, method, target, ctype, body string) string {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	fp, err := httpidem.DefaultFingerprint(r, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func TestDefaultFingerprint(t *testing.T) {
	t.Parallel()
	type rq struct{ method, target, ctype, body string }
	base := rq{"POST", "/debits?a=1&b=2", "application/json", `{"account":"A","amount":100}`}
	same := []rq{
		{"POST", "/debits?b=2&a=1", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=2", "application/json; charset=UTF-8", `{ "amount": 100, "account": "A" }`},
		{"POST", "/debits?a=1&b=2", "Application/JSON", "{\n\"amount\":1e2,\"account\":\"\\u0041\"}"},
		{"POST", "http://other.example/debits?a=1&b=2", "application/json", `{"account":"A","amount":100}`},
	}
	different := []rq{
		{"PATCH", "/debits?a=1&b=2", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits/?a=1&b=2", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits%2F?a=1&b=2", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=3", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1", "application/json", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=2", "application/vnd.api+json", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=2", "text/plain", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=2", "", `{"account":"A","amount":100}`},
		{"POST", "/debits?a=1&b=2", "application/json", `{"account":"A","amount":101}`},
		{"POST", "/debits?a=1&b=2", "application/json", `{"account":"A","amount":"100"}`},
		{"POST", "/debits?a=1&b=2", "application/json", ``},
	}
	want := fingerprint(t, base.method, base.target, base.ctype, base.body)
	for _, q := range same {
		if got := fingerprint(t, q.method, q.target, q.ctype, q.body); got != want {
			t.Errorf("%+v: %s, want %s as for %+v", q, got, want, base)
		}
	}
	seen := map[string]rq{want: base}
	for _, q := range different {
		got := fingerprint(t, q.method, q.target, q.ctype, q.body)
		if other, ok := seen[got]; ok {
			t.Errorf("%+v and %+v share the fingerprint %s", q, other, got)
		}
		seen[got] = q
	}
	// Non-JSON bodies count byte for byte; so does JSON that does not parse.
	if fingerprint(t, "POST", "/", "text/plain", "a b") == fingerprint(t, "POST", "/", "text/plain", "a  b") {
		t.Errorf("text bodies that differ share a fingerprint")
	}
	if fingerprint(t, "POST", "/", "application/json", `{"a":1,`) == fingerprint(t, "POST", "/", "application/json", `{"a":1, `) {
		t.Errorf("invalid JSON bodies that differ share a fingerprint")
	}
}

// Golden values: fingerprints are stored in Redis and must not change from
// one release to the next. A change here is a breaking change.
func TestDefaultFingerprintGolden(t *testing.T) {
	t.Parallel()
	// Computed apart from this code: the first 16 bytes of SHA-256 over the
	// fields (each after its length as a uvarint) "httpidem/v1", method,
	// path, sorted query, media type, then "json" and idem.FingerprintJSON of
	// the body (whose numbers are then the shortest decimals of their
	// doubles; for another number, the same digest over the canonical form
	// with the number's own digits), or "raw" and the body.
	for _, tc := range []struct{ method, target, ctype, body, want string }{
		{"POST", "/debits", "application/json", `{"account":"A","amount":100}`, "05d54602d5f98bb98ec3bdf5ffe1865e"},
		{"POST", "/debits", "application/json", `{ "amount": 9007199254740993 }`, "848aa92163fd791cfb77eaa784a15ceb"},
		{"PATCH", "/a/b?z=1&y=2", "text/plain; charset=utf-8", "hello", "eb69cf8eb7a58ef61e0e8a38d2b55b1e"},
		{"POST", "/", "", "", "d131b3e6dfde09eba4460f678a2096b2"},
	} {
		r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
		if tc.ctype != "" {
			r.Header.Set("Content-Type", tc.ctype)
		}
		got, err := httpidem.DefaultFingerprint(r, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s %s %q %q: %s, want %s", tc.method, tc.target, tc.ctype, tc.body, got, tc.want)
		}
	}
}

// JSON numbers are compared by their exact decimal value: amounts that
// differ only beyond 2^53 (or beyond a double's 17 digits) are two
// requests, though RFC 8785 reads them as one double; spellings of one
// value (1, 1.0, 1e0, 10E-1) are one request.
func TestDefaultFingerprintExactNumbers(t *testing.T) {
	t.Parallel()
	fp := func(body string) string { return fingerprint(t, "POST", "/", "application/json", body) }
	for _, pair := range [][2]string{
		{`{"amount":9007199254740993}`, `{"amount":9007199254740992}`},
		{`{"amount":12345678901234567890123}`, `{"amount":12345678901234567890124}`},
		{`{"rate":0.1}`, `{"rate":0.10000000000000001}`},
		{`{"rate":1e-400}`, `{"rate":0}`},
		{`[1.00000000000000000001]`, `[1]`},
	} {
		if fp(pair[0]) == fp(pair[1]) {
			t.Errorf("%s and %s share a fingerprint", pair[0], pair[1])
		}
	}
	for _, group := range [][]string{
		{`{"amount":100}`, `{"amount":100.0}`, `{"amount":1e2}`, `{"amount":1000E-1}`, `{"amount":100.000000000000000000000}`},
		{`{"amount":9007199254740993}`, `{"amount":9007199254740993.0}`, `{"amount":90071992547409930e-1}`},
		{`[0]`, `[-0]`, `[0.0e10]`},
		{`[1e21]`, `[1000000000000000000000]`},
	} {
		for _, body := range group[1:] {
			if fp(body) != fp(group[0]) {
				t.Errorf("%s and %s have different fingerprints", body, group[0])
			}
		}
	}
}

// JSON nested deeper than 10,000 levels is refused with 400 (its
// canonical form is not computed, and it is not fingerprinted as bytes).
func TestDefaultFingerprintTooDeep(t *testing.T) {
	t.Parallel()
	for depth, ok := range map[int]bool{10000: true, 10001: false} {
		body := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		_, err := httpidem.DefaultFingerprint(r, []byte(body))
		if ok != (err == nil) {
			t.Errorf("depth %d: %v", depth, err)
		}
		if err != nil && !strings.Contains(err.Error(), "deeper than 10000") {
			t.Errorf("depth %d: error %q does not give the limit", depth, err)
		}
	}
}
