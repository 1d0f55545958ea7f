package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recoverFor runs c.Recover in the background until the test ends, and
// checks that it returns its context's error.
func recoverFor(t *testing.T, c *idem.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Recover(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Recover returned %v, want context.Canceled", err)
		}
	})
}

// waitState waits, at most 20 s, until key's state is want.
func waitState(t *testing.T, c *idem.Client, key string, want idem.State) idem.Status {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Status(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q: state %v after 20 s, want %v", key, st.State, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kindCount collects the kindCount of the events a Client reports.
type kindCount struct {
	mu sync.Mutex
	n  map[idem.EventKind]int
}

func (k *kindCount) Observe(_ context.Context, e idem.Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.n == nil {
		k.n = map[idem.EventKind]int{}
	}
	k.n[e.Kind]++
}

func (k *kindCount) count(kind idem.EventKind) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[kind]
}

// An operation whose fn fails transiently every time is recovered
// WithMaxRecoveries times, then parked: Do returns ErrParked without
// running fn, Status says parked, Recover leaves it; Retry un-parks it and
// the next sweep finishes it once fn succeeds.
func TestRecoverParksAfterMaxRecoveries(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ev := &kindCount{}
	c := b.Idem(t, idem.WithLease(2*time.Second), idem.WithRecoverAfter(50*time.Millisecond),
		idem.WithMaxRecoveries(3), idem.WithLogger(nil), idem.WithObserver(ev))
	ctx := context.Background()
	var ran, fixed atomic.Int32
	op := idem.Register(c, "flaky", func(ctx context.Context, in string) (string, error) {
		ran.Add(1)
		if fixed.Load() == 0 {
			return "", errors.New("transient")
		}
		return "ok:" + in, nil
	})
	if _, err := op.Do(ctx, "k", "x"); err == nil {
		t.Fatal("want the transient error")
	}
	recoverFor(t, c)
	st := waitState(t, c, "k", idem.StateParked)
	if st.Step != "" {
		t.Fatalf("parked at step %q, want none", st.Step)
	}
	time.Sleep(300 * time.Millisecond) // six sweeps: a parked operation is left alone
	if got := ran.Load(); got != 4 {
		t.Fatalf("fn ran %d times, want 4: the caller's and 3 recoveries", got)
	}
	if got := ev.count(idem.EventParked); got != 1 {
		t.Fatalf("%d EventParked, want 1", got)
	}
	if _, err := op.Do(ctx, "k", "x"); !errors.Is(err, idem.ErrParked) || errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("Do of a parked operation: %v", err)
	}
	if got := ran.Load(); got != 4 {
		t.Fatalf("Do of a parked operation ran fn (%d runs)", got)
	}
	if err := c.Retry(ctx, "nope"); err == nil || !strings.Contains(err.Error(), "no such record") {
		t.Fatalf("Retry of an unknown key: %v", err)
	}
	fixed.Store(1)
	if err := c.Retry(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "k", idem.StateDone)
	if got, err := op.Do(ctx, "k", "x"); err != nil || got != "ok:x" {
		t.Fatalf("Do after the recovery: %q, %v", got, err)
	}
	if got := ran.Load(); got != 5 {
		t.Fatalf("fn ran %d times, want 5", got)
	}
	if got := ev.count(idem.EventRecovered); got != 1 {
		t.Fatalf("%d EventRecovered, want 1", got)
	}
	if err := c.Retry(ctx, "k"); err == nil || !strings.Contains(err.Error(), "finished") {
		t.Fatalf("Retry of a finished key: %v", err)
	}
	if n := b.Client(t).Exists(ctx, idem.PendingKey(c, "k")).Val(); n != 0 {
		t.Fatalf("the index bucket outlives its only operation: %d", n)
	}
}

// Retry refuses an operation that is unfinished but not parked.
func TestRetryNotParked(t *testing.T) {
	t.Parallel()
	c := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	op := idem.Register(c, "fail", func(ctx context.Context, in int) (int, error) { return 0, errors.New("transient") })
	if _, err := op.Do(context.Background(), "k", 1); err == nil {
		t.Fatal("want the transient error")
	}
	if err := c.Retry(context.Background(), "k"); err == nil || !strings.Contains(err.Error(), "not parked") {
		t.Fatalf("Retry of a released key: %v", err)
	}
}

