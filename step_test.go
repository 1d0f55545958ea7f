package idem_test

// Steps (idem.Step): checkpoints, resuming, permanent errors, bounds,
// misuse, StepKey and StepFrom, and the contract of lua/step.lua.

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

// stepRuns counts the runs of each step's fn, by operation key and step.
type stepRuns struct {
	mu sync.Mutex
	m  map[string]int
}

func (r *stepRuns) add(ctx context.Context, step string) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		panic("a step ran without an Attempt in its context")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]int)
	}
	r.m[a.Key+"/"+step]++
}

func (r *stepRuns) count(key, step string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[key+"/"+step]
}

// reservation is a step result of a struct type, to see it round-trip.
type reservation struct {
	ID     string
	Amount int64
	At     time.Time
}

// debitSteps is a three-step fn: reserve, charge, notify. notify fails
// transiently while failNotify is set. It returns the three results.
func debitSteps(runs *stepRuns, failNotify *atomic.Bool) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		res, err := idem.Step(ctx, "reserve", func(ctx context.Context) (reservation, error) {
			runs.add(ctx, "reserve")
			a, _ := idem.AttemptFrom(ctx)
			return reservation{ID: fmt.Sprint("res#", a.Number), Amount: 125, At: time.UnixMilli(1_700_000_000_000)}, nil
		})
		if err != nil {
			return "", err
		}
		charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			runs.add(ctx, "charge")
			a, _ := idem.AttemptFrom(ctx)
			return fmt.Sprint("ch#", a.Number), nil
		})
		if err != nil {
			return "", err
		}
		sent, err := idem.Step(ctx, "notify", func(ctx context.Context) (bool, error) {
			runs.add(ctx, "notify")
			if failNotify.Load() {
				return false, errors.New("mail server down")
			}
			return true, nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s %d %v %s %v", res.ID, res.Amount, res.At.Equal(time.UnixMilli(1_700_000_000_000)), charge, sent), nil
	}
}

// Row 39 in miniature: a transient error in step 3 releases the key; the
// next attempt gets steps 1 and 2 from their checkpoints, runs step 3
// alone, and returns what the first attempt's steps returned.
func TestStepsResumeAfterTransientError(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var runs stepRuns
		var fail atomic.Bool
		fail.Store(true)
		_, err := idem.Do(ctx, c, "debit-1", "fp", debitSteps(&runs, &fail))
		if err == nil || !strings.Contains(err.Error(), "mail server down") {
			t.Fatalf("attempt 1: got %v, want the transient error of step 3", err)
		}
		idemtest.WantStatus(t, b, "debit-1", idem.StateReleased, 1)

		fail.Store(false)
		got, err := idem.Do(ctx, b.Idem(t), "debit-1", "fp", debitSteps(&runs, &fail))
		if want := "res#1 125 true ch#1 true"; err != nil || got != want {
			t.Fatalf("attempt 2: got %q, %v; want %q", got, err, want)
		}
		for step, want := range map[string]int{"reserve": 1, "charge": 1, "notify": 2} {
			if n := runs.count("debit-1", step); n != want {
				t.Errorf("step %s ran %d times, want %d", step, n, want)
			}
		}
		// Done: a replay runs no step.
		got, err = idem.Do(ctx, c, "debit-1", "fp", debitSteps(&runs, &fail))
		if err != nil || got != "res#1 125 true ch#1 true" {
			t.Fatalf("replay: got %q, %v", got, err)
		}
		if n := runs.count("debit-1", "notify"); n != 2 {
			t.Fatalf("the replay ran step notify (%d runs)", n)
		}
	})
}

