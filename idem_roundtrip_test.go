package idem_test

// Redis round trips set the cost of an idempotent call. The floor is two
// for a new key (claim, then complete) and one for a replay or a conflict;
// these tests count what each path sends, exactly, so that a path that
// grows a round trip fails. They count on the client with a go-redis hook,
// on both backends, and on a real server also with INFO commandstats, which
// sees the subscriber connection that the hook does not.
//
// Counts are of commands on the wire: the first EVALSHA of a script on a
// fresh server answers NOSCRIPT and go-redis sends EVAL after it, so the
// tests warm the scripts first and expect no EVAL, except in the one case
// that checks the cold start.

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// scriptNames maps the SHA-1 of each idem script, as sent to Redis, to its
// name, so that counts say "evalsha claim" rather than a digest.
var scriptNames = sync.OnceValue(func() map[string]string {
	m := make(map[string]string)
	for _, name := range []string{"claim", "complete", "release", "renew", "status"} {
		m[idem.ScriptSHA(name)] = name
	}
	return m
})

// scriptName names a script by its digest, or says it is not idem's.
func scriptName(hash string) string {
	if name, ok := scriptNames()[hash]; ok {
		return name
	}
	return "(other script)"
}

// cmdCounter is a go-redis hook that counts what a client sends: commands
// by name (see cmdName), and round trips, one per command or pipeline.
// go-redis runs it for the commands of its pool and for the handshake of
// every connection it dials, the subscriber's included; it does not see
// what a PubSub sends once connected (SUBSCRIBE, UNSUBSCRIBE, PING).
type cmdCounter struct {
	mu     sync.Mutex
	counts cmdCounts // guarded by mu
}

// cmdCounts is what a cmdCounter saw up to a moment.
type cmdCounts struct {
	trips     int            // round trips, the handshake's included
	handshake int            // round trips of connection handshakes only
	cmds      map[string]int // by cmdName; "dial" counts new connections
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.add("dial")
		return next(ctx, network, addr)
	}
}

func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.add(cmdName(cmd))
		return err
	}
}

func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		names := make([]string, len(cmds))
		for i, cmd := range cmds {
			names[i] = cmdName(cmd)
		}
		c.add(names...)
		return err
	}
}

// add counts one round trip that sent names; a dial is no round trip.
func (c *cmdCounter) add(names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts.cmds == nil {
		c.counts.cmds = make(map[string]int)
	}
	hs := true
	for _, n := range names {
		c.counts.cmds[n]++
		hs = hs && isHandshake(n)
	}
	if len(names) == 1 && names[0] == "dial" {
		return
	}
	c.counts.trips++
	if hs {
		c.counts.handshake++
	}
}

// isHandshake reports whether go-redis sends the command when it sets up a
// connection (Options.Protocol, Options.DisableIdentity and the
// maintenance notifications decide which).
func isHandshake(name string) bool {
	switch name {
	case "dial", "hello", "auth", "select", "client setinfo", "client setname", "client maint_notifications":
		return true
	}
	return false
}

// cmdName names a command: "evalsha claim" or "eval complete" for the
// idem scripts, "client setinfo", "config get", or the command's name.
func cmdName(cmd redis.Cmder) string {
	args := cmd.Args()
	name := strings.ToLower(cmd.Name())
	if len(args) < 2 {
		return name
	}
	arg, _ := args[1].(string)
	switch name {
	case "evalsha":
		return name + " " + scriptName(arg)
	case "eval":
		sum := sha1.Sum([]byte(arg))
		return name + " " + scriptName(hex.EncodeToString(sum[:]))
	case "client", "config":
		return name + " " + strings.ToLower(arg)
	}
	return name
}

func (c *cmdCounter) snapshot() cmdCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.counts
	s.cmds = make(map[string]int, len(c.counts.cmds))
	for k, v := range c.counts.cmds {
		s.cmds[k] = v
	}
	return s
}

// since returns what was counted after before.
func (s cmdCounts) since(before cmdCounts) cmdCounts {
	d := cmdCounts{trips: s.trips - before.trips, handshake: s.handshake - before.handshake, cmds: make(map[string]int)}
	for k, v := range s.cmds {
		if n := v - before.cmds[k]; n != 0 {
			d.cmds[k] = n
		}
	}
	return d
}

// withoutHandshakes drops the connection setups from s.
func (s cmdCounts) withoutHandshakes() cmdCounts {
	d := cmdCounts{trips: s.trips - s.handshake, cmds: make(map[string]int)}
	for k, v := range s.cmds {
		if !isHandshake(k) {
			d.cmds[k] = v
		}
	}
	return d
}

