package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

func TestReplayRunsFnOnce(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		var l idemtest.Runs
		ctx := context.Background()
		for i := range 5 {
			got, err := c.Do(ctx, "order-1", "fp", l.Fn("receipt"))
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if string(got) != "receipt#1" {
				t.Fatalf("call %d: got %q, want %q", i, got, "receipt#1")
			}
		}
		if got := l.Count("order-1"); got != 1 {
			t.Fatalf("fn ran %d times, want 1", got)
		}
		// Another Client (another service instance) replays it too.
		got, err := b.Idem(t).Do(ctx, "order-1", "fp", l.Fn("other"))
		if err != nil || string(got) != "receipt#1" {
			t.Fatalf("second client: got %q, %v; want %q", got, err, "receipt#1")
		}
		if got := l.Count("order-1"); got != 1 {
			t.Fatalf("fn ran %d times, want 1", got)
		}
	})
}

func TestConflict(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithWait(time.Minute))
		ctx := context.Background()
		var l idemtest.Runs
		started, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := c.Do(ctx, "k", idem.Fingerprint("A", 100), func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				close(started)
				<-release
				return []byte("ok"), nil
			})
			done <- err
		}()
		<-started

		// While the first call runs: a conflict at once, although the
		// waiter would wait a minute for a matching duplicate.
		t0 := time.Now()
		_, err := c.Do(ctx, "k", idem.Fingerprint("A", 200), l.Fn("x"))
		if !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("while running: got %v, want ErrConflict", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Fatalf("conflict took %v: it waited", d)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		// After completion, from another client too.
		_, err = b.Idem(t).Do(ctx, "k", idem.Fingerprint("A", 200), l.Fn("x"))
		if !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("after done: got %v, want ErrConflict", err)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		// An empty fingerprint is not checked.
		got, err := c.Do(ctx, "k", "", l.Fn("x"))
		if err != nil || string(got) != "ok" {
			t.Fatalf("empty fingerprint: got %q, %v", got, err)
		}
	})
}

func TestConcurrentCallersRunFnOnce(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		const callers = 32
		clients := []*idem.Client{b.Idem(t), b.Idem(t)}
		var l idemtest.Runs
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]string, callers)
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				<-start
				res, err := clients[i%2].Do(context.Background(), "hot", "fp", func(ctx context.Context) ([]byte, error) {
					l.Add(ctx)
					time.Sleep(20 * time.Millisecond)
					return []byte("the-result"), nil
				})
				results[i], errs[i] = string(res), err
			})
		}
		close(start)
		wg.Wait()
		if n := l.Count("hot"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		for i := range callers {
			if errs[i] != nil || results[i] != "the-result" {
				t.Errorf("caller %d: got %q, %v; want the result", i, results[i], errs[i])
			}
		}
	})
}

func TestTransientErrorReleases(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var l idemtest.Runs
		boom := errors.New("bank timed out")
		_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return nil, boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want the fn's error", err)
		}
		st, err := c.Status(ctx, "k")
		if err != nil || st.State != idem.StateReleased || st.Attempt != 1 {
			t.Fatalf("status after error: %+v, %v; want released attempt 1", st, err)
		}
		got, err := c.Do(ctx, "k", "fp", l.Fn("ok"))
		if err != nil || string(got) != "ok#2" {
			t.Fatalf("retry: got %q, %v; want ok#2", got, err)
		}
		if got := fmt.Sprint(l.Of("k")); got != "[1 2]" {
			t.Fatalf("attempts that ran: %s, want [1 2]", got)
		}
	})
}

func TestPermanentErrorReplayed(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var l idemtest.Runs
		declined := errors.New("card declined")
		_, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return nil, idem.Permanent(declined)
		})
		if !errors.Is(err, declined) || !idem.IsPermanent(err) {
			t.Fatalf("owner: got %v, want the permanent error", err)
		}
		for range 2 {
			_, err = c.Do(ctx, "k", "fp", l.Fn("never"))
			var se *idem.StoredError
			if !errors.As(err, &se) || se.Message != "card declined" || !idem.IsPermanent(err) {
				t.Fatalf("replay: got %v (%T), want *StoredError %q", err, err, "card declined")
			}
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		if st, _ := c.Status(ctx, "k"); st.State != idem.StateFailed {
			t.Fatalf("state %v, want failed", st.State)
		}
	})
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var l idemtest.Runs
		func() {
			defer func() {
				if p := recover(); p != "kaboom" {
					t.Fatalf("recovered %v, want the fn's panic", p)
				}
			}()
			_, _ = c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				panic("kaboom")
			})
			t.Fatal("Do returned after fn panicked")
		}()
		got, err := c.Do(ctx, "k", "fp", l.Fn("ok"))
		if err != nil || string(got) != "ok#2" {
			t.Fatalf("after panic: got %q, %v; want ok#2 at once", got, err)
		}
	})
}

