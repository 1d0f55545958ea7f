package door_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/redis/go-redis/v9"
)

// TestScopedKeyIsUnambiguous: no two (scope, key) pairs give one key,
// among every pair of short strings over an alphabet with the scheme's
// own characters (digits and ':'), and a key is never a scope's prefix.
func TestScopedKeyIsUnambiguous(t *testing.T) {
	alphabet := []string{"", "0", "1", ":", "a", "1:", ":0", "10", "0:a", "2:ab", "a:"}
	seen := map[string][2]string{}
	for _, s1 := range alphabet {
		for _, s2 := range alphabet {
			scope := s1 + s2
			for _, k1 := range alphabet {
				for _, k2 := range alphabet {
					key := k1 + k2
					got := door.Key(scope, key)
					if prev, ok := seen[got]; ok && prev != [2]string{scope, key} {
						t.Fatalf("Key(%q, %q) = Key(%q, %q) = %q", scope, key, prev[0], prev[1], got)
					}
					seen[got] = [2]string{scope, key}
				}
			}
		}
	}
	if got := door.Key("", "order-1"); got != "0:order-1" {
		t.Errorf(`Key("", "order-1") = %q, want "0:order-1" (httpidem's stored keys)`, got)
	}
	if got := door.Key("orders/billing/", "e1"); got != "15:orders/billing/e1" {
		t.Errorf("Key = %q", got)
	}
	for _, scope := range []string{"", "a", strings.Repeat("s", 9), strings.Repeat("s", 10), strings.Repeat("s", 100)} {
		if got, want := len(door.Key(scope, "")), door.KeyOverhead(scope)+len(scope); got != want {
			t.Errorf("KeyOverhead(%d-byte scope) = %d, Key adds %d", len(scope), want-len(scope), got-len(scope))
		}
	}
}

func TestCheckKey(t *testing.T) {
	for _, tc := range []struct {
		values []string
		max    int
		want   string // error substring; "" for none
	}{
		{[]string{"order-1"}, 255, ""},
		{[]string{strings.Repeat("k", 8)}, 8, ""},
		{[]string{strings.Repeat("k", 9)}, 8, "longer than 8 bytes"},
		{[]string{""}, 8, "empty"},
		{nil, 8, "missing"},
		{[]string{"a", "b"}, 8, "more than once"},
		{[]string{"a b"}, 8, "visible ASCII"},
		{[]string{"a\x7f"}, 8, "visible ASCII"},
		{[]string{"é"}, 8, "visible ASCII"},
	} {
		got, err := door.CheckKey(tc.values, tc.max)
		switch {
		case tc.want == "" && (err != nil || got != tc.values[0]):
			t.Errorf("CheckKey(%q, %d) = %q, %v; want the key", tc.values, tc.max, got, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckKey(%q, %d) = %q, %v; want an error saying %q", tc.values, tc.max, got, err, tc.want)
		}
	}
}

func client(t *testing.T, opts ...idem.Option) *idem.Client {
	mr := miniredis.RunT(t)
	c := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}), append([]idem.Option{idem.WithLogger(nil)}, opts...)...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestFitKeyLen(t *testing.T) {
	small := client(t, idem.WithMaxKeyLen(40))
	big := client(t, idem.WithMaxKeyLen(1000))
	for _, tc := range []struct {
		c     *idem.Client
		want  int
		scope string
		got   int
		err   string
	}{
		{big, 0, "", 255, ""},   // the default
		{small, 0, "", 38, ""},  // 40 less "0:"
		{small, 38, "", 38, ""}, // exactly what fits
		{small, 39, "", 0, "WithMaxKeyLen(39) does not fit the Client's WithMaxKeyLen(40)"},
		{small, 0, "orders/billing/", 22, ""}, // 40 less "15:orders/billing/"
		{small, 0, strings.Repeat("s", 37), 0, "leaves no room"},
		{small, 0, strings.Repeat("s", 36), 1, ""},
	} {
		got, err := door.FitKeyLen(tc.c, tc.want, tc.scope)
		if got != tc.got || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("FitKeyLen(Client %d, %d, %q) = %d, %v; want %d, %q", tc.c.MaxKeyLen(), tc.want, tc.scope, got, err, tc.got, tc.err)
		}
		if err == nil && tc.got > 0 && len(door.Key(tc.scope, strings.Repeat("k", got))) > tc.c.MaxKeyLen() {
			t.Errorf("FitKeyLen(Client %d, %d, %q) = %d: a key that long does not fit the Client", tc.c.MaxKeyLen(), tc.want, tc.scope, got)
		}
	}
}