func (s cmdCounts) String() string {
	return fmt.Sprintf("%d round trips: %s", s.trips, formatCounts(s.cmds))
}

// formatCounts prints m sorted by name: {a: 1, b: 2}.
func formatCounts(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = k + ": " + strconv.Itoa(m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// countedIdem returns an idem.Client on rdb, whose commands the returned cmdCounter counts, once
// the Client's background check of the eviction policy is done (it sends
// CONFIG GET). The Client is closed when the test ends.
func countedIdem(tb testing.TB, rdb *redis.Client, opts ...idem.Option) (*idem.Client, *cmdCounter) {
	tb.Helper()
	ctr := new(cmdCounter)
	rdb.AddHook(ctr)
	c := idem.New(rdb, opts...)
	tb.Cleanup(func() { _ = c.Close() })
	idemtest.Eventually(tb, 10*time.Second, "the eviction policy check", func() bool {
		return ctr.snapshot().cmds["config get"] == 1
	})
	return c, ctr
}

// expectTrips fails the test unless got is exactly trips round trips that
// sent want.
func expectTrips(t *testing.T, what string, got cmdCounts, trips int, want map[string]int) {
	t.Helper()
	t.Logf("%-44s %v", what+":", got)
	if got.trips != trips || !maps.Equal(got.cmds, want) {
		t.Errorf("%s: sent %v; want %d round trips: %s", what, got, trips, formatCounts(want))
	}
}

// cmdStats returns the calls of every command from the server's INFO
// commandstats, by name ("evalsha", "client|setinfo"). Commands that
// scripts run count too.
func cmdStats(t *testing.T, b *idemtest.Backend) map[string]int {
	t.Helper()
	info, _ := b.Srv.Do(t, "INFO", "commandstats").(string)
	m := make(map[string]int)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("INFO commandstats: cannot read %q", line)
		}
		m[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return m
}

// statsSince returns the calls of the named commands since before.
func statsSince(before, now map[string]int, names ...string) map[string]int {
	d := make(map[string]int)
	for _, n := range names {
		if v := now[n] - before[n]; v != 0 {
			d[n] = v
		}
	}
	return d
}

// The commands whose server-side counts the tests check: what idem sends,
// on its pool and on its subscriber connection. Commands that scripts run
// (HSET, PUBLISH, ...) are counted by the server too; PUBLISH is checked as
// the one notification per outcome.
var idemServerCmds = []string{"evalsha", "eval", "subscribe", "unsubscribe", "ssubscribe", "sunsubscribe", "publish"}

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		c, ctr := countedIdem(t, b.Client(t))
		var stats0 map[string]int
		if b.Srv != nil {
			stats0 = cmdStats(t, b)
		}
		start := ctr.snapshot()
		var l idemtest.Runs
		measure := func(what string, trips int, want map[string]int, run func()) {
			t.Helper()
			before := ctr.snapshot()
			run()
			expectTrips(t, what, ctr.snapshot().since(before), trips, want)
		}
		mustDo := func(key, fp string, fn func(context.Context) ([]byte, error)) []byte {
			t.Helper()
			res, err := c.Do(ctx, key, fp, fn)
			if err != nil {
				t.Fatalf("Do(%q): %v", key, err)
			}
			return res
		}

		// A fresh server has no script cached: each script's first call is
		// EVALSHA (NOSCRIPT) then EVAL. This warms claim and complete.
		measure("new key, scripts not yet cached", 4, map[string]int{
			"evalsha claim": 1, "eval claim": 1, "evalsha complete": 1, "eval complete": 1,
		}, func() { mustDo("cold", "fp", l.Fn("r")) })

		measure("new key", 2, map[string]int{"evalsha claim": 1, "evalsha complete": 1},
			func() { mustDo("k", "fp", l.Fn("r")) })
		measure("replay", 1, map[string]int{"evalsha claim": 1},
			func() { mustDo("k", "fp", l.Fn("r")) })
		measure("conflict with a done key", 1, map[string]int{"evalsha claim": 1}, func() {
			if _, err := c.Do(ctx, "k", "other", l.Fn("r")); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("got %v, want ErrConflict", err)
			}
		})
		measure("typed Do, new key", 2, map[string]int{"evalsha claim": 1, "evalsha complete": 1}, func() {
			if _, err := idem.Do(ctx, c, "typed", "fp", func(context.Context) (int, error) { return 42, nil }); err != nil {
				t.Fatal(err)
			}
		})
		measure("typed Do, replay", 1, map[string]int{"evalsha claim": 1}, func() {
			if v, err := idem.Do(ctx, c, "typed", "fp", func(context.Context) (int, error) { return 0, nil }); err != nil || v != 42 {
				t.Fatalf("got %v, %v; want 42", v, err)
			}
		})

		// A transient error gives the key back: the release script is
		// cached on its first call here, so warm it first.
		boom := errors.New("boom")
		failing := func(context.Context) ([]byte, error) { return nil, boom }
		if _, err := c.Do(ctx, "warm-release", "", failing); !errors.Is(err, boom) {
			t.Fatal(err)
		}
		measure("transient error (released)", 2, map[string]int{"evalsha claim": 1, "evalsha release": 1}, func() {
			if _, err := c.Do(ctx, "t", "fp", failing); !errors.Is(err, boom) {
				t.Fatalf("got %v, want %v", err, boom)
			}
		})
		measure("new key after a release (attempt 2)", 2, map[string]int{"evalsha claim": 1, "evalsha complete": 1},
			func() { mustDo("t", "fp", l.Fn("r")) })
		perm := func(context.Context) ([]byte, error) { return nil, idem.Permanent(boom) }
		measure("permanent error (stored)", 2, map[string]int{"evalsha claim": 1, "evalsha complete": 1}, func() {
			if _, err := c.Do(ctx, "p", "fp", perm); !errors.Is(err, boom) {
				t.Fatalf("got %v, want %v", err, boom)
			}
		})
		measure("replay of a stored error", 1, map[string]int{"evalsha claim": 1}, func() {
			var se *idem.StoredError
			if _, err := c.Do(ctx, "p", "fp", perm); !errors.As(err, &se) {
				t.Fatalf("got %v, want a *StoredError", err)
			}
		})

		// While an owner runs fn: a conflicting call asks Redis once; a
		// duplicate in the same process joins the owner's flight and asks
		// Redis nothing, so the owner's completion is all that is sent.
		finish, done := startOwner(t, c, "busy", &l)
		measure("conflict with a key in progress", 1, map[string]int{"evalsha claim": 1}, func() {
			if _, err := c.Do(ctx, "busy", "other", l.Fn("r")); !errors.Is(err, idem.ErrConflict) {
				t.Fatalf("got %v, want ErrConflict", err)
			}
		})
		measure("owner + 10 duplicates in its process", 1, map[string]int{"evalsha complete": 1}, func() {
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					if res, err := c.Do(ctx, "busy", "fp", l.Fn("dup")); err != nil || string(res) != "ok" {
						t.Errorf("duplicate: got %q, %v; want the owner's result", res, err)
					}
				})
			}
			// Time for the duplicates to join the flight; one that comes
			// late would replay with a claim, and fail the count.
			time.Sleep(200 * time.Millisecond)
			finish("ok", nil)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			wg.Wait()
		})
		if n := l.Count("busy"); n != 1 {
			t.Fatalf("fn ran %d times for the busy key, want 1", n)
		}

		if b.Srv == nil {
			return
		}
		// The server saw what the hook saw: every script call went through it.
		total := ctr.snapshot().since(start)
		var evalsha, eval int
		for name, n := range total.cmds {
			switch {
			case strings.HasPrefix(name, "evalsha "):
				evalsha += n
			case strings.HasPrefix(name, "eval "):
				eval += n
			}
		}
		server := statsSince(stats0, cmdStats(t, b), "evalsha", "eval")
		if server["evalsha"] != evalsha || server["eval"] != eval {
			t.Errorf("the server counted %v; the client hook counted evalsha: %d, eval: %d", server, evalsha, eval)
		}
	})
}

