package idem_test

// Tests of stored failures: their identity (codes, errors.Is) for the
// owner and for replays, the bound on their size, and records written by
// earlier versions.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

var (
	errPaymentFailed = errors.New("payment failed")
	errCardDeclined  = fmt.Errorf("card declined: %w", errPaymentFailed)
	errFraud         = &fraudError{Rule: "velocity"}
)

// fraudError is a registered error of a type of its own, for errors.As.
type fraudError struct{ Rule string }

func (e *fraudError) Error() string { return "fraud suspected: " + e.Rule }

func init() {
	idem.RegisterCode("test.card_declined", errCardDeclined)
	idem.RegisterCode("test.fraud", errFraud)
}

// failedRecord is a failed record as lua/record.lua lays it out, with no
// fingerprint, written here independently of the package.
func failedRecord(payload string) string {
	return "1f\x00\x05owner1:" + payload
}

func TestReplayedErrorIdentity(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		for _, tc := range []struct {
			name     string
			err      error
			code     string
			matches  []error
			mismatch []error
		}{
			{"Permanent of a registered error", idem.Permanent(fmt.Errorf("charge 42: %w", errCardDeclined)),
				"test.card_declined", []error{errCardDeclined, errPaymentFailed}, []error{errFraud, idem.ErrTooLarge}},
			{"PermanentCode", idem.PermanentCode("test.card_declined", errors.New("issuer says no")),
				"test.card_declined", []error{errCardDeclined, errPaymentFailed}, []error{errFraud}},
			{"PermanentCode over a registered error", idem.PermanentCode("test.fraud", fmt.Errorf("x: %w", errCardDeclined)),
				"test.fraud", []error{errFraud}, nil},
			{"unregistered code", idem.PermanentCode("bank.E42", errors.New("bank error 42")),
				"bank.E42", nil, []error{errCardDeclined, errPaymentFailed, errFraud}},
			{"no code", idem.Permanent(errors.New("just a message")),
				"", nil, []error{errCardDeclined, errFraud}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				key := "identity " + tc.name
				var runs int
				fn := func(context.Context) ([]byte, error) {
					runs++
					return nil, tc.err
				}
				owner, err := c.Do(ctx, key, "fp", fn)
				if owner != nil || err != tc.err {
					t.Fatalf("owner: got %q, %v; want fn's error", owner, err)
				}
				replays := []error{err}
				for range 2 {
					_, err := c.Do(ctx, key, "fp", fn)
					var se *idem.StoredError
					if !errors.As(err, &se) || se.Message != tc.err.Error() || se.Code != tc.code {
						t.Fatalf("replay: got %#v, want a *StoredError with message %q and code %q", err, tc.err.Error(), tc.code)
					}
					replays = append(replays, err)
				}
				for i, err := range replays {
					who := map[bool]string{true: "owner", false: "replay"}[i == 0]
					if got := idem.Code(err); got != tc.code {
						t.Errorf("%s: Code %q, want %q", who, got, tc.code)
					}
					if !idem.IsPermanent(err) {
						t.Errorf("%s: not permanent", who)
					}
					for _, target := range tc.matches {
						if !errors.Is(err, target) {
							t.Errorf("%s: %v does not match %v", who, err, target)
						}
					}
					for _, target := range tc.mismatch {
						if errors.Is(err, target) {
							t.Errorf("%s: %v matches %v", who, err, target)
						}
					}
				}
				if runs != 1 {
					t.Fatalf("fn ran %d times, want 1", runs)
				}
			})
		}
		// errors.As reaches the registered error of a replay.
		if _, err := c.Do(ctx, "fraud", "", func(context.Context) ([]byte, error) {
			return nil, idem.Permanent(errFraud)
		}); !errors.Is(err, errFraud) {
			t.Fatalf("owner: got %v, want the fraud error", err)
		}
		_, err := c.Do(ctx, "fraud", "", func(context.Context) ([]byte, error) { return nil, nil })
		var fe *fraudError
		if !errors.As(err, &fe) || fe.Rule != "velocity" {
			t.Fatalf("replay: errors.As gave %v, want the registered *fraudError", fe)
		}
	})
}

func TestReplayedTooLargeMatches(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithMaxResultSize(1024))
		ctx := context.Background()
		var l idemtest.Runs
		big := func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return make([]byte, 2048), nil
		}
		for i := range 3 {
			_, err := c.Do(ctx, "k", "fp", big)
			if !errors.Is(err, idem.ErrTooLarge) || idem.Code(err) != "idem.too_large" || !idem.IsPermanent(err) && i > 0 {
				t.Fatalf("call %d: got %v (code %q), want ErrTooLarge", i, err, idem.Code(err))
			}
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}

