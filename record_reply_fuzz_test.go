package idem

// Fuzz targets for what Do reads from Redis: the claim script's replies
// (its arrays, and the finished records it returns whole) here; the status
// script's reply and a record as stored in record_fuzz_test.go; the
// mapping of keys to Redis keys in idem_fuzz_test.go. The seeds (f.Add)
// run in every go test; fuzz with
//
//	go test -run='^$' -fuzz=FuzzClaimReply -fuzztime=60s .
//
// and likewise FuzzFinished, FuzzStatus, FuzzRecord and FuzzKey.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
)

// A reply of Redis is fuzzed as bytes in this encoding:
//
//	reply := count(1 byte, mod 8) value*
//	value := tag(1 byte, mod 7) ...
//	  0 string: length(1 byte) bytes
//	  1 int64: 8 bytes, big-endian
//	  2 nil
//	  3 array: count(1 byte, mod 8) value*   (nested at most 3 deep)
//	  4 float64: 8 bytes (IEEE 754 bits)
//	  5 bool: 1 byte
//	  6 small int64: 1 byte, signed
//
// Missing bytes read as zero.
type replyReader struct{ b []byte }

func (r *replyReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *replyReader) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return binary.BigEndian.Uint64(buf[:])
}

func (r *replyReader) array(depth int) []any {
	n := int(r.byte() % 8)
	v := make([]any, 0, n)
	for range n {
		v = append(v, r.value(depth))
	}
	return v
}

func (r *replyReader) value(depth int) any {
	switch r.byte() % 7 {
	case 0:
		n := int(r.byte())
		n = min(n, len(r.b))
		s := string(r.b[:n])
		r.b = r.b[n:]
		return s
	case 1:
		return int64(r.u64())
	case 2:
		return nil
	case 3:
		if depth >= 3 {
			return nil
		}
		return r.array(depth + 1)
	case 4:
		return math.Float64frombits(r.u64())
	case 5:
		return r.byte()&1 == 1
	default:
		return int64(int8(r.byte()))
	}
}

func decodeReply(b []byte) []any {
	r := &replyReader{b: b}
	return r.array(0)
}

// encodeReply is decodeReply's inverse for strings (up to 255 bytes),
// int64s, nils and arrays: it makes the seeds.
func encodeReply(v []any) []byte {
	var b []byte
	var enc func(v []any)
	enc = func(v []any) {
		b = append(b, byte(len(v)))
		for _, x := range v {
			switch x := x.(type) {
			case string:
				b = append(b, 0, byte(len(x)))
				b = append(b, x...)
			case int64:
				b = append(b, 1)
				b = binary.BigEndian.AppendUint64(b, uint64(x))
			case nil:
				b = append(b, 2)
			case []any:
				b = append(b, 3)
				enc(x)
			default:
				panic(fmt.Sprintf("encodeReply: %T", x))
			}
		}
	}
	enc(v)
	return b
}

func TestFuzzReplyEncoding(t *testing.T) {
	t.Parallel()
	for _, v := range [][]any{
		{}, {"c", int64(1), int64(30000)}, {"d", ""}, {"x"}, {nil, int64(-1), []any{"a", []any{}}},
	} {
		if got := decodeReply(encodeReply(v)); !reflect.DeepEqual(got, v) {
			t.Errorf("decodeReply(encodeReply(%#v)) = %#v", v, got)
		}
	}
}

// maxLeaseMs is the longest lease left, in milliseconds, that a claim
// reply may carry: 2^40 ms, about 35 years (parseClaim's bound; a
// time.Duration would hold up to 292 years).
const maxLeaseMs = 1 << 40

