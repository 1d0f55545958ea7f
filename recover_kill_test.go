//go:build linux

package idem_test

// Recovery after SIGKILL: a caller process dies inside a three-step
// registered operation and never comes back; Recover, in the test process
// or in recovering processes that are killed in turn, finishes it. The
// processes are this test binary run again as children
// (TestChildRecoverProcess). The middle step charges through
// stepsProvider (step_kill_test.go). Linux only.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	// recoverChildEnv, set to a Redis address, makes
	// TestChildRecoverProcess run; _PROVIDER names the provider, _MODE
	// what to do: "caller N" (start N operations, hang after their first
	// step) or "recoverer" (Recover until killed).
	recoverChildEnv = "IDEM_TEST_RECOVER_CHILD"
	recoverChildTag = "idem-recover-child:"
	recoverLease    = 3 * time.Second // long enough that a loaded machine's recovery keeps it
	recoverAfter    = 200 * time.Millisecond
)

type orderIn struct {
	Order string
	Cents int64
}

// recoverClient is the Client of every process of these tests.
func recoverClient(rdb redis.UniversalClient, opts ...idem.Option) *idem.Client {
	return idem.New(rdb, append([]idem.Option{idem.WithPrefix("rec"), idem.WithLease(recoverLease),
		idem.WithRecoverAfter(recoverAfter), idem.WithLogger(nil)}, opts...)...)
}

// registerCharge3 registers the three-step operation "charge3" on c:
// reserve (INCR in Redis), charge (POST to the provider with the step's
// key, after pause), notify (INCR). after, if not nil, runs after each
// step with its name; started counts fn's runs.
func registerCharge3(c *idem.Client, rdb *redis.Client, provider string, pause time.Duration, started *atomic.Int32, after func(key, step string)) *idem.Op[orderIn, string] {
	hc := &http.Client{Timeout: 10 * time.Second}
	if after == nil {
		after = func(string, string) {}
	}
	return idem.Register(c, "charge3", func(ctx context.Context, in orderIn) (string, error) {
		started.Add(1)
		key := in.Order
		// Two owners at once would overlap here: a run marks the key for
		// half a lease (less than any lease it holds), and counts a mark
		// it finds.
		if ok, err := rdb.SetNX(ctx, "effects:running:"+key, 1, recoverLease/2).Result(); err == nil && !ok {
			rdb.Incr(ctx, "effects:overlap:"+key)
		}
		defer rdb.Del(context.WithoutCancel(ctx), "effects:running:"+key)
		reserved, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
			a, _ := idem.AttemptFrom(ctx)
			return fmt.Sprint("res#", a.Number), rdb.Incr(ctx, "effects:reserve:"+key).Err()
		})
		if err != nil {
			return "", err
		}
		after(key, "reserve")
		charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			time.Sleep(pause)
			return postCharge(ctx, hc, provider, key)
		})
		if err != nil {
			return "", err
		}
		after(key, "charge")
		if _, err := idem.Step(ctx, "notify", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, rdb.Incr(ctx, "effects:notify:"+key).Err()
		}); err != nil {
			return "", err
		}
		return reserved + "/" + charge, nil
	})
}

// TestChildRecoverProcess is the process of the tests below (see
// recoverChildEnv).
func TestChildRecoverProcess(t *testing.T) {
	t.Parallel()
	addr := os.Getenv(recoverChildEnv)
	if addr == "" {
		t.Skip("the process of TestRecoverAfterCallerKilled and TestRecoverersKilled; runs only as their child")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c := recoverClient(rdb)
	mode, arg, _ := strings.Cut(os.Getenv(recoverChildEnv+"_MODE"), " ")
	var started atomic.Int32
	switch mode {
	case "caller":
		n, _ := strconv.Atoi(arg)
		hang := make(chan struct{})
		op := registerCharge3(c, rdb, os.Getenv(recoverChildEnv+"_PROVIDER"), 0, &started, func(key, step string) {
			if step == "reserve" {
				fmt.Printf("%s reserved %s\n", recoverChildTag, key)
				<-hang // until SIGKILL
			}
		})
		for i := range n {
			key := fmt.Sprint("order-", i)
			go func() { _, _ = op.Do(context.Background(), key, orderIn{Order: key, Cents: 500}) }()
		}
		select {}
	case "recoverer":
		registerCharge3(c, rdb, os.Getenv(recoverChildEnv+"_PROVIDER"), 100*time.Millisecond, &started, nil)
		fmt.Printf("%s recovering\n", recoverChildTag)
		_ = c.Recover(context.Background()) // until SIGKILL
	}
	t.Fatalf("unknown mode %q", mode)
}

// abandon runs a caller child that starts n operations and is killed with
// SIGKILL after their first step.
func abandon(t *testing.T, srv *redistest.Server, provider string, n int) time.Time {
	t.Helper()
	child := idemtest.StartChild(t, "TestChildRecoverProcess", recoverChildTag,
		recoverChildEnv+"="+srv.Addr(), recoverChildEnv+"_PROVIDER="+provider, recoverChildEnv+"_MODE=caller "+strconv.Itoa(n))
	for range n {
		child.Expect(t, "reserved")
	}
	child.Kill()
	ws, _ := child.State().Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the caller child: %v", child.State())
	}
	return time.Now()
}