// A permanent error is checkpointed: the next attempt gets it back as a
// *StoredError, with its message and code, and does not run the step.
func TestStepPermanentErrorCheckpointed(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var runs stepRuns
		fn := func(ctx context.Context) (string, error) {
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				runs.add(ctx, "charge")
				return "", idem.PermanentCode("card_declined", errors.New("card declined"))
			})
			if a, _ := idem.AttemptFrom(ctx); a.Number == 1 {
				// The owner sees its step's own error...
				if idem.Code(err) != "card_declined" || err.Error() != "card declined" {
					return "", fmt.Errorf("attempt 1 got %v (code %q)", err, idem.Code(err))
				}
				return "", errors.New("crashed after the step") // transient
			}
			return "", err
		}
		if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || err.Error() != "crashed after the step" {
			t.Fatalf("attempt 1: %v", err)
		}
		// ...and the next attempt gets the checkpoint, which fn returns as
		// the operation's stored failure.
		_, err := idem.Do(ctx, c, "k", "", fn)
		var se *idem.StoredError
		if !errors.As(err, &se) || se.Message != "card declined" || se.Code != "card_declined" {
			t.Fatalf("attempt 2: got %#v, want the stored failure of step charge", err)
		}
		if n := runs.count("k", "charge"); n != 1 {
			t.Fatalf("step charge ran %d times, want 1", n)
		}
		idemtest.WantStatus(t, b, "k", idem.StateFailed, 2)
	})
}

// A result over WithMaxResultSize, and one that would take the
// operation's checkpoints past four times that, are checkpointed as
// permanent failures wrapping ErrTooLarge, and never run again.
func TestStepLargeValues(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		const limit = 1000
		c := b.Idem(t, idem.WithMaxResultSize(limit))
		ctx := context.Background()
		var runs stepRuns
		fn := func(ctx context.Context) (string, error) {
			var errs []string
			_, err := idem.Step(ctx, "big", func(ctx context.Context) (string, error) {
				runs.add(ctx, "big")
				return strings.Repeat("x", 2*limit), nil
			})
			if !errors.Is(err, idem.ErrTooLarge) || !idem.IsPermanent(err) {
				return "", fmt.Errorf("step big: got %v, want a permanent ErrTooLarge", err)
			}
			errs = append(errs, "big")
			// 900-byte results: four fit in the total of 4000 bytes, the
			// fifth does not.
			for i := 1; i <= 5; i++ {
				name := fmt.Sprint("s", i)
				v, err := idem.Step(ctx, name, func(ctx context.Context) (string, error) {
					runs.add(ctx, name)
					return strings.Repeat(name[1:], 900), nil
				})
				switch {
				case i < 5 && (err != nil || len(v) != 900):
					return "", fmt.Errorf("step %s: got %d bytes, %v", name, len(v), err)
				case i == 5 && !(errors.Is(err, idem.ErrTooLarge) && idem.IsPermanent(err)):
					return "", fmt.Errorf("step s5: got %v, want a permanent ErrTooLarge", err)
				}
			}
			if a, _ := idem.AttemptFrom(ctx); a.Number == 1 {
				return "", errors.New("transient")
			}
			return "ok " + strings.Join(errs, ","), nil
		}
		if _, err := idem.Do(ctx, c, "k", "", fn); err == nil || err.Error() != "transient" {
			t.Fatalf("attempt 1: %v", err)
		}
		got, err := idem.Do(ctx, c, "k", "", fn)
		if err != nil || got != "ok big" {
			t.Fatalf("attempt 2: got %q, %v", got, err)
		}
		for _, step := range []string{"big", "s1", "s2", "s3", "s4", "s5"} {
			if n := runs.count("k", step); n != 1 {
				t.Errorf("step %s ran %d times, want 1", step, n)
			}
		}
		total, err := b.Client(t).HGet(ctx, idem.RecordKey(c, "k")+":steps", "").Int()
		if err != nil || total > 4*limit+2*(limit+300) {
			t.Fatalf("the checkpoints take %d bytes (%v), over the bound", total, err)
		}
	})
}