// A waiter on another Client (another process) goes through Redis: it
// claims (busy), subscribes, and claims again once the subscription is
// confirmed (closing the race with a completion it could have missed).
// The owner's notification then carries its outcome, when the record is
// small enough (complete.lua): the waiter returns it without a third
// claim; a large one it claims a third time to read. Polling is off
// (NoPolling), so no timer adds a claim.
func TestRoundTripsWaiter(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		owner, oc := countedIdem(t, b.Client(t))
		waiter, wc := countedIdem(t, b.Client(t))
		idem.NoPolling(waiter)
		var l idemtest.Runs
		// Cache the scripts.
		for _, c := range []*idem.Client{owner, waiter} {
			if _, err := c.Do(ctx, "warm", "fp", l.Fn("warm")); err != nil {
				t.Fatal(err)
			}
		}

		large := strings.Repeat("x", 5000)
		for round, tc := range []struct {
			what, result string
			claims       int
		}{
			{"first wait (dials the subscriber)", "ok", 2},
			{"later wait", "ok", 2},
			{"later wait, a large outcome", large, 3},
		} {
			what := tc.what
			key := fmt.Sprint("w", round)
			o0, w0 := oc.snapshot(), wc.snapshot()
			var stats0 map[string]int
			if b.Srv != nil {
				stats0 = cmdStats(t, b)
			}

			finish, done := startOwner(t, owner, key, &l)
			out := waitFor(waiter, key, &l)
			idemtest.Eventually(t, 10*time.Second, "the waiter's claim after its subscription was confirmed", func() bool {
				return wc.snapshot().since(w0).cmds["evalsha claim"] >= 2
			})
			finish(tc.result, nil)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := <-out; got[1] != nil || got[0] != tc.result {
				t.Fatalf("waiter: got %.40v, want the owner's result", got)
			}

			expectTrips(t, what+", owner", oc.snapshot().since(o0), 2,
				map[string]int{"evalsha claim": 1, "evalsha complete": 1})
			wgot := wc.snapshot().since(w0)
			if round == 0 {
				t.Logf("%-44s %v (%d of them set up the subscriber connection)", what+", waiter, all:", wgot, wgot.handshake)
				wgot = wgot.withoutHandshakes()
			}
			expectTrips(t, what+", waiter", wgot, tc.claims, map[string]int{"evalsha claim": tc.claims})
			if n := l.Count(key); n != 1 {
				t.Fatalf("fn ran %d times, want 1", n)
			}

			if b.Srv == nil {
				continue
			}
			// The UNSUBSCRIBE is written after Do returns, in the
			// background; wait until the server has counted it.
			var server map[string]int
			idemtest.Eventually(t, 10*time.Second, "the server's count of the UNSUBSCRIBE", func() bool {
				server = statsSince(stats0, cmdStats(t, b), idemServerCmds...)
				return server["unsubscribe"] >= 1
			})
			t.Logf("%-44s %s", what+", server:", formatCounts(server))
			want := map[string]int{"evalsha": 2 + tc.claims, "subscribe": 1, "unsubscribe": 1, "publish": 1}
			if !maps.Equal(server, want) {
				t.Errorf("%s: the server counted %s; want %s", what, formatCounts(server), formatCounts(want))
			}
		}
	})
}