// A Recover loop runs only the operations registered on its Client: one
// registered elsewhere stays unfinished, and indexed (listed); a plain Do
// with the same kind of key is never indexed.
func TestRecoverLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	opts := []idem.Option{idem.WithRecoverAfter(20 * time.Millisecond), idem.WithLogger(nil)}
	elsewhere := b.Idem(t, opts...)
	var ranThere atomic.Int32
	there := idem.Register(elsewhere, "there", func(ctx context.Context, in int) (int, error) {
		ranThere.Add(1)
		return 0, errors.New("transient")
	})
	c := b.Idem(t, opts...)
	var ranHere atomic.Int32
	here := idem.Register(c, "here", func(ctx context.Context, in int) (int, error) {
		if ranHere.Add(1) == 1 {
			return 0, errors.New("transient")
		}
		return in, nil
	})
	if _, err := there.Do(ctx, "order-1", 1); err == nil {
		t.Fatal("want the transient error")
	}
	if _, err := here.Do(ctx, "order-2", 2); err == nil {
		t.Fatal("want the transient error")
	}
	if _, err := c.Do(ctx, "order-3", "fp", func(context.Context) ([]byte, error) { return nil, errors.New("transient") }); err == nil {
		t.Fatal("want the transient error")
	}
	rdb := b.Client(t)
	if err := rdb.ZScore(ctx, idem.PendingKey(c, "order-3"), "order-3").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a plain Do is indexed: %v", err)
	}
	recoverFor(t, c)
	waitState(t, c, "order-2", idem.StateDone)
	time.Sleep(200 * time.Millisecond) // ten more sweeps
	if st, _ := c.Status(ctx, "order-1"); st.State != idem.StateReleased || ranThere.Load() != 1 {
		t.Fatalf("the operation registered elsewhere: %v, ran %d", st.State, ranThere.Load())
	}
	if err := rdb.ZScore(ctx, idem.PendingKey(c, "order-1"), "order-1").Err(); err != nil {
		t.Fatalf("the operation registered elsewhere is not listed: %v", err)
	}
	if st, _ := c.Status(ctx, "order-3"); st.State != idem.StateReleased {
		t.Fatalf("the plain Do: %v", st.State)
	}
	for _, k := range idem.PendingBuckets(c) {
		for _, m := range rdb.ZRange(ctx, k, 0, -1).Val() {
			if m != "order-1" {
				t.Errorf("bucket %s holds %q", k, m)
			}
		}
	}
	if err := elsewhere.Forget(ctx, "order-1"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, idem.PendingKey(c, "order-1")).Val(); n != 0 {
		t.Fatal("Forget left the index entry")
	}
}