func newProvider(t *testing.T) (*stepsProvider, string) {
	p := &stepsProvider{byKey: map[string]string{}, requests: map[string]int{}, opKeys: map[string]map[string]int{}, charges: map[string]int{}}
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	return p, ps.URL
}

// checkCharged checks that operation key ran each step's effect once
// (notify may run twice when a recoverer died between its effect and
// its checkpoint) and that the provider charged it once, under one key.
func checkCharged(t *testing.T, rdb *redis.Client, p *stepsProvider, key string, notifyMax int) {
	t.Helper()
	ctx := context.Background()
	if n, err := rdb.Get(ctx, "effects:reserve:"+key).Int(); n != 1 {
		t.Errorf("%s: step reserve ran %d times (%v), want 1", key, n, err)
	}
	if n, err := rdb.Get(ctx, "effects:notify:"+key).Int(); n < 1 || n > notifyMax {
		t.Errorf("%s: step notify ran %d times (%v), want 1 to %d", key, n, err, notifyMax)
	}
	if n, _ := rdb.Get(ctx, "effects:overlap:"+key).Int(); n != 0 {
		t.Errorf("%s: two owners ran fn at once %d times", key, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.charges[key]; n != 1 {
		t.Errorf("%s: the provider charged %d times, want 1", key, n)
	}
	if len(p.opKeys[key]) != 1 {
		t.Errorf("%s: the provider saw keys %v, want one", key, p.opKeys[key])
	}
}

// A caller killed with SIGKILL after step 1 of three never comes back; a
// Recover loop in this process finishes its operation after the lease and
// WithRecoverAfter: step 1 does not run again, the provider charges once
// under the step's key, and Result and a later Do return the outcome
// without running fn.
func TestRecoverAfterCallerKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	p, url := newProvider(t)
	rdb := srv.Client(t)
	c := recoverClient(rdb, idem.WithObserver(&kindCount{}))
	t.Cleanup(func() { _ = c.Close() })
	var started atomic.Int32
	op := registerCharge3(c, rdb, url, 0, &started, nil)
	died := abandon(t, srv, url, 1)
	recoverFor(t, c)
	waitState(t, c, "order-0", idem.StateDone)
	took := time.Since(died)
	t.Logf("finished %v after the caller died (lease %v + WithRecoverAfter %v + a sweep)", took.Round(time.Millisecond), recoverLease, recoverAfter)
	if max := recoverLease + recoverAfter + 10*time.Second; took > max {
		t.Errorf("finished %v after the caller died, want within %v", took, max)
	}
	checkCharged(t, rdb, p, "order-0", 1)
	ctx := context.Background()
	res, st, err := op.Result(ctx, "order-0")
	if err != nil || st.State != idem.StateDone || !strings.HasPrefix(res, "res#1/ch_order-0_1") {
		t.Fatalf("Result: %q, %v, %v", res, st.State, err)
	}
	if st.Attempt != 2 {
		t.Errorf("finished by attempt %d, want 2", st.Attempt)
	}
	again, err := op.Do(ctx, "order-0", orderIn{Order: "order-0", Cents: 500})
	if err != nil || again != res {
		t.Fatalf("a later Do: %q, %v; want %q", again, err, res)
	}
	if n := started.Load(); n != 1 {
		t.Errorf("fn ran %d times in this process, want 1 (the recovery)", n)
	}
}

// Two recovering processes, each killed with SIGKILL and restarted a few
// times while they recover operations abandoned by a killed caller: every
// operation is finished once, with one charge, and every later Do agrees.
func TestRecoverersKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	p, url := newProvider(t)
	rdb := srv.Client(t)
	c := recoverClient(rdb)
	t.Cleanup(func() { _ = c.Close() })
	var started atomic.Int32
	op := registerCharge3(c, rdb, url, 0, &started, nil)
	const n = 6
	abandon(t, srv, url, n)
	start := func() *idemtest.Child {
		ch := idemtest.StartChild(t, "TestChildRecoverProcess", recoverChildTag,
			recoverChildEnv+"="+srv.Addr(), recoverChildEnv+"_PROVIDER="+url, recoverChildEnv+"_MODE=recoverer")
		ch.Expect(t, "recovering")
		return ch
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 34))
	procs := [2]*idemtest.Child{start(), start()}
	for range 6 {
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		i := rng.IntN(2)
		procs[i].Kill()
		procs[i] = start()
	}
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprint("order-", i)
		waitState(t, c, key, idem.StateDone)
		checkCharged(t, rdb, p, key, 2)
		res, _, err := op.Result(ctx, key)
		if err != nil || !strings.Contains(res, "/ch_"+key+"_1") {
			t.Errorf("%s: Result %q, %v", key, res, err)
		}
		if again, err := op.Do(ctx, key, orderIn{Order: key, Cents: 500}); err != nil || again != res {
			t.Errorf("%s: a later Do: %q, %v; want %q", key, again, err, res)
		}
	}
	if n := started.Load(); n != 0 {
		t.Errorf("fn ran %d times in this process, want 0", n)
	}
}