func TestRetentionEnds(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t, idem.WithRetention(time.Hour), idem.WithLease(time.Minute))
	ctx := context.Background()
	var l idemtest.Runs
	if _, err := c.Do(ctx, "k", "fp", l.Fn("a")); err != nil {
		t.Fatal(err)
	}
	b.Advance(t, 59*time.Minute)
	if got, err := c.Do(ctx, "k", "fp", l.Fn("b")); err != nil || string(got) != "a#1" {
		t.Fatalf("within retention: got %q, %v; want a#1", got, err)
	}
	b.Advance(t, 2*time.Minute)
	if st, _ := c.Status(ctx, "k"); st.State != idem.StateAbsent {
		t.Fatalf("after retention: state %v, want absent", st.State)
	}
	if got, err := c.Do(ctx, "k", "fp", l.Fn("b")); err != nil || string(got) != "b#1" {
		t.Fatalf("after retention: got %q, %v; want b#1 (a new operation)", got, err)
	}
	if n := l.Count("k"); n != 2 {
		t.Fatalf("fn ran %d times, want 2", n)
	}
}

func TestRedisUnreachableFailsClosed(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		// Down for good: no other test's server may take its port.
		c := idemtest.Downed(t, b, redistest.Config{}, func(b *idemtest.Backend) *idem.Client { return b.Idem(t) })
		ran := false
		_, err := c.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
			ran = true
			return nil, nil
		})
		if err == nil || ran {
			t.Fatalf("got err %v, ran %v; want an error and fn not run", err, ran)
		}
		if !strings.Contains(err.Error(), "claim") {
			t.Fatalf("error %q does not say the claim failed", err)
		}
	})
}

func TestCorruptRecordFailsClosed(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		cases := []struct {
			name  string
			setup []any
			want  error // nil: any error
		}{
			{"garbage", []any{"SET", "%s", "garbage"}, idem.ErrCorrupt},
			{"not a string", []any{"HSET", "%s", "st", "d"}, idem.ErrCorrupt},
			{"future version", []any{"SET", "%s", "9d\x00\x001:x"}, idem.ErrCorrupt},
			{"bad state", []any{"SET", "%s", "1?\x00\x001:0"}, idem.ErrCorrupt},
			{"bad attempt", []any{"SET", "%s", "1p\x00\x00x:0"}, idem.ErrCorrupt},
			{"bad lease mark", []any{"SET", "%s", "1p\x00\x001:soon"}, idem.ErrCorrupt},
			{"truncated", []any{"SET", "%s", "1d\x05ab"}, idem.ErrCorrupt},
		}
		for i, tc := range cases {
			key := fmt.Sprintf("bad-%d", i)
			args := append([]any(nil), tc.setup...)
			args[1] = idem.RecordKey(c, key)
			b.Do(t, args...)
			ran := false
			_, err := c.Do(context.Background(), key, "fp", func(context.Context) ([]byte, error) {
				ran = true
				return nil, nil
			})
			if err == nil || ran || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("%s: got %v, ran %v; want %v and fn not run", tc.name, err, ran, tc.want)
			}
			if _, err := c.Status(context.Background(), key); err == nil {
				t.Errorf("%s: Status gave no error", tc.name)
			}
		}
	})
}

func TestStoreFailureIsNotRecorded(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		var got []byte
		var err error
		idemtest.UntilHeld(t, b, redistest.Config{}, func(b *idemtest.Backend) (held bool) {
			c := b.Idem(t, idem.WithStoreTimeout(300*time.Millisecond))
			got, err = c.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
				held = b.Down(t) // and no other test's server may take its port
				return []byte("done"), nil
			})
			return held
		})
		if !errors.Is(err, idem.ErrNotRecorded) {
			t.Fatalf("got %v, want ErrNotRecorded", err)
		}
		if string(got) != "done" {
			t.Fatalf("got result %q, want fn's result with the error", got)
		}
	})
}

