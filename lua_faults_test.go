package idem_test

// Faults of the server itself, on a real redis-server: kill -9 and restart,
// the script cache flushed (rows 21 and 22 of docs/faults.md).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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

// Row 21: Redis is killed (-9) and restarted on its data directory.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	// With the append-only file (appendfsync always), under load from two
	// Clients, half of it on new keys: every result a Do returned survives
	// and replays, and no key's fn starts after a Do returned its result.
	t.Run("under load", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{AppendOnly: true})
		const workers = 6
		opts := []idem.Option{idem.WithLease(300 * time.Millisecond), idem.WithStoreTimeout(3 * time.Second),
			idem.WithWait(2 * time.Second), idem.WithPollInterval(50 * time.Millisecond)}
		clients := []*idem.Client{b.Idem(t, opts...), b.Idem(t, opts...)}
		var (
			seq     atomic.Int64 // orders fn starts and Do returns
			newKeys atomic.Int64
			mu      sync.Mutex
			runs    = map[string][][2]int64{} // key -> {seq, attempt} of each fn start
			firstOK = map[string]int64{}      // key -> seq of the first Do that returned a result
			results = map[string]string{}     // key -> that result
			errs    = map[string]int{}        // kind of error -> how many
			oks     int
			kills   []time.Time
			across  int // calls in flight across a kill
		)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for {
					select {
					case <-stop:
						return
					default:
					}
					var key string
					if n := newKeys.Load(); n == 0 || rng.IntN(2) == 0 {
						key = fmt.Sprint("k", newKeys.Add(1))
					} else {
						key = fmt.Sprint("k", 1+rng.Int64N(n))
					}
					start := time.Now()
					res, err := clients[w%2].Do(context.Background(), key, "fp", func(ctx context.Context) ([]byte, error) {
						a, _ := idem.AttemptFrom(ctx)
						mu.Lock()
						runs[key] = append(runs[key], [2]int64{seq.Add(1), a.Number})
						mu.Unlock()
						time.Sleep(time.Duration(1000+rng.IntN(9000)) * time.Microsecond)
						return []byte(fmt.Sprintf("%s#%d", key, a.Number)), nil
					})
					mu.Lock()
					for _, k := range kills {
						if start.Before(k) {
							across++
						}
					}
					switch {
					case err == nil:
						oks++
						if prev, ok := results[key]; ok && prev != string(res) {
							t.Errorf("key %s: Do returned %q and %q", key, prev, res)
						}
						if _, ok := firstOK[key]; !ok {
							firstOK[key], results[key] = seq.Add(1), string(res)
						}
					case errors.Is(err, idem.ErrNotRecorded):
						errs["not recorded"]++
					case errors.Is(err, idem.ErrLeaseLost):
						errs["lease lost"]++
					case errors.Is(err, idem.ErrInProgress):
						errs["in progress"]++
					case strings.Contains(err.Error(), "claim"):
						errs["claim failed"]++
					default:
						errs[err.Error()]++
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
		for range 2 {
			time.Sleep(250 * time.Millisecond)
			mu.Lock()
			kills = append(kills, time.Now())
			mu.Unlock()
			b.Srv.Kill()
			time.Sleep(300 * time.Millisecond)
			b.Srv.Restart(t)
		}
		time.Sleep(300 * time.Millisecond)
		// On a loaded machine (-race, parallel tests) the load is slower:
		// it goes on until it has done the 50 keys checked below.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			mu.Lock()
			n := len(results)
			mu.Unlock()
			if n >= 50 {
				break
			}
		}
		close(stop)
		wg.Wait()
		t.Logf("%d keys; %d calls returned a result, %d were in flight across a kill; errors: %v",
			newKeys.Load(), oks, across, errs)
		if across == 0 || len(results) < 50 {
			t.Fatalf("%d keys done, %d calls across a kill: the load did not straddle the restarts", len(results), across)
		}
		replayer := b.Idem(t)
		for key, want := range results {
			var attempts []int64
			for _, r := range runs[key] {
				if r[0] > firstOK[key] {
					t.Errorf("key %s: fn started (attempt %d) after a Do had returned %q", key, r[1], want)
				}
				if len(attempts) > 0 && r[1] <= attempts[len(attempts)-1] {
					t.Errorf("key %s: attempt %d ran after attempt %d", key, r[1], attempts[len(attempts)-1])
				}
				attempts = append(attempts, r[1])
			}
			res, err := replayer.Do(context.Background(), key, "fp", func(context.Context) ([]byte, error) {
				return nil, errors.New("fn ran on replay")
			})
			if err != nil || string(res) != want {
				t.Errorf("key %s after the restarts: got %q, %v; want %q", key, res, err, want)
			}
		}
	})

	// Without persistence, a restart loses an in-progress record. The
	// stale owner's completion must not succeed: neither over the result
	// of a newer owner, nor on its own as a record without a claim.
	t.Run("in-progress record lost", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{})
		owner := b.Idem(t)
		ctx := context.Background()
		var l idemtest.Runs

		finish, done := startOwner(t, owner, "taken", &l)
		b.Srv.Restart(t)
		res, err := b.Idem(t).Do(ctx, "taken", "fp", l.Fn("new"))
		if err != nil || string(res) != "new#1" {
			t.Fatalf("new owner: got %q, %v; want new#1 (the record was lost)", res, err)
		}
		finish("stale", nil)
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale owner: got %v, want ErrLeaseLost", err)
		}
		idemtest.Replay(t, b, "taken", "new#1", &l)
		l.Want(t, "taken", "[1 1]") // two runs: the row's exception

		finish, done = startOwner(t, owner, "alone", &l)
		b.Srv.Restart(t)
		finish("stale", nil)
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("stale owner alone: got %v, want ErrLeaseLost", err)
		}
		if n := b.Do(t, "EXISTS", idem.RecordKey(owner, "alone")); n != int64(0) {
			t.Fatalf("the stale completion wrote a record: %v", b.Do(t, "GET", idem.RecordKey(owner, "alone")))
		}
	})
}