// Misuse gets an error naming the step, and the step's fn does not run.
func TestStepMisuse(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var ran atomic.Int64
		count := func(context.Context) (int, error) { ran.Add(1); return 1, nil }
		wantErr := func(what string, err error, parts ...string) {
			t.Helper()
			if err == nil {
				t.Errorf("%s: no error", what)
				return
			}
			for _, p := range parts {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("%s: error %q does not say %q", what, err, p)
				}
			}
		}

		_, err := idem.Step(ctx, "outside", count)
		wantErr("outside Do", err, `"outside"`, "outside the fn of a Do call")

		var leaked context.Context
		_, err = idem.Do(ctx, c, "k", "", func(ctx context.Context) (int, error) {
			leaked = ctx
			_, err := idem.Step(ctx, "outer", func(ctx context.Context) (int, error) {
				_, err := idem.Step(ctx, "inner", count)
				wantErr("nested", err, `"inner"`, `"outer"`, "do not nest")
				return 0, nil
			})
			if err != nil {
				return 0, err
			}
			_, err = idem.Step(ctx, "outer", count)
			wantErr("duplicate", err, `"outer"`, "twice")
			_, err = idem.Step(ctx, "", count)
			wantErr("empty name", err, "empty name")
			_, err = idem.Step(ctx, strings.Repeat("n", 257), count)
			wantErr("long name", err, "nnnn", "257 bytes")
			_, err = idem.Step[int](ctx, "nil-fn", nil)
			wantErr("nil fn", err, `"nil-fn"`, "nil fn")
			_, err = idem.Step(ctx, "chan", func(context.Context) (chan int, error) { ran.Add(1); return nil, nil })
			wantErr("refused type", err, `"chan"`)
			if !errors.Is(err, idem.ErrEncode) {
				t.Errorf("refused type: %v does not match ErrEncode", err)
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = idem.Step(leaked, "late", count)
		wantErr("after fn returned", err, `"late"`, "after its Do call's fn returned")
		// An fn that made no step: its first step, after it returned, is
		// refused as well.
		_, err = c.Do(ctx, "misuse-none", "", func(ctx context.Context) ([]byte, error) {
			leaked = ctx
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = idem.Step(leaked, "late", count)
		wantErr("after a stepless fn returned", err, `"late"`, "after its Do call's fn returned")
		if name, ok := idem.StepFrom(leaked); ok {
			t.Errorf("StepFrom outside a step = %q, true", name)
		}
		if n := ran.Load(); n != 0 {
			t.Fatalf("a refused step ran its fn %d times", n)
		}
	})
}

// Steps of one attempt may run at once under different names; the same
// name at once is refused for all but one.
func TestStepsConcurrent(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t)
		ctx := context.Background()
		var runs stepRuns
		got, err := idem.Do(ctx, c, "k", "", func(ctx context.Context) (int, error) {
			var wg sync.WaitGroup
			var ok, dup atomic.Int64
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					name := fmt.Sprint("step-", i%8)
					_, err := idem.Step(ctx, name, func(ctx context.Context) (int, error) {
						runs.add(ctx, name)
						return i, nil
					})
					switch {
					case err == nil:
						ok.Add(1)
					case strings.Contains(err.Error(), "twice"):
						dup.Add(1)
					default:
						t.Errorf("step %s: %v", name, err)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 8 || dup.Load() != 8 {
				return 0, fmt.Errorf("%d steps ran, %d were refused; want 8 and 8", ok.Load(), dup.Load())
			}
			return 8, nil
		})
		if err != nil || got != 8 {
			t.Fatalf("got %d, %v", got, err)
		}
		for i := range 8 {
			if n := runs.count("k", fmt.Sprint("step-", i)); n != 1 {
				t.Errorf("step-%d ran %d times", i, n)
			}
		}
	})
}

