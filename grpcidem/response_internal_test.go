package grpcidem

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestEncodeDecode(t *testing.T) {
	msg := wrapperspb.String("hello")
	body, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []response{
		{typeName: "google.protobuf.StringValue", body: body},
		{typeName: "google.protobuf.StringValue", body: body,
			header:  metadata.MD{"x-b": {"1", "2"}, "x-a": {""}, "x-bin": {"\x00\xff"}},
			trailer: metadata.MD{"x-t": {"t"}}},
		{typeName: "google.protobuf.StringValue"}, // an empty message
	} {
		got, err := decodeResponse(r.encode())
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got.typeName != r.typeName || string(got.body) != string(r.body) ||
			!mdEqual(got.header, r.header) || !mdEqual(got.trailer, r.trailer) {
			t.Errorf("decoded %+v, want %+v", got, r)
		}
		m, err := got.message()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*wrapperspb.StringValue); !ok {
			t.Errorf("message of type %T, want *wrapperspb.StringValue", m)
		}
	}
}

func mdEqual(a, b metadata.MD) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if strings.Join(vs, "\x00") != strings.Join(b[k], "\x00") || len(vs) != len(b[k]) {
			return false
		}
	}
	return true
}

// The stored form is stable across releases.
func TestEncodingGolden(t *testing.T) {
	r := response{typeName: "a.B", header: metadata.MD{"k": {"v1", "v2"}}, trailer: metadata.MD{"t": {""}}, body: []byte{0x0a, 0x01, 'x'}}
	want := "g\x01\x03a.B" + "\x02\x01k\x02v1\x01k\x02v2" + "\x01\x01t\x00" + "\x0a\x01x"
	if got := string(r.encode()); got != want {
		t.Errorf("encoded %q, want %q", got, want)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := response{typeName: "a.B", header: metadata.MD{"k": {"v"}}}.encode()
	for name, b := range map[string][]byte{
		"empty":           nil,
		"other magic":     []byte("h\x01"),
		"other version":   []byte("g\x02\x03a.B\x00\x00"),
		"short name":      []byte("g\x01\x09a.B"),
		"bad name":        []byte("g\x01\x03a..\x00\x00"),
		"no header":       []byte("g\x01\x03a.B"),
		"header too long": []byte("g\x01\x03a.B\x7f\x01k"),
		"empty md key":    []byte("g\x01\x03a.B\x01\x00\x01v\x00"),
		"cut":             good[:len(good)-1],
	} {
		if _, err := decodeResponse(b); !errors.Is(err, idem.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := (response{typeName: "no.such.Type"}).message(); !errors.Is(err, errUnknownType) {
		t.Errorf("unknown type: %v", err)
	}
	if _, err := (response{typeName: "google.protobuf.StringValue", body: []byte{0xff}}).message(); !errors.Is(err, idem.ErrCorrupt) {
		t.Errorf("bad body: %v, want ErrCorrupt", err)
	}
}

// The replayed mark is never stored: a replay sets it itself.
func TestEncodeDropsReplayedMark(t *testing.T) {
	c := &capture{header: metadata.MD{HeaderReplayed: {"true"}, "x": {"1"}}}
	b, err := encodeResponse(wrapperspb.Int64(1), c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.header[HeaderReplayed]; ok || len(r.header["x"]) != 1 {
		t.Errorf("stored header %v", r.header)
	}
	if _, ok := c.header[HeaderReplayed]; !ok {
		t.Error("encoding changed the captured header")
	}
}

func TestScopedKeyIsUnambiguous(t *testing.T) {
	seen := map[string][2]string{}
	for _, p := range [][2]string{{"", "1:ab"}, {"a", "b"}, {"ab", ""}, {"1:a", "b"}, {"", "0:"}, {"", ""}} {
		k := scopedKey(p[0], p[1])
		if q, dup := seen[k]; dup {
			t.Errorf("scope %q key %q and scope %q key %q both give %q", p[0], p[1], q[0], q[1], k)
		}
		seen[k] = p
	}
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		values []string
		ok     bool
	}{
		{[]string{"abc"}, true},
		{[]string{"!~"}, true},
		{[]string{strings.Repeat("k", 8)}, true},
		{[]string{strings.Repeat("k", 9)}, false},
		{[]string{""}, false},
		{[]string{"a b"}, false},
		{[]string{"a\x7f"}, false},
		{[]string{"caf\u00e9"}, false},
		{[]string{"a", "a"}, false},
	} {
		got, err := parseKey(tc.values, 8)
		if (err == nil) != tc.ok || (tc.ok && got != tc.values[0]) {
			t.Errorf("parseKey(%q) = %q, %v; want ok %v", tc.values, got, err, tc.ok)
		}
	}
}

func TestNewUUID(t *testing.T) {
	a, b := newUUID(), newUUID()
	if a == b || len(a) != 36 || a[14] != '4' || !strings.ContainsRune("89ab", rune(a[19])) {
		t.Errorf("newUUID: %q, %q", a, b)
	}
}
