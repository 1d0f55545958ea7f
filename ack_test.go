package idem_test

// Ack over every error Do returns: most made by real calls on miniredis,
// the rest built as Do builds them.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// failingMarshaler cannot be encoded: Do[T] finishes its key as a
// permanent failure wrapping ErrEncode once fn returned one.
type failingMarshaler struct{}

func (failingMarshaler) MarshalBinary() ([]byte, error) { return nil, errors.New("no bytes today") }
func (*failingMarshaler) UnmarshalBinary([]byte) error  { return nil }

func TestAck(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	mr := b.MR
	ctx := context.Background()
	c := b.Idem(t, idem.WithWait(0), idem.WithLease(10*time.Second), idem.WithMaxResultSize(256),
		// Long enough for a store on a loaded machine (50ms failed under
		// -race beside parallel tests); the unrecorded rows wait it out.
		idem.WithStoreTimeout(time.Second))
	other := b.Idem(t, idem.WithWait(0), idem.WithLease(10*time.Second))
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	fail := func(err error) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return nil, err }
	}
	do := func(key, fp string, fn func(context.Context) ([]byte, error)) error {
		_, err := c.Do(ctx, key, fp, fn)
		return err
	}
	// must returns err after checking that it matches want (nil: err is
	// nil), so that a row tests the error it names.
	must := func(name string, err, want error) error {
		t.Helper()
		if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%s: Do returned %v, want an error matching %v", name, err, want)
		}
		return err
	}

	type row struct {
		name string
		err  error
		want bool
	}
	var rows []row
	add := func(name string, err error, want bool) { rows = append(rows, row{name, err, want}) }

	// Stored outcomes: acknowledge.
	add("success", must("success", do("ok", "fp", ok), nil), true)
	add("replayed success", must("replay", do("ok", "fp", ok), nil), true)
	add("owner's Permanent", do("perm", "", fail(idem.Permanent(errors.New("card declined")))), true)
	var stored *idem.StoredError
	replayed := do("perm", "", ok)
	if !errors.As(replayed, &stored) {
		t.Fatalf("replay of a permanent failure returned %v, want a *StoredError", replayed)
	}
	add("replayed *StoredError", replayed, true)
	add("owner's PermanentCode", do("code", "", fail(idem.PermanentCode("bank.E42", errors.New("bank error 42")))), true)
	add("ErrConflict, after done", must("conflict", do("ok", "other fp", ok), idem.ErrConflict), true)
	add("owner's result over WithMaxResultSize", must("too large", do("big", "", func(context.Context) ([]byte, error) {
		return make([]byte, 1000), nil
	}), idem.ErrTooLarge), true)
	add("replayed ErrTooLarge", must("too large replay", do("big", "", ok), idem.ErrTooLarge), true)
	_, err := idem.Do(ctx, c, "encode", "", func(context.Context) (failingMarshaler, error) { return failingMarshaler{}, nil })
	add("ErrEncode after fn ran (stored)", must("encode", err, idem.ErrEncode), true)
	type v1 struct{ A int }
	type v2 struct{ B string }
	if _, err := idem.Do(ctx, c, "decode", "", func(context.Context) (v1, error) { return v1{A: 1}, nil }); err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, c, "decode", "", func(context.Context) (v2, error) { return v2{}, nil })
	add("ErrDecode (a stored result, another type)", must("decode", err, idem.ErrDecode), true)

	late := b.Idem(t, idem.WithLease(time.Second), idem.WithRetention(2*time.Second), idem.WithTombstones(time.Hour))
	if _, err := late.Do(ctx, "late", "fp", ok); err != nil {
		t.Fatal(err)
	}
	b.Advance(t, 3*time.Second)
	_, err = late.Do(ctx, "late", "fp", ok)
	add("ErrLateRetry (a tombstone)", must("late retry", err, idem.ErrLateRetry), true)

	// Nothing stored: do not acknowledge.
	add("fn's transient error", do("transient", "", fail(errors.New("database down"))), false)
	_, err = idem.Do(ctx, c, "refused", "", func(context.Context) (chan int, error) { return nil, nil })
	add("ErrEncode before fn (T refused)", must("refused", err, idem.ErrEncode), false)
	add("ErrInvalidKey", must("invalid", do("", "", ok), idem.ErrInvalidKey), false)
	mr.Set("idem:{corrupt}", "garbage")
	add("ErrCorrupt", must("corrupt", do("corrupt", "", ok), idem.ErrCorrupt), false)

	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := other.Do(ctx, "busy", "", func(context.Context) ([]byte, error) {
			close(held)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-held
	add("ErrInProgress", must("in progress", do("busy", "", ok), idem.ErrInProgress), false)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Do(cctx, "busy", "", ok)
	add("cancelled context", err, false)
	dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	<-dctx.Done()
	_, err = c.Do(dctx, "busy", "", ok)
	cancel()
	add("deadline exceeded", err, false)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// fn ran, then its lease was taken over: the newer owner's outcome
	// stands, this one is not stored.
	err = do("lost", "", func(context.Context) ([]byte, error) {
		b.Advance(t, 11*time.Second)
		if _, err := other.Do(ctx, "lost", "", ok); err != nil {
			return nil, err
		}
		return []byte("late"), nil
	})
	add("ErrLeaseLost", must("lease lost", err, idem.ErrLeaseLost), false)

	// fn ran, but Redis refused every completion until the store timeout.
	err = do("unrecorded", "", func(context.Context) ([]byte, error) {
		mr.SetError("LOADING Redis is loading the dataset in memory")
		return []byte("ok"), nil
	})
	mr.SetError("")
	add("ErrNotRecorded", must("not recorded", err, idem.ErrNotRecorded), false)
	err = do("unrecorded-perm", "", func(context.Context) ([]byte, error) {
		mr.SetError("LOADING Redis is loading the dataset in memory")
		return nil, idem.Permanent(errors.New("card declined"))
	})
	mr.SetError("")
	if !idem.IsPermanent(err) {
		t.Fatalf("a permanent failure that could not be stored: Do returned %v, want fn's permanent error joined", err)
	}
	add("ErrNotRecorded joined with fn's Permanent", must("not recorded, permanent", err, idem.ErrNotRecorded), false)

	replicas := b.Idem(t, idem.WithReplicas(1, 10*time.Millisecond))
	_, err = replicas.Do(ctx, "replicas", "", ok)
	add("ErrNotReplicated", must("not replicated", err, idem.ErrNotReplicated), false)

	closed := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}))
	_ = closed.Close()
	_, err = closed.Do(ctx, "closed", "", ok)
	add("ErrClosed", must("closed", err, idem.ErrClosed), false)

	unreachable := idemtest.Downed(t, idemtest.Miniredis(t), redistest.Config{}, func(b *idemtest.Backend) *idem.Client {
		return b.Idem(t, idem.WithLogger(nil))
	})
	_, err = unreachable.Do(ctx, "down", "", ok)
	add("Redis unreachable", err, false)

	// Built as Do builds them, where a real call is slow to arrange.
	add("ErrExpired", fmt.Errorf("%w: key %q: attempt 1 was in progress", idem.ErrExpired, "k"), false)
	add("ErrLeaseLost joined with fn's Permanent", errors.Join(idem.ErrLeaseLost, idem.Permanent(errors.New("x"))), false)
	add("ErrInProgress joined with ctx.Err()", fmt.Errorf("%w: key %q, attempt 1: %w", idem.ErrInProgress, "k", context.Canceled), false)

	add("ErrParked", fmt.Errorf("%w: key %q", idem.ErrParked, "k"), false)
	add("ErrUnknownOutcome (matches ErrParked)", fmt.Errorf("%w: %w: key %q, step %q", idem.ErrUnknownOutcome, idem.ErrParked, "k", "charge"), false)
	add("ErrStepAfterCommit", fmt.Errorf("%w: step %q: %w", idem.ErrStepAfterCommit, "email", errors.New("smtp down")), true)
	add("ErrUnavailable", fmt.Errorf("%w: key %q: connection refused", idem.ErrUnavailable, "k"), false)

	// The verdict of every row: Ack is its Settled, and the dead letters
	// are the rows that neither settle nor can come back cured.
	verdicts := map[string]idem.Verdict{
		"success": idem.VerdictOutcome, "replayed success": idem.VerdictOutcome,
		"owner's Permanent": idem.VerdictFailure, "replayed *StoredError": idem.VerdictFailure,
		"owner's PermanentCode": idem.VerdictFailure, "ErrConflict, after done": idem.VerdictConflict,
		"owner's result over WithMaxResultSize": idem.VerdictTooLarge, "replayed ErrTooLarge": idem.VerdictTooLarge,
		"ErrEncode after fn ran (stored)":           idem.VerdictFailure,
		"ErrDecode (a stored result, another type)": idem.VerdictUndecodable,
		"ErrLateRetry (a tombstone)":                idem.VerdictLateRetry,
		"fn's transient error":                      idem.VerdictTransient,
		"ErrEncode before fn (T refused)":           idem.VerdictUnusable,
		"ErrInvalidKey":                             idem.VerdictInvalidKey,
		"ErrCorrupt":                                idem.VerdictUnusable,
		"ErrInProgress":                             idem.VerdictInProgress,
		"cancelled context":                         idem.VerdictContext,
		"deadline exceeded":                         idem.VerdictContext,
		"ErrLeaseLost":                              idem.VerdictNotRecorded,
		"ErrNotRecorded":                            idem.VerdictNotRecorded,
		"ErrNotRecorded joined with fn's Permanent": idem.VerdictNotRecorded,
		"ErrNotReplicated":                          idem.VerdictNotRecorded,
		"ErrClosed":                                 idem.VerdictUnavailable,
		"Redis unreachable":                         idem.VerdictUnavailable,
		"ErrExpired":                                idem.VerdictTransient,
		"ErrLeaseLost joined with fn's Permanent":   idem.VerdictNotRecorded,
		"ErrInProgress joined with ctx.Err()":       idem.VerdictInProgress,
		"ErrParked":                                 idem.VerdictParked,
		"ErrUnknownOutcome (matches ErrParked)":     idem.VerdictUnknownOutcome,
		"ErrStepAfterCommit":                        idem.VerdictOutcome,
		"ErrUnavailable":                            idem.VerdictUnavailable,
	}
	deadLetters := map[idem.Verdict]bool{idem.VerdictInvalidKey: true, idem.VerdictUnusable: true}
	for _, r := range rows {
		if r.err == nil && r.name != "success" && r.name != "replayed success" {
			t.Errorf("%s: the call returned no error; the row tests nothing", r.name)
			continue
		}
		if got := idem.Ack(r.err); got != r.want {
			t.Errorf("%s: Ack(%v) = %v, want %v", r.name, r.err, got, r.want)
		}
		want, ok := verdicts[r.name]
		if !ok {
			t.Errorf("%s: no verdict in the table", r.name)
			continue
		}
		v := idem.VerdictOf(r.err)
		if v != want {
			t.Errorf("%s: VerdictOf(%v) = %v, want %v", r.name, r.err, v, want)
		}
		if v.Settled() != r.want || v.DeadLetter() != deadLetters[want] {
			t.Errorf("%s: %v: Settled %v, DeadLetter %v", r.name, v, v.Settled(), v.DeadLetter())
		}
	}
	if len(verdicts) != len(rows) {
		t.Errorf("%d verdicts for %d rows", len(verdicts), len(rows))
	}
	for v := idem.VerdictOutcome; v <= idem.VerdictTransient; v++ {
		if strings.HasPrefix(v.String(), "Verdict(") {
			t.Errorf("verdict %d has no name", int(v))
		}
	}
}