// TestRecordMemory reports what a completed record costs in Redis beside a
// plain hash that holds only its result and beside a plain string of it
// (the least any store can take), and fails on a gross regression: a
// record that costs 400 bytes more than the hash, or 128 more than the
// string (as a record kept as a hash of its fields would). MEMORY
// USAGE depends on the allocator (jemalloc here) and on the encoding: a
// hash field longer than hash-max-listpack-value (64 bytes by default)
// turns the whole hash into a hashtable, as a 100-byte result does.
func TestRecordMemory(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	c := b.Idem(t)
	ctx := context.Background()
	result := []byte(strings.Repeat("r", 100))
	const (
		maxOverHash   = 400
		maxOverString = 128
	)

	usage := func(key string) string {
		n, _ := b.Do(t, "MEMORY", "USAGE", key, "SAMPLES", "0").(int64)
		enc, _ := b.Do(t, "OBJECT", "ENCODING", key).(string)
		b.Do(t, "DEL", key)
		return fmt.Sprintf("%d bytes (%s)", n, enc)
	}
	bytes := func(usage string) int64 {
		n, _ := strconv.ParseInt(usage[:strings.IndexByte(usage, ' ')], 10, 64)
		return n
	}
	measure := func(what, key, fp string) (overHash, overString int64) {
		t.Helper()
		if _, err := c.Do(ctx, key, fp, func(context.Context) ([]byte, error) { return result, nil }); err != nil {
			t.Fatal(err)
		}
		rk := idem.RecordKey(c, key)
		plain := strings.Repeat("p", len(rk)) // keys of the same length
		rec := usage(rk)
		b.Do(t, "HSET", plain, "res", result)
		hash := usage(plain)
		b.Do(t, "SET", plain, result)
		str := usage(plain)
		overHash, overString = bytes(rec)-bytes(hash), bytes(rec)-bytes(str)
		t.Logf("%s: a record of a %d-byte result takes %s; a hash of the result alone %s, a string %s: overhead %d bytes over the hash, %d over the string",
			what, len(result), rec, hash, str, overHash, overString)
		return overHash, overString
	}

	for _, tc := range []struct{ what, key, fp string }{
		{"no fingerprint", "order-1", ""},
		{"with a fingerprint", "order-2", "fp"},
	} {
		overHash, overString := measure(tc.what, tc.key, tc.fp)
		if overHash >= maxOverHash || overString >= maxOverString {
			t.Errorf("%s: a record costs %d bytes more than its result in a hash and %d more than in a string; want less than %d and %d",
				tc.what, overHash, overString, maxOverHash, maxOverString)
		}
	}
	// For comparison: with a limit that keeps small hashes in a listpack.
	b.Do(t, "CONFIG", "SET", "hash-max-listpack-value", "128")
	measure("hash-max-listpack-value 128, with a fingerprint", "order-3", "fp")
}

