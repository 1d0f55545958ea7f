package idem_test

// Helpers that the tests of package idem_test share: the backends (miniredis
// and real redis-server), the ledger that fn writes to, the fault helpers
// (faultconn rules on the scripts, status checks), and the owners check of
// the one-live-owner promise.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// backend is one Redis the suite runs against: miniredis (fast, virtual
// clock) or a real redis-server started for the test.
type backend struct {
	name string
	addr string
	mr   *miniredis.Miniredis // nil for a real server
	srv  *redistest.Server    // nil for miniredis

	mu  sync.Mutex
	now time.Time // miniredis's virtual clock, once a test moved it
}

// eachBackend runs f against miniredis and against a real redis-server.
// The real one is skipped when redis-server is not installed (and fails
// then when IDEM_REQUIRE_REDIS=1).
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) { f(t, newMiniredis(t)) })
	t.Run("redis", func(t *testing.T) { f(t, newRedis(t, redistest.Config{})) })
}

func newMiniredis(t *testing.T) *backend {
	mr := miniredis.RunT(t)
	return &backend{name: "miniredis", addr: mr.Addr(), mr: mr}
}

func newRedis(t *testing.T, cfg redistest.Config) *backend {
	srv := redistest.Start(t, cfg)
	return &backend{name: "redis", addr: srv.Addr(), srv: srv}
}

// client returns a new go-redis client (its own connection pool, as another
// service instance would have), closed when the test ends.
func (b *backend) client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: b.addr}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// idem returns an idem.Client on a new go-redis client, closed when the
// test ends.
func (b *backend) idem(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	c := idem.New(b.client(t), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// advance moves time forward by d: on miniredis, both the clock that Lua's
// TIME reads and the TTLs; on a real server, it sleeps.
func (b *backend) advance(t testing.TB, d time.Duration) {
	t.Helper()
	if b.mr == nil {
		time.Sleep(d)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.now.IsZero() {
		b.now = time.Now()
	}
	b.now = b.now.Add(d)
	b.mr.SetTime(b.now)
	b.mr.FastForward(d)
}

// inProgress builds the record an owner leaves while its attempt runs, in
// the format of lua/record.lua, written here independently of the scripts:
// attempt n of owner own, with no fingerprint, for a record whose TTL is
// ttl, with leaseLeft of the lease left. The lease ends when the TTL has
// come down to ttl-leaseLeft, which must not be negative. Store it with
// SET ... PX ttl.
func inProgress(own string, n int, ttl, leaseLeft time.Duration) string {
	if leaseLeft > ttl {
		panic("inProgress: a lease that outlives the record")
	}
	return "1p\x00" + string([]byte{byte(len(own))}) + own +
		strconv.Itoa(n) + ":" + strconv.FormatInt((ttl-leaseLeft).Milliseconds(), 10)
}

// do sends one raw command to the backend.
func (b *backend) do(t testing.TB, args ...any) any {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: b.addr, MaxRetries: -1})
	defer rdb.Close()
	v, err := rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("%s: %v: %v", b.name, args, err)
	}
	return v
}

// ledger records fn's side effects: one entry per execution, by key. The
// invariant of every test: at most one entry per key unless the test says.
type ledger struct {
	mu sync.Mutex
	m  map[string][]int64 // key -> attempt numbers that ran
}

func (l *ledger) add(ctx context.Context) idem.Attempt {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		panic("fn ran without an Attempt in its context")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string][]int64)
	}
	l.m[a.Key] = append(l.m[a.Key], a.Number)
	return a
}

func (l *ledger) runs(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.m[key]...)
}

func (l *ledger) count(key string) int { return len(l.runs(key)) }

// fn returns an fn that writes to the ledger and returns result.
func (l *ledger) fn(result string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		a := l.add(ctx)
		return []byte(fmt.Sprintf("%s#%d", result, a.Number)), nil
	}
}

// eventually polls cond until it holds or the timeout ends.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// hashTag returns the part of a Redis key that Redis Cluster hashes.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// faultScripts are the scripts in lua/, by file name.
var faultScripts = []string{"claim", "complete", "release", "renew", "status"}

// faultSHA returns the SHA-1 of the script built from lua/<name>.lua,
// which is what go-redis sends in EVALSHA.
func faultSHA(t testing.TB, name string) string {
	t.Helper()
	return idem.ScriptSHA(name)
}

// faultLoadScripts loads every script into the server's cache.
func faultLoadScripts(t testing.TB, b *backend) {
	t.Helper()
	for _, name := range faultScripts {
		if got := b.do(t, "SCRIPT", "LOAD", idem.ScriptSource(name)); got != faultSHA(t, name) {
			t.Fatalf("SCRIPT LOAD %s answered %v", name, got)
		}
	}
}