// TestNestedStoredErrorIsStored: an fn that returns the replayed failure
// of another key returns a permanent error (IsPermanent says so), so Do
// stores it rather than run fn at every retry.
func TestNestedStoredErrorIsStored(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		if _, err := c.Do(ctx, "inner", "", func(context.Context) ([]byte, error) {
			return nil, idem.Permanent(fmt.Errorf("inner: %w", errCardDeclined))
		}); err == nil {
			t.Fatal("inner: no error")
		}
		var l idemtest.Runs
		outer := func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return c.Do(ctx, "inner", "", func(context.Context) ([]byte, error) {
				t.Error("inner fn ran again")
				return nil, nil
			})
		}
		for i := range 3 {
			_, err := c.Do(ctx, "outer", "", outer)
			var se *idem.StoredError
			if !errors.As(err, &se) || se.Message != "inner: card declined: payment failed" || !errors.Is(err, errCardDeclined) {
				t.Fatalf("call %d: got %v, want the inner failure", i, err)
			}
		}
		if got := l.Of("outer"); len(got) != 1 {
			t.Fatalf("outer fn ran as attempts %v, want once", got)
		}
		if st, err := c.Status(ctx, "outer"); err != nil || st.State != idem.StateFailed {
			t.Fatalf("outer: state %v, %v; want failed", st.State, err)
		}
	})
}

// TestLongMessageCut: a permanent error's message is bounded by
// WithMaxResultSize like a result; fn has acted, so it is cut with a note,
// never refused, and the owner still gets the whole error.
func TestLongMessageCut(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithMaxResultSize(1024))
		ctx := context.Background()
		// 4 MiB of text with multi-byte characters, so that the cut must
		// find a character's start.
		long := "declined: " + strings.Repeat("é", 2<<20)
		perm := idem.PermanentCode("test.card_declined", errors.New(long))
		var runs int
		fn := func(context.Context) ([]byte, error) {
			runs++
			return nil, perm
		}
		if _, err := c.Do(ctx, "long", "", fn); err != perm {
			t.Fatalf("owner: got an error of %d bytes, want fn's own", len(err.Error()))
		}
		if n := b.Do(t, "STRLEN", idem.RecordKey(c, "long")).(int64); n > 1024+64 {
			t.Fatalf("the record takes %d bytes, want at most the limit and a header", n)
		}
		_, err := c.Do(ctx, "long", "", fn)
		var se *idem.StoredError
		if !errors.As(err, &se) || se.Code != "test.card_declined" || !errors.Is(err, errCardDeclined) {
			t.Fatalf("replay: got %T %.80q, want a *StoredError with the code", err, err)
		}
		if !strings.HasPrefix(se.Message, "declined: éé") || !strings.HasSuffix(se.Message, fmt.Sprintf("[idem: message cut from %d bytes]", len(long))) ||
			len(se.Message) > 1024 || !utf8.ValidString(se.Message) {
			t.Fatalf("replay: message of %d bytes: %.40q ... %q", len(se.Message), se.Message, se.Message[max(0, len(se.Message)-60):])
		}
		if runs != 1 {
			t.Fatalf("fn ran %d times, want 1", runs)
		}
		// Under a tiny limit, a failure still keeps a readable message.
		tiny := b.Idem(t, idem.WithMaxResultSize(1))
		_, _ = tiny.Do(ctx, "tiny", "", fn)
		_, err = tiny.Do(ctx, "tiny", "", fn)
		if !errors.As(err, &se) || !strings.HasPrefix(se.Message, "declined: é") || len(se.Message) > 256 {
			t.Fatalf("tiny limit: got %q", err)
		}
	})
}