// stepKeyOf derives a step key as StepKey's documentation says, written
// here independently of the package.
func stepKeyOf(prefix, key, name string) string {
	b := []byte("idem.step\x00")
	b = append(binary.AppendUvarint(b, uint64(len(prefix))), prefix...)
	b = append(binary.AppendUvarint(b, uint64(len(key))), key...)
	sum := sha256.Sum256(append(b, name...))
	return "idem-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// StepKey is the documented derivation: the same in every attempt and
// every Client of one prefix, different for other names, keys and
// prefixes, and "" outside Do.
func TestStepKey(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	if got := idem.StepKey(ctx, "charge"); got != "" {
		t.Fatalf("outside Do: %q, want \"\"", got)
	}
	keyOf := func(c *idem.Client, key, name string, fail bool) string {
		var got string
		_, err := idem.Do(ctx, c, key, "", func(ctx context.Context) (int, error) {
			got = idem.StepKey(ctx, name)
			if empty := idem.StepKey(ctx, ""); empty != "" {
				t.Errorf("empty name: %q, want \"\"", empty)
			}
			if fail {
				return 0, errors.New("transient")
			}
			return 0, nil
		})
		if (err != nil) != fail {
			t.Fatal(err)
		}
		return got
	}
	c := b.Idem(t)
	first := keyOf(c, "order {1}", "charge", true)
	if !regexp.MustCompile(`^idem-[a-z2-7]{32}$`).MatchString(first) {
		t.Fatalf("StepKey %q is not idem- and 32 base32 characters", first)
	}
	if want := stepKeyOf("idem", "order {1}", "charge"); first != want {
		t.Fatalf("StepKey %q, want %q by the documented derivation", first, want)
	}
	if again := keyOf(b.Idem(t), "order {1}", "charge", false); again != first {
		t.Fatalf("attempt 2 in another Client: %q, want %q", again, first)
	}
	seen := map[string]string{first: "first"}
	for what, k := range map[string]string{
		"another name":   keyOf(c, "order {1}", "refund", false),
		"another key":    keyOf(c, "order {2}", "charge", false),
		"another prefix": keyOf(b.Idem(t, idem.WithPrefix("other")), "order {1}", "charge", false),
		// Length framing: ("ab", "c") and ("a", "bc") differ.
		"framing a": keyOf(b.Idem(t, idem.WithPrefix("ab")), "c", "x", false),
		"framing b": keyOf(b.Idem(t, idem.WithPrefix("a")), "bc", "x", false),
	} {
		if other, dup := seen[k]; dup {
			t.Errorf("%s has the key of %s: %q", what, other, k)
		}
		seen[k] = what
	}
}

// StepFrom names the step that a context belongs to, and nothing outside
// one (nor inside a Do call nested in a step).
func TestStepFrom(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t)
	ctx := context.Background()
	_, err := idem.Do(ctx, c, "k", "", func(ctx context.Context) (string, error) {
		if name, ok := idem.StepFrom(ctx); ok {
			return "", fmt.Errorf("outside a step: %q", name)
		}
		return idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			if name, ok := idem.StepFrom(ctx); !ok || name != "charge" {
				return "", fmt.Errorf("in step charge: %q, %v", name, ok)
			}
			return idem.Do(ctx, c, "inner", "", func(ctx context.Context) (string, error) {
				if name, ok := idem.StepFrom(ctx); ok {
					return "", fmt.Errorf("in a Do nested in a step: %q", name)
				}
				// A step of the inner Do is not nested in the outer one.
				return idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return "ok", nil })
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Forget removes the steps' checkpoints with the record: the next Do runs
// every step again.
func TestForgetRemovesSteps(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		t.Run("plain", func(t *testing.T) { testForgetRemovesSteps(t, b, b.Idem(t)) })
		t.Run("tombstones", func(t *testing.T) { testForgetRemovesSteps(t, b, b.Idem(t, idem.WithTombstones(time.Hour))) })
	})
}

func testForgetRemovesSteps(t *testing.T, b *idemtest.Backend, c *idem.Client) {
	ctx := context.Background()
	var runs stepRuns
	var fail atomic.Bool
	fail.Store(true)
	if _, err := idem.Do(ctx, c, "k", "", debitSteps(&runs, &fail)); err == nil {
		t.Fatal("attempt 1 succeeded")
	}
	stepsKey := idem.RecordKey(c, "k") + ":steps"
	if n := b.Client(t).Exists(ctx, stepsKey).Val(); n != 1 {
		t.Fatalf("no checkpoints at %s", stepsKey)
	}
	if err := c.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := b.Client(t).Exists(ctx, stepsKey).Val(); n != 0 {
		t.Fatalf("Forget left the checkpoints")
	}
	fail.Store(false)
	if _, err := idem.Do(ctx, c, "k", "", debitSteps(&runs, &fail)); err != nil {
		t.Fatal(err)
	}
	if n := runs.count("k", "reserve"); n != 2 {
		t.Fatalf("step reserve ran %d times after Forget, want 2", n)
	}
	if err := c.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
}

// The checkpoints never outlive the record: their TTL is set to the
// record's at every checkpoint, and completion leaves them to expire.
func TestStepCheckpointsExpireWithRecord(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		c := b.Idem(t, idem.WithRetention(time.Hour), idem.WithLease(10*time.Second))
		ctx := context.Background()
		rdb := b.Client(t)
		record := idem.RecordKey(c, "k")
		_, err := idem.Do(ctx, c, "k", "", func(ctx context.Context) (int, error) {
			b.Advance(t, time.Second) // the record's TTL has come down
			_, err := idem.Step(ctx, "one", func(ctx context.Context) (int, error) { return 1, nil })
			if err != nil {
				return 0, err
			}
			rt, st := rdb.PTTL(ctx, record).Val(), rdb.PTTL(ctx, record+":steps").Val()
			if st <= 0 || st > rt || rt-st > time.Second {
				return 0, fmt.Errorf("after a checkpoint: record TTL %v, checkpoints' %v", rt, st)
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rt, st := rdb.PTTL(ctx, record).Val(), rdb.PTTL(ctx, record+":steps").Val()
		if st <= 0 || st > rt {
			t.Fatalf("after completion: record TTL %v, checkpoints' %v", rt, st)
		}
	})
}

// The contract of lua/step.lua, run by hand: only the owner of a record in
// progress reads or writes; a checkpoint is never replaced; a write over
// the limit is refused; the hash's TTL is the record's.
func TestStepScript(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
		src := idem.ScriptSource("step")
		keys := []string{"t:{k}", "t:{k}:steps"}
		run := func(args ...any) any {
			t.Helper()
			v, err := rdb.Eval(ctx, src, keys, args...).Result()
			if err != nil {
				t.Fatalf("step.lua %q: %v", args, err)
			}
			return v
		}
		want := func(what string, got, want any) {
			t.Helper()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s: got %v, want %v", what, got, want)
			}
		}
		want("no record: write", run("tok", "a", "d1", 0), 0)
		want("no record: read", run("tok", "a", "", 0), 0)
		rdb.Set(ctx, keys[0], idemtest.InProgress("tok", 2, time.Hour, time.Minute), time.Hour)
		want("another token", run("other", "a", "d1", 0), 0)
		want("read, none yet", run("tok", "a", "", 0), "")
		if n := rdb.Exists(ctx, keys[1]).Val(); n != 0 {
			t.Fatal("a read made the hash")
		}
		want("write", run("tok", "a", "d1", 0), 1)
		want("the same again", run("tok", "a", "d1", 0), 1)
		want("another checkpoint", run("tok", "a", "d2", 0), 3)
		want("read", run("tok", "a", "", 0), "d1")
		want("the size", rdb.HGet(ctx, keys[1], "").Val(), 3)
		want("over the limit", run("tok", "b", "d12345", 9), 2)
		want("at the limit", run("tok", "b", "d1234", 9), 1)
		if rt, st := rdb.PTTL(ctx, keys[0]).Val(), rdb.PTTL(ctx, keys[1]).Val(); st <= 0 || st > rt {
			t.Fatalf("record TTL %v, checkpoints' %v", rt, st)
		}
		if _, err := rdb.Eval(ctx, src, keys, "tok", "", "d1", 0).Result(); err == nil {
			t.Fatal("an empty name was accepted")
		}
		// A released or finished record is no longer the caller's.
		rdb.Set(ctx, keys[0], "1r"+idemtest.InProgress("tok", 2, time.Hour, time.Minute)[2:], time.Hour)
		want("released", run("tok", "c", "d1", 0), 0)
		rdb.Set(ctx, keys[0], "garbage", time.Hour)
		want("not a record", run("tok", "c", "d1", 0), 0)
		if n := rdb.HLen(ctx, keys[1]).Val(); n != 3 {
			t.Fatalf("the hash has %d fields, want 3 (a, b and the size)", n)
		}
	})
}