func TestFitResponse(t *testing.T) {
	small := client(t, idem.WithMaxResultSize(1000))
	big := client(t, idem.WithMaxResultSize(4<<20))
	if got, err := door.FitResponse(big, 0); got != door.DefaultMaxResponse || err != nil {
		t.Errorf("FitResponse(4 MiB, 0) = %d, %v; want the default", got, err)
	}
	if got, err := door.FitResponse(small, 0); got != 1000 || err != nil {
		t.Errorf("FitResponse(1000, 0) = %d, %v; want the Client's", got, err)
	}
	if got, err := door.FitResponse(small, 1000); got != 1000 || err != nil {
		t.Errorf("FitResponse(1000, 1000) = %d, %v", got, err)
	}
	if _, err := door.FitResponse(small, 1001); err == nil || !strings.Contains(err.Error(), "WithMaxResultSize(1000)") {
		t.Errorf("FitResponse(1000, 1001): %v, want an error naming the Client's limit", err)
	}
}

func TestCheckRetryAfter(t *testing.T) {
	for d, ok := range map[time.Duration]bool{
		time.Second: true, 2 * time.Second: true, time.Minute: true,
		0: false, -time.Second: false, time.Millisecond: false, 1500 * time.Millisecond: false, time.Second + 1: false,
	} {
		if err := door.CheckRetryAfter(d); (err == nil) != ok {
			t.Errorf("CheckRetryAfter(%v) = %v, want ok %v", d, err, ok)
		}
	}
}

// TestAnswerOf covers every sentinel of Do, alone, wrapped, and joined as
// Do joins them: one reason, one retry rule and one logging rule for
// every door.
func TestAnswerOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("idem: key %q: %w", "k", err) }
	for _, tc := range []struct {
		name   string
		err    error
		reason door.Reason
		log    bool
	}{
		{"ErrConflict", idem.ErrConflict, door.KeyReused, false},
		{"ErrLateRetry", idem.ErrLateRetry, door.LateRetry, false},
		{"ErrInProgress", idem.ErrInProgress, door.InProgress, false},
		{"ErrInProgress+context", errors.Join(idem.ErrInProgress, context.DeadlineExceeded), door.InProgress, false},
		{"ErrParked", idem.ErrParked, door.Parked, false},
		{"ErrUnknownOutcome", idem.ErrUnknownOutcome, door.OutcomeUnknown, false},
		{"ErrInvalidKey", idem.ErrInvalidKey, door.KeyInvalid, false},
		{"ErrTooLarge", idem.ErrTooLarge, door.NotStored, false},
		{"Permanent", idem.Permanent(errors.New("declined")), door.NotStored, false},
		{"StoredError", &idem.StoredError{Message: "declined"}, door.NotStored, false},
		{"ErrCorrupt", idem.ErrCorrupt, door.RecordUnusable, true},
		{"ErrDecode", idem.ErrDecode, door.RecordUnusable, true},
		{"ErrEncode", idem.ErrEncode, door.RecordUnusable, true},
		{"nil", nil, door.RecordUnusable, true}, // a door asked to answer a success has no record to use
		{"ErrUnavailable", idem.ErrUnavailable, door.Unavailable, true},
		{"ErrClosed", idem.ErrClosed, door.Unavailable, false},
		{"ErrExpired", idem.ErrExpired, door.Unavailable, false},
		{"ErrNotRecorded", idem.ErrNotRecorded, door.Unavailable, true},
		{"ErrNotRecorded+Permanent", errors.Join(idem.ErrNotRecorded, idem.Permanent(errors.New("declined"))), door.Unavailable, true},
		{"ErrLeaseLost", idem.ErrLeaseLost, door.Unavailable, true},
		{"context.Canceled", context.Canceled, door.Unavailable, false},
		{"context.DeadlineExceeded", context.DeadlineExceeded, door.Unavailable, false},
		{"other", errors.New("boom"), door.Unavailable, true},
	} {
		for _, err := range []error{tc.err, wrap(tc.err)} {
			if tc.err == nil && err != nil {
				continue
			}
			a := door.AnswerOf(err, "Idempotency-Key")
			if a.Reason != tc.reason || (a.Log != "") != tc.log || a.Verdict != idem.VerdictOf(err) {
				t.Errorf("%s (%v): reason %s, log %q, verdict %v; want %s, log %v, %v", tc.name, err, a.Reason, a.Log, a.Verdict, tc.reason, tc.log, idem.VerdictOf(err))
			}
			if a.Reason.Title() == "" || a.Detail == "" {
				t.Errorf("%s: no title or detail: %+v", tc.name, a)
			}
			if a.Reason == door.KeyReused && !strings.Contains(a.Detail, "Idempotency-Key") {
				t.Errorf("%s: detail %q does not name the key", tc.name, a.Detail)
			}
		}
	}
}