// TestStoredFailuresOfEarlierVersions: records whose payload is the
// message alone, as versions before codes wrote them, replay as before.
func TestStoredFailuresOfEarlierVersions(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := idem.New(rdb)
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		payload, message, code string
	}{
		{"card declined", "card declined", ""},
		{"", "", ""},
		{"idem: result too large: 2048 bytes exceeds the limit of 1024 bytes", "idem: result too large: 2048 bytes exceeds the limit of 1024 bytes", ""},
		{"\x00", "\x00", ""},                           // starts like a coded payload, but is not one
		{"\x00\x01", "\x00\x01", ""},                   // no code length
		{"\x00\x01\x09short", "\x00\x01\x09short", ""}, // a code length past the end
		{"\x00\x02\x01xmsg", "\x00\x02\x01xmsg", ""},   // another format version
		{"\x00\x01\x04codemsg", "msg", "code"},         // this version's coded payload
		{"\x00\x01\x00\x00msg", "\x00msg", ""},         // a message that starts with 0x00
	} {
		key := fmt.Sprintf("old %q", tc.payload)
		if err := mr.Set(idem.RecordKey(c, key), failedRecord(tc.payload)); err != nil {
			t.Fatal(err)
		}
		_, err := c.Do(ctx, key, "", func(context.Context) ([]byte, error) {
			t.Fatalf("%q: fn ran", tc.payload)
			return nil, nil
		})
		var se *idem.StoredError
		if !errors.As(err, &se) || se.Message != tc.message || se.Code != tc.code {
			t.Errorf("payload %q: got %#v, want message %q and code %q", tc.payload, err, tc.message, tc.code)
		}
	}
	// A message that starts with 0x00 is stored so that it reads back as it
	// was, not as a code.
	odd := errors.New("\x00\x01\x02ab and more")
	_, _ = c.Do(ctx, "odd", "", func(context.Context) ([]byte, error) { return nil, idem.Permanent(odd) })
	_, err := c.Do(ctx, "odd", "", func(context.Context) ([]byte, error) { return nil, nil })
	var se *idem.StoredError
	if !errors.As(err, &se) || se.Message != odd.Error() || se.Code != "" {
		t.Errorf("odd message: got %#v, want %q with no code", err, odd)
	}
}

func TestCode(t *testing.T) {
	t.Parallel()
	inner := idem.PermanentCode("inner", errors.New("x"))
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("plain"), ""},
		{inner, "inner"},
		{idem.Permanent(inner), "inner"},
		{fmt.Errorf("wrapped: %w", inner), "inner"},
		{idem.PermanentCode("outer", inner), "outer"},
		{idem.PermanentCode("", errors.New("x")), ""},
		{errors.Join(errors.New("a"), fmt.Errorf("b: %w", errCardDeclined)), "test.card_declined"},
		{fmt.Errorf("%w and %w", errFraud, errCardDeclined), "test.fraud"},
		{fmt.Errorf("big: %w", idem.ErrTooLarge), "idem.too_large"},
		{&idem.StoredError{Message: "m", Code: "stored"}, "stored"},
		{idem.PermanentCode(strings.Repeat("c", 100), errors.New("x")), strings.Repeat("c", 64)},
	} {
		if got := idem.Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if idem.PermanentCode("c", nil) != nil || idem.Permanent(nil) != nil {
		t.Error("a permanent nil is not nil")
	}
	if !idem.IsPermanent(idem.PermanentCode("c", errors.New("x"))) {
		t.Error("PermanentCode is not permanent")
	}
}

func TestRegisterCodePanics(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code   string
		target error
		want   string
	}{
		{"", errors.New("x"), "1 to 64 bytes"},
		{strings.Repeat("c", 65), errors.New("x"), "1 to 64 bytes"},
		{"idem.mine", errors.New("x"), "reserved"},
		{"test.nil", nil, "nil error"},
		{"test.card_declined", errors.New("x"), "registered already"},
	} {
		func() {
			defer func() {
				if p := fmt.Sprint(recover()); !strings.Contains(p, tc.want) || !strings.HasPrefix(p, "idem: ") {
					t.Errorf("RegisterCode(%q): panic %q, want one saying %q", tc.code, p, tc.want)
				}
			}()
			idem.RegisterCode(tc.code, tc.target)
		}()
	}
}

// A stored failure keeps its identity: the replay of a declined card
// matches the registered error, as the owner's error did.
func ExampleRegisterCode() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	// At initialization (see init above):
	//
	//	idem.RegisterCode("test.card_declined", errCardDeclined)
	ctx := context.Background()
	charge := func(context.Context) ([]byte, error) {
		return nil, idem.Permanent(fmt.Errorf("charge 42: %w", errCardDeclined))
	}
	for range 2 {
		_, err := keys.Do(ctx, "payment-9", "", charge)
		var se *idem.StoredError
		fmt.Printf("%v (replayed: %v, declined: %v, code: %s)\n",
			err, errors.As(err, &se), errors.Is(err, errCardDeclined), idem.Code(err))
	}
	// Output:
	// charge 42: card declined: payment failed (replayed: false, declined: true, code: test.card_declined)
	// charge 42: card declined: payment failed (replayed: true, declined: true, code: test.card_declined)
}