func TestResultTooLarge(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithMaxResultSize(1<<10))
		ctx := context.Background()
		var l idemtest.Runs
		big := func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return make([]byte, 10<<10), nil
		}
		_, err := c.Do(ctx, "k", "fp", big)
		if !errors.Is(err, idem.ErrTooLarge) {
			t.Fatalf("owner: got %v, want ErrTooLarge", err)
		}
		_, err = c.Do(ctx, "k", "fp", big)
		var se *idem.StoredError
		if !errors.As(err, &se) || !strings.Contains(se.Message, "10240 bytes") {
			t.Fatalf("replay: got %v, want a stored error that names the size", err)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		// Only the message is stored, not the 10 KiB.
		if n := b.Do(t, "STRLEN", idem.RecordKey(c, "k")).(int64); n > 200 {
			t.Fatalf("stored error is %d bytes", n)
		}
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithMaxKeyLen(64))
		ctx := context.Background()
		var l idemtest.Runs
		for _, key := range []string{"", strings.Repeat("k", 65)} {
			_, err := c.Do(ctx, key, "", l.Fn("x"))
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Errorf("key of %d bytes: got %v, want ErrInvalidKey", len(key), err)
			}
		}
		good := []string{
			strings.Repeat("k", 64), "\x00\xff binary", "{", "}", "}x", "a}b{c", "{a}", `\c`, `\}`, "}}", "\\", "ключ",
		}
		seenRecords := map[string]string{}
		for _, key := range good {
			got, err := c.Do(ctx, key, "", func(ctx context.Context) ([]byte, error) {
				l.Add(ctx)
				return []byte(key), nil
			})
			if err != nil || string(got) != key {
				t.Errorf("key %q: got %q, %v", key, got, err)
			}
			rk, ch := idem.RecordKey(c, key), idem.ChannelKey(c, key)
			if tag := idemtest.HashTag(rk); tag == rk || tag == "" || tag != idemtest.HashTag(ch) {
				t.Errorf("key %q: record %q and channel %q do not share a non-empty hash tag", key, rk, ch)
			}
			if other, dup := seenRecords[rk]; dup {
				t.Errorf("keys %q and %q share the record %q", key, other, rk)
			}
			seenRecords[rk] = key
		}
		for _, key := range good {
			if n := l.Count(key); n != 1 {
				t.Errorf("key %q: fn ran %d times", key, n)
			}
		}
		_, err := c.Do(ctx, "k", "", nil)
		if err == nil || !strings.Contains(err.Error(), "nil fn") {
			t.Errorf("nil fn: got %v", err)
		}
	})
}

type receipt struct {
	ID      string
	Amount  int64
	At      time.Time
	Tags    map[string]string
	Lines   []float64
	Comment *string
}

func TestTypedRoundTrip(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		note := "first"
		want := receipt{
			ID: "r-1", Amount: -100, At: time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC),
			Tags: map[string]string{"a": "1", "b": "2"}, Lines: []float64{1.5, -2}, Comment: &note,
		}
		var runs atomic.Int32
		fn := func(context.Context) (receipt, error) {
			runs.Add(1)
			return want, nil
		}
		first, err := idem.Do(ctx, c, "k", "fp", fn)
		if err != nil {
			t.Fatal(err)
		}
		replay, err := idem.Do(ctx, c, "k", "fp", fn)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []receipt{first, replay} {
			if got.ID != want.ID || got.Amount != want.Amount || !got.At.Equal(want.At) ||
				fmt.Sprint(got.Tags) != fmt.Sprint(want.Tags) || fmt.Sprint(got.Lines) != fmt.Sprint(want.Lines) ||
				got.Comment == nil || *got.Comment != note {
				t.Errorf("got %+v, want %+v", got, want)
			}
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		// A stored result that does not decode into T fails closed.
		if _, err := idem.Do(ctx, c, "k", "fp", func(context.Context) (chan int, error) { return nil, nil }); err == nil {
			t.Fatal("decoding into a channel type: no error")
		}
		if _, err := idem.Do(ctx, c, "k", "fp", func(context.Context) (int, error) { return 0, nil }); !errors.Is(err, idem.ErrCorrupt) {
			t.Fatalf("decoding a struct into int: got %v, want ErrCorrupt", err)
		}
	})
}