func TestReasons(t *testing.T) {
	seen := map[door.Reason]bool{}
	for _, r := range door.Reasons() {
		if r.Title() == "" || seen[r] || string(r) != strings.ToUpper(string(r)) {
			t.Errorf("reason %q: title %q, seen %v", r, r.Title(), seen[r])
		}
		seen[r] = true
	}
	for _, r := range []door.Reason{door.InProgress, door.Unavailable, door.NotRecorded} {
		if !r.Retryable() {
			t.Errorf("%s not retryable", r)
		}
	}
	for _, r := range []door.Reason{door.KeyReused, door.LateRetry, door.Parked, door.OutcomeUnknown, door.KeyInvalid, door.NotStored, door.RecordUnusable} {
		if r.Retryable() {
			t.Errorf("%s retryable", r)
		}
	}
	if door.Reason("NOPE").Title() != "" {
		t.Error("an unknown reason has a title")
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	pairs := map[string][]string{"b": {"2", ""}, "a": {"1"}, "c": {strings.Repeat("v", 300)}}
	b := door.AppendFrame(nil, 'x', 3)
	b = door.AppendUvarint(b, 201)
	b = door.AppendString(b, "type.Name")
	b = door.AppendPairs(b, pairs)
	b = door.AppendPairs(b, nil)
	if got, want := len(b), 2+door.UvarintLen(201)+door.UvarintLen(9)+9+door.PairsSize(pairs)+door.PairsSize(nil); got != want {
		t.Errorf("encoded %d bytes, sizes say %d", got, want)
	}
	b = append(b, "body"...)
	d, err := door.ReadFrame(b, 'x', 3)
	if err != nil {
		t.Fatal(err)
	}
	x, ok1 := d.Uvarint()
	s, ok2 := d.String()
	p, ok3 := d.Pairs()
	q, ok4 := d.Pairs()
	if !ok1 || !ok2 || !ok3 || !ok4 || x != 201 || s != "type.Name" || q != nil || string(d.Rest()) != "body" {
		t.Fatalf("read %d %q %v %v %q (%v %v %v %v)", x, s, p, q, d.Rest(), ok1, ok2, ok3, ok4)
	}
	if fmt.Sprint(p) != fmt.Sprint(pairs) {
		t.Errorf("pairs %v, want %v", p, pairs)
	}
	// Names are written sorted, whatever the map's order.
	if !bytes.Contains(b, []byte("\x01a\x011\x01b\x012")) {
		t.Errorf("pairs not sorted by name: %q", b)
	}
	for _, bad := range [][]byte{nil, {'y', 3}, {'x', 4}} {
		if _, err := door.ReadFrame(bad, 'x', 3); !errors.Is(err, idem.ErrCorrupt) {
			t.Errorf("ReadFrame(%q): %v, want ErrCorrupt", bad, err)
		}
	}
	// Cut short anywhere, a field does not read.
	for n := 3; n < len(b)-len("body"); n++ {
		d, _ := door.ReadFrame(b[:n], 'x', 3)
		_, ok1 := d.Uvarint()
		_, ok2 := d.String()
		_, ok3 := d.Pairs()
		_, ok4 := d.Pairs()
		if ok1 && ok2 && ok3 && ok4 && n < len(b)-len("body")-1 {
			t.Errorf("cut at %d of %d: every field read", n, len(b))
		}
	}
	// A count larger than the bytes left is refused before allocating.
	d, _ = door.ReadFrame(append(door.AppendFrame(nil, 'x', 3), door.AppendUvarint(nil, 1<<40)...), 'x', 3)
	if _, ok := d.Pairs(); ok {
		t.Error("a huge pair count read")
	}
}

// TestLoggerIsReadAtLogTime: door.Logger logs to slog.Default() as it is
// when a record is logged.
func TestLoggerIsReadAtLogTime(t *testing.T) {
	l := door.Logger()
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	l.Info("after SetDefault")
	if !strings.Contains(buf.String(), "after SetDefault") {
		t.Errorf("the logger made before SetDefault did not log to the new default: %q", buf.String())
	}
}
