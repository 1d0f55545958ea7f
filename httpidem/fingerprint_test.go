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
	// Computed apart from this code: the first 16 bytes of SHA-256 over the
	// fields (each after its length as a uvarint) "httpidem/v1", method,
	// path, sorted query, media type, then "json" and FingerprintJSON of
	// the body, or "raw" and the body.
	for _, tc := range []struct{ method, target, ctype, body, want string }{
		{"POST", "/debits", "application/json", `{"account":"A","amount":100}`, "05d54602d5f98bb98ec3bdf5ffe1865e"},
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