// wantClaim is the contract of lua/claim.lua's reply (see its header): what
// parseClaim must accept, and how it must read it. Anything else is
// malformed: an attempt number below 1 (attempts count from 1), a negative
// lease, a busy lease with nothing left (busy means lu > now), a lease
// longer than maxLeaseMs, wrong types or lengths. A busy reply may name
// its owner's token (a string, as the scripts from this version on send
// it; possibly empty, for a record made by hand).
func wantClaim(v []any) (claimReply, bool) {
	if len(v) == 0 {
		return claimReply{}, false
	}
	kind, ok := v[0].(string)
	if !ok || len(kind) != 1 {
		return claimReply{}, false
	}
	r := claimReply{kind: replyKind(kind[0])}
	switch r.kind {
	case 'c', 'b':
		if r.kind == 'b' && len(v) == 4 {
			owner, ok := v[3].(string)
			if !ok {
				return claimReply{}, false
			}
			r.owner, v = owner, v[:3]
		}
		if len(v) != 3 {
			return claimReply{}, false
		}
		a, ok1 := v[1].(int64)
		b, ok2 := v[2].(int64)
		if !ok1 || !ok2 {
			return claimReply{}, false
		}
		n, lease := a, b
		if r.kind == 'b' {
			n, lease = b, a
		}
		if n < 1 || lease < 0 || lease > maxLeaseMs || (r.kind == 'b' && lease == 0) {
			return claimReply{}, false
		}
		r.n, r.leaseLeft = n, time.Duration(lease)*time.Millisecond
	case 'v':
		if len(v) != 2 {
			return claimReply{}, false
		}
		s, ok := v[1].(string)
		if !ok {
			return claimReply{}, false
		}
		r.payload = s
	default:
		return claimReply{}, false
	}
	return r, true
}

func FuzzClaimReply(f *testing.F) {
	// A finished record comes back as a string, not in an array (see
	// FuzzFinished): an array that starts with "d" or "f" is malformed.
	rec := func(st, payload string) []any {
		s := buildRecord("1", st, "fp", "owner", "12", payload)
		return []any{st, s, int64(len(s) - len(payload))}
	}
	for _, v := range [][]any{
		{"c", int64(1), int64(30000)},
		{"c", int64(7), int64(0)},
		{"b", int64(1500), int64(2)},
		{"b", int64(1500), int64(2), "owner-token"},
		{"b", int64(1500), int64(2), ""},
		{"b", int64(1500), int64(2), int64(7)},
		{"b", int64(1500), int64(2), "owner", "extra"},
		{"c", int64(1), int64(30000), "owner"},
		{"v", "malformed record"},
		// Malformed: a claim comes back as an integer, a conflict as 0
		// (see TestClaimResult).
		{"x"},
		rec("d", "result bytes"),
		rec("f", "card declined"),
		{},
		{"c"},
		{"c", int64(1)},
		{"c", "1", int64(30000)},
		{"c", int64(0), int64(30000)},
		{"c", int64(-3), int64(30000)},
		{"c", int64(1), int64(-1)},
		{"b", int64(-1), int64(1)},
		{"b", int64(10), int64(0)},
		{"c", int64(1), int64(math.MaxInt64)},
		{"c", int64(1), int64(maxLeaseMs)},
		{"c", int64(1), int64(maxLeaseMs + 1)},
		{"b", int64(maxLeaseMs), int64(3)},
		{"d"},
		{"d", "1d\x00\x00" + "1:x"},
		{"d", "1d\x00\x001:x", int64(0)},
		{"d", "1d\x00\x001:x", int64(6)},
		{"d", "1d\x00\x001:x", int64(7)},
		{"d", "1d\x00\x001:x", int64(8)},
		{"d", "1d\x00\x001:x", int64(-1)},
		{"d", "1d\x00\x001:x", "6"},
		{"d", int64(5), int64(1)},
		{"d", nil, int64(1)},
		{"v"},
		{"v", int64(1)},
		{"x", "extra"},
		{"cc", int64(1), int64(1)},
		{"z", "?"},
		{nil},
		{[]any{"c"}, int64(1), int64(1)},
	} {
		f.Add(encodeReply(v))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v := decodeReply(data)
		got, err := parseClaim(v)
		want, ok := wantClaim(v)
		switch {
		case !ok && err == nil:
			t.Fatalf("parseClaim(%#v) accepted a malformed reply: %+v", v, got)
		case !ok && !errors.Is(err, ErrCorrupt):
			t.Fatalf("parseClaim(%#v): error %v does not wrap ErrCorrupt", v, err)
		case ok && err != nil:
			t.Fatalf("parseClaim(%#v): %v, want %+v", v, err, want)
		case ok && got != want:
			t.Fatalf("parseClaim(%#v) = %+v, want %+v", v, got, want)
		}
	})
}