// faultCount returns a rule that never acts but counts the commands that
// match: add it before the rules that act, which hide what they act on
// from the rules after them.
func faultCount(match func([]string) bool) (faultconn.Rule, *atomic.Int64) {
	n := new(atomic.Int64)
	return faultconn.Rule{Action: faultconn.DropReply, Match: func(cmd []string) bool {
		if match(cmd) {
			n.Add(1)
		}
		return false
	}}, n
}

// faultyClient returns an idem.Client whose connections to b obey in,
// closed when the test ends. ro, if not nil, adjusts the go-redis options
// (MaxRetries, timeouts).
func faultyClient(t testing.TB, b *backend, in *faultconn.Injector, ro func(*redis.Options), opts ...idem.Option) *idem.Client {
	t.Helper()
	rdb := b.client(t, func(o *redis.Options) {
		o.Dialer = in.Dialer(b.addr)
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
		if ro != nil {
			ro(o)
		}
	})
	c := idem.New(rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func noRetry(o *redis.Options) { o.MaxRetries = -1 }

// faultStatus returns key's Status, read with a clean client.
func faultStatus(t testing.TB, b *backend, key string) idem.Status {
	t.Helper()
	st, err := b.idem(t).Status(context.Background(), key)
	if err != nil {
		t.Fatalf("Status(%q): %v", key, err)
	}
	return st
}

// faultWantStatus fails the test unless key's record is in state with
// attempt n.
func faultWantStatus(t testing.TB, b *backend, key string, state idem.State, n int64) idem.Status {
	t.Helper()
	st := faultStatus(t, b, key)
	if st.State != state || st.Attempt != n {
		t.Fatalf("key %q: status %v attempt %d, want %v attempt %d", key, st.State, st.Attempt, state, n)
	}
	return st
}

// faultReplay checks that a call from a new Client replays want without
// running fn.
func faultReplay(t testing.TB, b *backend, key, want string, l *ledger) {
	t.Helper()
	before := l.count(key)
	res, err := b.idem(t).Do(context.Background(), key, "fp", l.fn("replay-ran-fn"))
	if err != nil || string(res) != want {
		t.Fatalf("key %q: replay got %q, %v; want %q", key, res, err, want)
	}
	if n := l.count(key); n != before {
		t.Fatalf("key %q: the replay ran fn", key)
	}
}

// faultRuns fails the test unless the attempts that ran fn for key are
// want, such as "[1 2]".
func faultRuns(t testing.TB, l *ledger, key, want string) {
	t.Helper()
	if got := fmt.Sprint(l.runs(key)); got != want {
		t.Fatalf("key %q: attempts that ran fn: %s, want %s", key, got, want)
	}
}

// faultInfo returns a field of the server's INFO section.
func faultInfo(t testing.TB, b *backend, section, field string) int64 {
	t.Helper()
	info := b.do(t, "INFO", section).(string)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %q", section, line)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// faultConnScript matches runs of lua/<name>.lua.
func faultConnScript(t testing.TB, name string) func([]string) bool {
	return faultconn.IsScript(faultSHA(t, name))
}

// owners watches the promise of one live owner: enter, at the start of an
// fn, notes an overlap if another fn of the same key is still running with
// a context that is not done; the fn calls the returned leave when it
// returns.
type owners struct {
	mu       sync.Mutex
	live     map[string][]context.Context // guarded by mu; fns running, by key
	overlaps []string                     // guarded by mu
	started  map[string]int               // guarded by mu; fns started, by key
}

func (o *owners) enter(ctx context.Context) (leave func()) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		panic("owners.enter outside fn")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.live == nil {
		o.live = make(map[string][]context.Context)
		o.started = make(map[string]int)
	}
	for _, other := range o.live[a.Key] {
		if other.Err() == nil {
			b, _ := idem.AttemptFrom(other)
			o.overlaps = append(o.overlaps, fmt.Sprintf("key %q: attempt %d started while attempt %d's context was live", a.Key, a.Number, b.Number))
		}
	}
	o.live[a.Key] = append(o.live[a.Key], ctx)
	o.started[a.Key]++
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		l := o.live[a.Key]
		for i, c := range l {
			if c == ctx {
				o.live[a.Key] = append(l[:i:i], l[i+1:]...)
				break
			}
		}
	}
}

// check fails the test if two fns of one key ever ran with live contexts.
func (o *owners) check(t testing.TB) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.overlaps {
		t.Error("two live owners: " + s)
	}
}

// serverLeaseLeft returns how much of key's lease is left by the server's
// clock (negative once it ended), read with a clean client.
func serverLeaseLeft(t testing.TB, b *backend, key string) time.Duration {
	t.Helper()
	st := faultStatus(t, b, key)
	now := b.do(t, "TIME").([]any)
	sec, usec := now[0].(string), now[1].(string)
	var s, us int64
	fmt.Sscan(sec, &s)
	fmt.Sscan(usec, &us)
	return st.LeaseEnds.Sub(time.Unix(s, us*1000))
}