func TestEvictionPolicyWarning(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{MaxMemoryPolicy: "volatile-lru"})
	var buf syncBuffer
	c := idem.New(b.Client(t), idem.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	_ = c.Close() // waits for the check
	if !strings.Contains(buf.String(), "volatile-lru") {
		t.Fatalf("log %q does not warn about volatile-lru", buf.String())
	}

	b = idemtest.Redis(t, redistest.Config{})
	buf = syncBuffer{}
	c = idem.New(b.Client(t), idem.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	_ = c.Close()
	if buf.String() != "" {
		t.Fatalf("noeviction: unexpected log %q", buf.String())
	}

	// CONFIG disabled (renamed away): say that it could not be checked.
	b = idemtest.Redis(t, redistest.Config{Extra: []string{`rename-command CONFIG ""`}})
	buf = syncBuffer{}
	c = idem.New(b.Client(t), idem.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	_ = c.Close()
	if !strings.Contains(buf.String(), "cannot check") {
		t.Fatalf("CONFIG disabled: log %q does not say the policy could not be checked", buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestInvalidOptionsPanic(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	for _, tc := range []struct {
		opt  idem.Option
		want string
	}{
		{idem.WithLease(0), "WithLease"},
		{idem.WithRetention(-time.Second), "WithRetention"},
		{idem.WithPrefix("a{b"), "WithPrefix"},
		{idem.WithPrefix(""), "WithPrefix"},
		{idem.WithWait(-1), "WithWait"},
		{idem.WithMaxKeyLen(0), "WithMaxKeyLen"},
		{idem.WithMaxResultSize(0), "WithMaxResultSize"},
		{idem.WithPollInterval(0), "WithPollInterval"},
		{idem.WithStoreTimeout(0), "WithStoreTimeout"},
		{idem.WithDetach(0), "WithDetach"},
		{idem.WithDetach(-time.Second), "WithDetach"},
	} {
		func() {
			defer func() {
				p := recover()
				if p == nil || !strings.Contains(fmt.Sprint(p), tc.want) {
					t.Errorf("%s: recovered %v, want a panic naming the option", tc.want, p)
				}
			}()
			c := idem.New(b.Client(t), tc.opt)
			_ = c.Close()
		}()
	}
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "longer than WithRetention") {
				t.Errorf("lease > retention: recovered %v", p)
			}
		}()
		_ = idem.New(b.Client(t), idem.WithLease(time.Hour), idem.WithRetention(time.Minute)).Close()
	}()
}

func TestClosedClient(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := idem.New(b.Client(t))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := c.Do(context.Background(), "k", "", func(context.Context) ([]byte, error) { return nil, nil })
	if !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	var nilClient *idem.Client
	if _, err := nilClient.Do(context.Background(), "k", "", func(context.Context) ([]byte, error) { return nil, nil }); err == nil {
		t.Fatal("nil Client: no error")
	}
}

// A call without a fingerprint that takes over a key claimed with one
// keeps the fingerprint: complete.lua rebuilds the record's header from the
// stored one (the caller built its record without it), and the key still
// refuses other parameters.
func TestTakeoverWithoutFingerprintKeepsIt(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithWait(0))
		ctx := context.Background()
		var l idemtest.Runs
		if _, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			l.Add(ctx)
			return nil, errors.New("transient")
		}); err == nil {
			t.Fatal("no error from a failing fn")
		}
		got, err := c.Do(ctx, "k", "", l.Fn("x"))
		if err != nil || string(got) != "x#2" {
			t.Fatalf("takeover without a fingerprint: got %q, %v; want x#2", got, err)
		}
		if got, err := c.Do(ctx, "k", "fp", l.Fn("y")); err != nil || string(got) != "x#2" {
			t.Fatalf("replay with the first fingerprint: got %q, %v; want x#2", got, err)
		}
		if _, err := c.Do(ctx, "k", "other", l.Fn("z")); !errors.Is(err, idem.ErrConflict) {
			t.Fatalf("other parameters: got %v, want ErrConflict", err)
		}
		if n := l.Count("k"); n != 2 {
			t.Fatalf("fn ran %d times, want 2", n)
		}
	})
}

// A replayed result is handed over without a copy (see replyBytes): changing
// it must change neither the record nor a later replay.
func TestReplayedResultIsTheCallers(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var l idemtest.Runs
		if _, err := c.Do(ctx, "k", "fp", l.Fn("result")); err != nil {
			t.Fatal(err)
		}
		first, err := c.Do(ctx, "k", "fp", l.Fn("again"))
		if err != nil || string(first) != "result#1" {
			t.Fatalf("replay: got %q, %v; want result#1", first, err)
		}
		for i := range first {
			first[i] = 'x'
		}
		second, err := c.Do(ctx, "k", "fp", l.Fn("again"))
		if err != nil || string(second) != "result#1" {
			t.Fatalf("replay after the first replay's bytes were changed: got %q, %v; want result#1", second, err)
		}
		if n := l.Count("k"); n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
	})
}

// Large results are recorded through recycled buffers (see
// finishedRecord): many at once must each be stored whole and apart.
func TestLargeResultsAtOnce(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		const calls, size = 16, 100 << 10
		result := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, size+i) }
		var wg sync.WaitGroup
		for round := range 3 {
			for i := range calls {
				wg.Go(func() {
					key := fmt.Sprint("large-", round, "-", i)
					if _, err := c.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return result(i), nil }); err != nil {
						t.Errorf("%s: %v", key, err)
					}
				})
			}
			wg.Wait()
		}
		for round := range 3 {
			for i := range calls {
				key := fmt.Sprint("large-", round, "-", i)
				got, err := c.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return nil, errors.New("ran again") })
				if err != nil || !bytes.Equal(got, result(i)) {
					t.Fatalf("%s: replay of %d bytes, %v; want the %d bytes of its own result", key, len(got), err, size+i)
				}
			}
		}
	})
}