// FuzzFinished checks readFinished, which reads the finished records that
// claim.lua returns whole, against the reference reader readString: a
// record it calls malformed, or one in progress or released (claim.lua
// never returns those whole), must be refused ('v'); a well-formed one
// gives a conflict when both fingerprints are set and differ, else its
// state and payload.
func FuzzFinished(f *testing.F) {
	for _, s := range []struct{ record, fp string }{
		{buildRecord("1", "d", "", "owner", "1", "stored"), ""},
		{buildRecord("1", "d", "fp", "owner", "12", "a:b:c"), "fp"},
		{buildRecord("1", "d", "fp", "owner", "12", "x"), "other"},
		{buildRecord("1", "d", "", "owner", "12", "x"), "other"},
		{buildRecord("1", "f", "fp", "owner", "3", "declined"), ""},
		{buildRecord("1", "d", "fp", "o:w", "007", ""), "fp"},
		{buildRecord("1", "d", "fp", "owner", "123456789012345", "x"), "fp"},
		{buildRecord("1", "d", "fp", "owner", "1234567890123456", "x"), "fp"},
		{buildRecord("1", "d", "fp", "owner", "0", "x"), "fp"},
		{buildRecord("1", "d", "fp", "owner", "-1", "x"), "fp"},
		{buildRecord("1", "d", "fp", "owner", "", "x"), "fp"},
		{buildRecord("2", "d", "fp", "owner", "1", "x"), "fp"},
		{buildRecord("1", "p", "fp", "owner", "1", "0"), "fp"},
		{"", ""},
		{"1d", ""},
		{"1d\x05ab", ""},
		{"1d\x00\x09own:1:x", ""},
		{"1d\x00\x00", ""},
		{"1d\x00\x00:x", ""},
	} {
		f.Add(s.record, s.fp)
	}
	f.Fuzz(func(t *testing.T, s, fp string) {
		got := readFinished(s, fp)
		rec := readString(s)
		var want claimReply
		switch {
		case rec.malformed != "" || rec.st == "p" || rec.st == "r":
			if got.kind != 'v' || got.payload == "" {
				t.Fatalf("readFinished(%q, %q) = %+v; want it refused (%s)", s, fp, got, rec.malformed)
			}
			return
		case fp != "" && rec.fp != "" && fp != rec.fp:
			want = claimReply{kind: 'x'}
		default:
			want = claimReply{kind: replyKind(rec.st[0]), payload: rec.payload, owner: rec.own}
		}
		if got != want {
			t.Fatalf("readFinished(%q, %q) = %+v, want %+v", s, fp, got, want)
		}
	})
}

// TestLongestLease: every lease that New accepts must come back in a claim
// reply that parseClaim accepts, or Do could never run fn.
func TestLongestLease(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{30 * time.Second, 24 * time.Hour, 10 * 365 * 24 * time.Hour, 100 * 365 * 24 * time.Hour} {
		cfg := defaultConfig()
		WithLease(d)(&cfg)
		WithRetention(2 * d)(&cfg)
		if cfg.validate() != nil {
			continue // New refuses it
		}
		if _, err := parseClaim([]any{"c", int64(1), d.Milliseconds()}); err != nil {
			t.Errorf("WithLease(%v) is accepted, but its claim reply is not: %v", d, err)
		}
	}
}