// On Redis Cluster, the index lives in each record's slot and Recover
// sweeps every master: operations on all three are recovered.
func TestRecoverCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	rdb := cl.Client(t)
	c := idem.New(rdb, idem.WithRecoverAfter(50*time.Millisecond), idem.WithLogger(nil))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	op := idem.Register(c, "op", func(ctx context.Context, in string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[in]++
		if runs[in] == 1 {
			return "", errors.New("transient")
		}
		return in, nil
	})
	masters := map[string]bool{}
	const n = 30
	for i := range n {
		key := fmt.Sprint("order-", i)
		if _, err := op.Do(ctx, key, key); err == nil {
			t.Fatal("want the transient error")
		}
		m, err := rdb.MasterForKey(ctx, idem.RecordKey(c, key))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.String()] = true
		if bk, rk := idem.PendingKey(c, key), idem.RecordKey(c, key); rdb.ClusterKeySlot(ctx, bk).Val() != rdb.ClusterKeySlot(ctx, rk).Val() {
			t.Fatalf("bucket %s is not in the slot of %s", bk, rk)
		}
	}
	if len(masters) != 3 {
		t.Fatalf("the keys reach %d masters, want 3", len(masters))
	}
	recoverFor(t, c)
	for i := range n {
		key := fmt.Sprint("order-", i)
		waitState(t, c, key, idem.StateDone)
		if got, err := op.Do(ctx, key, key); err != nil || got != key {
			t.Fatalf("%s: %q, %v", key, got, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, r := range runs {
		if r != 2 {
			t.Errorf("%s ran %d times, want 2", k, r)
		}
	}
}

// The index costs at most 64 bytes per unfinished operation (INFO memory's
// used_memory, with and without its buckets), and nothing once they are
// finished: no entry, no bucket left.
func TestRecoverIndexMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	b := idemtest.OnServer(srv)
	c := b.Idem(t, idem.WithLogger(nil))
	rdb := b.Client(t)
	ctx := context.Background()
	var fail atomic.Bool
	fail.Store(true)
	op := idem.Register(c, "op", func(ctx context.Context, in int) (int, error) {
		if fail.Load() {
			return 0, errors.New("transient")
		}
		return in, nil
	})
	const n = 10000
	each := func(prefix string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 1)
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 16 {
					_, err := op.Do(ctx, fmt.Sprintf("%s%05d", prefix, i), i)
					if (err == nil) == fail.Load() {
						select {
						case errs <- fmt.Errorf("%s%05d: %v", prefix, i, err):
						default:
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	used := func() int64 {
		t.Helper()
		v, err := rdb.InfoMap(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		var u int64
		fmt.Sscan(v["Memory"]["used_memory"], &u)
		return u
	}
	entries := func() int64 {
		var sum int64
		pipe := rdb.Pipeline()
		var cmds []*redis.IntCmd
		for _, k := range idem.PendingBuckets(c) {
			cmds = append(cmds, pipe.ZCard(ctx, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			sum += cmd.Val()
		}
		return sum
	}
	each("order-a-")
	if got := entries(); got != n {
		t.Fatalf("%d index entries, want %d", got, n)
	}
	with := used()
	if err := rdb.Del(ctx, idem.PendingBuckets(c)...).Err(); err != nil {
		t.Fatal(err)
	}
	without := used()
	per := float64(with-without) / n
	t.Logf("index: %.1f bytes per unfinished operation (used_memory %d with, %d without, keys of 14 bytes)", per, with, without)
	if per > 64 {
		t.Errorf("index: %.1f bytes per unfinished operation, want at most 64", per)
	}
	each("order-b-")
	fail.Store(false)
	each("order-b-")
	if got := entries(); got != 0 {
		t.Fatalf("%d index entries left after the operations finished", got)
	}
	if got := rdb.Exists(ctx, idem.PendingBuckets(c)...).Val(); got != 0 {
		t.Fatalf("%d buckets left after the operations finished", got)
	}
}

// A recovery is the fenced takeover of a caller: a Recover loop that finds
// an operation due while another owner's lease is live does not run it,
// and moves its index entry to that lease's end.
func TestRecoverLiveOwnerRefused(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	ctx := context.Background()
	// A lease of a minute: c1 renews it (which moves the entry too) only
	// after 20 s, so an entry moved sooner was moved by c2's refused claim.
	opts := []idem.Option{idem.WithRecoverAfter(50 * time.Millisecond), idem.WithLease(time.Minute), idem.WithLogger(nil)}
	release := make(chan struct{})
	var ran1, ran2 atomic.Int32
	c1 := b.Idem(t, opts...)
	op := idem.Register(c1, "slow", func(ctx context.Context, in int) (int, error) {
		if ran1.Add(1) == 1 {
			return 0, errors.New("transient")
		}
		<-release
		return in, nil
	})
	c2 := b.Idem(t, opts...)
	idem.Register(c2, "slow", func(ctx context.Context, in int) (int, error) {
		ran2.Add(1)
		return in, nil
	})
	if _, err := op.Do(ctx, "k", 7); err == nil {
		t.Fatal("want the transient error")
	}
	recoverFor(t, c1)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the Recover loop's end, which waits for fn
	deadline := time.Now().Add(20 * time.Second)
	for ran1.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no recovery within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rdb := b.Client(t)
	bucket := idem.PendingKey(c1, "k")
	if err := rdb.ZAdd(ctx, bucket, redis.Z{Score: 0, Member: "k"}).Err(); err != nil { // due at once
		t.Fatal(err)
	}
	recoverFor(t, c2)
	// c2's sweep finds the entry due, its claim is refused, and the entry
	// moves to the live lease's end: wait for that.
	deadline = time.Now().Add(15 * time.Second)
	for {
		if n := ran2.Load(); n != 0 {
			t.Fatalf("a second Recover ran fn under a live owner (%d runs)", n)
		}
		if rdb.ZScore(ctx, bucket, "k").Val() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the entry of a live owner's operation stays due after 15 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a few more sweeps
	if n := ran2.Load(); n != 0 {
		t.Fatalf("a second Recover ran fn under a live owner (%d runs)", n)
	}
	unblock()
	waitState(t, c1, "k", idem.StateDone)
}

// Pending lists unfinished registered operations by name, parked ones
// too, and no finished one.
func TestPendingLists(t *testing.T) {
	t.Parallel()
	c := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	ctx := context.Background()
	op := idem.Register(c, "fail", func(ctx context.Context, in int) (int, error) {
		if in == 0 {
			return 0, nil
		}
		return 0, errors.New("transient")
	})
	for i := range 3 {
		_, _ = op.Do(ctx, fmt.Sprint("k", i), i)
	}
	list, err := c.Pending(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]idem.Pending{}
	for _, p := range list {
		got[p.Key] = p
	}
	if len(got) != 2 || got["k1"].Name != "fail" || got["k2"].Name != "fail" || got["k1"].Parked || got["k1"].Due.IsZero() {
		t.Fatalf("Pending: %+v", list)
	}
}