// With WithReplicas, every script that writes rides in one pipeline with
// its WAIT: the round trips stay those of the paths above.
func TestRoundTripsWithReplicas(t *testing.T) {
	t.Parallel()
	// No delay before the full sync (the default waits 5s for more replicas).
	primary := redistest.Start(t, redistest.Config{Extra: []string{"repl-diskless-sync-delay 0"}})
	_, port, _ := net.SplitHostPort(primary.Addr())
	replica := redistest.Start(t, redistest.Config{Extra: []string{"replicaof 127.0.0.1 " + port}})
	idemtest.Eventually(t, 10*time.Second, "the replica's sync", func() bool {
		info, _ := replica.Do(t, "INFO", "replication").(string)
		return strings.Contains(info, "master_link_status:up")
	})
	ctx := context.Background()
	// A replica's acknowledgement can take seconds on a loaded machine;
	// WAIT's timeout stays under the read timeout, which bounds it.
	c, ctr := countedIdem(t, primary.Client(t, func(o *redis.Options) { o.ReadTimeout = 15 * time.Second }), idem.WithReplicas(1, 10*time.Second))
	var l idemtest.Runs
	if _, err := c.Do(ctx, "warm", "fp", l.Fn("r")); err != nil { // caches the scripts
		t.Fatal(err)
	}
	measure := func(what string, trips int, want map[string]int, key, fp string) {
		t.Helper()
		before := ctr.snapshot()
		if _, err := c.Do(ctx, key, fp, l.Fn("r")); err != nil && !errors.Is(err, idem.ErrConflict) {
			t.Fatal(err)
		}
		expectTrips(t, what, ctr.snapshot().since(before), trips, want)
	}
	measure("new key", 2, map[string]int{"evalsha claim": 1, "evalsha complete": 1, "wait": 2}, "k", "fp")
	measure("replay", 1, map[string]int{"evalsha claim": 1, "wait": 1}, "k", "fp")
	measure("conflict", 1, map[string]int{"evalsha claim": 1, "wait": 1}, "k", "other")
}

// argsHook records the number of keys and arguments of every claim script
// a client sends.
type argsHook struct {
	mu     sync.Mutex
	claims [][2]int // guarded by mu; per claim: keys, then ARGV
}

func (h *argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

func (h *argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.note(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *argsHook) note(cmd redis.Cmder) {
	if cmdName(cmd) != "evalsha claim" {
		return
	}
	args := cmd.Args() // EVALSHA sha numkeys keys... args...
	nk, _ := args[2].(int)
	h.mu.Lock()
	h.claims = append(h.claims, [2]int{nk, len(args) - 3 - nk})
	h.mu.Unlock()
}

// TestClaimArguments holds a plain claim to the record and steps keys and
// two arguments: the ages argument (claim.lua's ARGV[3]) goes only when an
// observer wants ages, for every argument costs the server to parse.
// claim.lua reads a missing ARGV[3] as "not wanted", so scripts of either
// version read either call.
func TestClaimArguments(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		var events idemtest.Runs
		for _, tc := range []struct {
			name string
			opts []idem.Option
			want [2]int
		}{
			{"plain", nil, [2]int{2, 2}},
			{"observed", []idem.Option{idem.WithObserver(nopObserver{})}, [2]int{2, 3}},
		} {
			rdb := b.Client(t)
			h := new(argsHook)
			rdb.AddHook(h)
			c := idem.New(rdb, tc.opts...)
			t.Cleanup(func() { _ = c.Close() })
			key := tc.name + "-key"
			for range 2 { // a new key, then its replay
				if _, err := c.Do(ctx, key, "fp", events.Fn("r")); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			}
			h.mu.Lock()
			got := slices.Clone(h.claims)
			h.mu.Unlock()
			if len(got) < 2 {
				t.Fatalf("%s: %d claims seen, want 2 or more", tc.name, len(got))
			}
			for _, g := range got {
				if g != tc.want {
					t.Errorf("%s: a claim sent %d keys and %d arguments, want %d and %d", tc.name, g[0], g[1], tc.want[0], tc.want[1])
				}
			}
		}
	})
}

// nopObserver is an Observer that ignores every event.
type nopObserver struct{}

func (nopObserver) Observe(context.Context, idem.Event) {}
