package httpidem

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/idem-go/idem"
)

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	for _, r := range []response{
		{status: 201, header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b", ""}, "lower-case": {"kept as set"}}, body: []byte(`{"ok":true}`)},
		{status: 204, header: http.Header{}, body: []byte{}},
		{status: 418, header: http.Header{"X-Binary": {"\x00\xff"}}, body: bytes.Repeat([]byte{0, 1, 2, 255}, 1000)},
		{status: 999, header: http.Header{"A": {string(make([]byte, 300))}}, body: []byte{}},
	} {
		enc := r.encode()
		if got := encodedSize(r.status, r.header) + len(r.body); got != len(enc) {
			t.Errorf("encodedSize says %d, encode wrote %d", got, len(enc))
		}
		got, err := decodeResponse(enc)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got.status != r.status || !reflect.DeepEqual(got.header, r.header) || !bytes.Equal(got.body, r.body) {
			t.Errorf("round trip of %+v gave %+v", r, got)
		}
		// One encoding per response, whatever the map's order.
		if again := r.encode(); !bytes.Equal(again, enc) {
			t.Errorf("two encodings of one response differ")
		}
	}
}

// The stored form is pinned: records written by one release are read by
// the next.
func TestEncodingGolden(t *testing.T) {
	t.Parallel()
	r := response{status: 201, header: http.Header{"X-B": {"2"}, "Content-Type": {"text/plain"}, "X-A": {"1", "one"}}, body: []byte("hi")}
	want := "h\x01\xc9\x01\x04" + "\x0cContent-Type\x0atext/plain" + "\x03X-A\x011" + "\x03X-A\x03one" + "\x03X-B\x012" + "hi"
	if got := string(r.encode()); got != want {
		t.Errorf("encode = %q, want %q", got, want)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	valid := response{status: 200, header: http.Header{"A": {"b"}}, body: []byte("x")}.encode()
	for name, b := range map[string][]byte{
		"empty":              nil,
		"other magic":        []byte("x\x01\xc8\x01\x00"),
		"future version":     []byte("h\x02\xc8\x01\x00"),
		"no status":          []byte("h\x01"),
		"status 99":          []byte("h\x01\x63\x00"),
		"status 1000":        []byte("h\x01\xe8\x07\x00"),
		"no header count":    []byte("h\x01\xc8\x01"),
		"count past the end": []byte("h\x01\xc8\x01\x05\x01A\x01b"),
		"truncated value":    valid[:len(valid)-3],
		"empty name":         []byte("h\x01\xc8\x01\x01\x00\x01b"),
		"overlong varint":    []byte("h\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
	} {
		if r, err := decodeResponse(b); err == nil {
			t.Errorf("%s: decoded as %+v, want an error", name, r)
		} else if !errors.Is(err, idem.ErrCorrupt) {
			t.Errorf("%s: %v, want an error wrapping idem.ErrCorrupt", name, err)
		}
	}
}

// FuzzDecodeResponse: decoding never panics, and what decodes encodes back
// to a response that decodes the same.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(response{status: 201, header: http.Header{"A": {"b", "c"}}, body: []byte("body")}.encode())
	f.Add([]byte("h\x01\xc8\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		r2, err := decodeResponse(r.encode())
		if err != nil || r2.status != r.status || !reflect.DeepEqual(r2.header, r.header) || !bytes.Equal(r2.body, r.body) {
			t.Fatalf("%q decodes as %+v, which round-trips as %+v, %v", b, r, r2, err)
		}
	})
}

func TestStorable(t *testing.T) {
	t.Parallel()
	h := http.Header{
		"Content-Type": {"a"}, "Connection": {"X-Hop, keep-alive"}, "X-Hop": {"1"}, "Keep-Alive": {"t"},
		"Transfer-Encoding": {"chunked"}, "Trailer": {"X-Sum"}, "Date": {"d"}, "Content-Length": {"3"},
		"Upgrade": {"h2c"}, "Te": {"trailers"}, "Proxy-Authenticate": {"p"}, "Proxy-Connection": {"c"},
		http.TrailerPrefix + "X-Late": {"l"}, HeaderReplayed: {"true"}, "Set-Cookie": {"a=1", "b=2"}, "date": {"lower"},
	}
	got := storable(h)
	want := http.Header{"Content-Type": {"a"}, "Set-Cookie": {"a=1", "b=2"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("storable = %v, want %v", got, want)
	}
	got["Content-Type"][0] = "changed"
	if h["Content-Type"][0] != "a" {
		t.Errorf("storable shares its values with its argument")
	}
}

// No two (scope, key) pairs share a stored key.
func TestScopedKeyIsUnambiguous(t *testing.T) {
	t.Parallel()
	seen := map[string][2]string{}
	parts := []string{"", "a", "b", "ab", "1", "1:", ":", "a:b", "0", "0:", "10:", "2:ab"}
	for _, scope := range parts {
		for _, key := range parts[1:] { // keys are never empty
			k := ScopedKey(scope, key)
			if other, ok := seen[k]; ok {
				t.Errorf("scope %q + key %q and scope %q + key %q both give %q", scope, key, other[0], other[1], k)
			}
			seen[k] = [2]string{scope, key}
		}
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []string
		want string
		err  bool
	}{
		{in: []string{"abc"}, want: "abc"},
		{in: []string{"!~"}, want: "!~"},
		{in: []string{`"abc"`}, want: "abc"},
		{in: []string{`"a b"`}, want: "a b"},
		{in: []string{`"a\"b\\c"`}, want: `a"b\c`},
		{in: []string{`"`}, want: `"`}, // one quote is not a quoted string; it is visible ASCII
		{in: []string{`"abc`}, want: `"abc`},
		{in: []string{""}, err: true},
		{in: []string{`""`}, err: true},
		{in: []string{"a b"}, err: true},
		{in: []string{"a\x00"}, err: true},
		{in: []string{"é"}, err: true},
		{in: []string{`"é"`}, err: true},
		{in: []string{`"a\b"`}, err: true},
		{in: []string{`"a\"`}, err: true},
		{in: []string{`"a"b"`}, err: true},
		{in: []string{"a", "b"}, err: true},
		{in: []string{"123456"}, err: true}, // over the limit of 5
		{in: []string{`"12345"`}, want: "12345"},
		{in: []string{`"123456"`}, err: true},
	} {
		got, err := parseKey(tc.in, 5)
		if tc.err != (err != nil) || got != tc.want {
			t.Errorf("parseKey(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