// Row 22: the script cache is flushed (SCRIPT FLUSH, or a restart) between
// calls and between a claim and its completion: EVALSHA answers NOSCRIPT
// and the scripts are sent whole, also in the pipeline of WithReplicas.
func TestScriptCacheFlushed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// calls returns how many times the server ran cmd.
	calls := func(t *testing.T, b *idemtest.Backend, cmd string) int64 {
		t.Helper()
		info := b.Do(t, "INFO", "commandstats").(string)
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				return n
			}
		}
		return 0
	}
	flushing := func(t *testing.T, b *idemtest.Backend, l *idemtest.Runs, result string, err error) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			a := l.Add(ctx)
			b.Do(t, "SCRIPT", "FLUSH")
			if err != nil {
				return nil, err
			}
			return []byte(fmt.Sprint(result, "#", a.Number)), nil
		}
	}
	check := func(t *testing.T, b *idemtest.Backend, c *idem.Client) {
		t.Helper()
		var l idemtest.Runs
		if res, err := c.Do(ctx, "k1", "fp", l.Fn("a")); err != nil || string(res) != "a#1" {
			t.Fatalf("first call: %q, %v", res, err)
		}
		b.Do(t, "SCRIPT", "FLUSH")
		evals := calls(t, b, "eval")
		// Claim after a flush, completion after another.
		if res, err := c.Do(ctx, "k2", "fp", flushing(t, b, &l, "b", nil)); err != nil || string(res) != "b#1" {
			t.Fatalf("after SCRIPT FLUSH: %q, %v", res, err)
		}
		if n := calls(t, b, "eval") - evals; n < 2 {
			t.Fatalf("%d EVALs: the claim and the completion did not fall back to EVAL", n)
		}
		b.Do(t, "SCRIPT", "FLUSH")
		if res, err := c.Do(ctx, "k1", "fp", l.Fn("again")); err != nil || string(res) != "a#1" {
			t.Fatalf("replay after SCRIPT FLUSH: %q, %v", res, err)
		}
		// A release after a flush.
		boom := errors.New("transient")
		if _, err := c.Do(ctx, "k3", "fp", flushing(t, b, &l, "c", boom)); !errors.Is(err, boom) {
			t.Fatalf("failing fn: %v", err)
		}
		b.Do(t, "SCRIPT", "FLUSH")
		idemtest.WantStatus(t, b, "k3", idem.StateReleased, 1)
		l.Want(t, "k1", "[1]")
		l.Want(t, "k2", "[1]")
	}
	t.Run("single", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{})
		check(t, b, b.Idem(t))
	})
	t.Run("WithReplicas pipeline", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{Extra: []string{"repl-diskless-sync-delay 0"}})
		replica := redistest.Start(t, redistest.Config{Extra: []string{"replicaof 127.0.0.1 " + portOf(b.Addr)}})
		idemtest.Eventually(t, 10*time.Second, "the replica's sync", func() bool {
			return strings.Contains(fmt.Sprint(replica.Do(t, "INFO", "replication")), "master_link_status:up")
		})
		// A replica's acknowledgement can take seconds on a loaded machine;
		// WAIT's timeout stays under the read timeout, which bounds it.
		c := idem.New(b.Client(t, func(o *redis.Options) { o.ReadTimeout = 15 * time.Second }), idem.WithReplicas(1, 10*time.Second))
		t.Cleanup(func() { _ = c.Close() })
		check(t, b, c)
		if got := fmt.Sprint(replica.Do(t, "GET", idem.RecordKey(c, "k2"))); !strings.HasSuffix(got, ":b#1") {
			t.Fatalf("the replica holds %v, want the result", got)
		}
	})
}
