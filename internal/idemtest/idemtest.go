// Package idemtest holds what the tests of idem's packages share: the
// backends they run against (miniredis and real redis-server processes),
// Runs, which counts the executions of fn, Owners, which watches the
// promise of one live owner, the fault helpers of the real-Redis fault
// tests, and Child, which runs a test binary as a process to kill.
package idemtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Backend is one Redis a test runs against: miniredis (fast, virtual
// clock) or a real redis-server started for the test.
type Backend struct {
	Name string
	Addr string
	MR   *miniredis.Miniredis // nil for a real server
	Srv  *redistest.Server    // nil for miniredis

	mu  sync.Mutex
	now time.Time // miniredis's virtual clock, once a test moved it
}

// EachBackend runs f against miniredis and against a real redis-server.
// The real one is skipped when redis-server is not installed (and fails
// then when IDEM_REQUIRE_REDIS=1).
func EachBackend(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) { f(t, Miniredis(t)) })
	t.Run("redis", func(t *testing.T) { f(t, Redis(t, redistest.Config{})) })
}

// Miniredis returns a miniredis backend, closed when the test ends.
func Miniredis(t *testing.T) *Backend {
	mr := miniredis.RunT(t)
	return &Backend{Name: "miniredis", Addr: mr.Addr(), MR: mr}
}

// Redis returns a redis-server started with cfg, stopped when the test
// ends.
func Redis(t testing.TB, cfg redistest.Config) *Backend {
	srv := redistest.Start(t, cfg)
	return &Backend{Name: "redis", Addr: srv.Addr(), Srv: srv}
}

// OnServer returns the backend of srv, a redis-server the test started.
func OnServer(srv *redistest.Server) *Backend {
	return &Backend{Name: "redis", Addr: srv.Addr(), Srv: srv}
}

// Down makes b unreachable for good: it closes miniredis or kills the
// redis-server, then holds the freed port (redistest.HoldPort) so that
// no other test's server answers there while this test runs. It reports
// false when another process took the port first, in the moment between:
// the caller then tries again with a new backend (see UntilHeld), for a
// client of b could be talking to that process's server.
func (b *Backend) Down(t testing.TB) bool {
	t.Helper()
	if b.MR != nil {
		b.MR.Close()
	} else {
		b.Srv.Kill()
	}
	return redistest.HoldPort(t, b.Addr)
}

// Another returns a new backend of b's kind: miniredis, or a
// redis-server started with cfg.
func (b *Backend) Another(t *testing.T, cfg redistest.Config) *Backend {
	t.Helper()
	if b.MR != nil {
		return Miniredis(t)
	}
	return Redis(t, cfg)
}

// UntilHeld runs f on b, and while f reports that the backend's Down
// did not hold its port (another process took it in the moment between),
// on another backend of its kind (Another), up to three runs in all.
func UntilHeld(t *testing.T, b *Backend, cfg redistest.Config, f func(b *Backend) (held bool)) {
	t.Helper()
	for try := 0; !f(b); try++ {
		if try == 2 {
			t.Fatalf("idemtest: three ports freed by a backend going down were taken by other processes at once")
		}
		t.Logf("idemtest: %s's port %s was taken as it went down: again with a new one", b.Name, b.Addr)
		b = b.Another(t, cfg)
	}
}

// Downed calls up on b, then takes b down (Down); where the port was
// taken in between, it does so again on another backend (UntilHeld). It
// returns what up returned for the backend that is down. up makes what
// the test needs on the live backend (a Client, calls that warm its
// pool).
func Downed[T any](t *testing.T, b *Backend, cfg redistest.Config, up func(*Backend) T) T {
	t.Helper()
	var v T
	UntilHeld(t, b, cfg, func(b *Backend) bool {
		v = up(b)
		return b.Down(t)
	})
	return v
}

// Client returns a new go-redis client (its own connection pool, as another
// service instance would have), closed when the test ends; opts adjust its
// options.
func (b *Backend) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: b.Addr}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Idem returns an idem.Client on a new go-redis client, closed when the
// test ends.
func (b *Backend) Idem(t testing.TB, opts ...idem.Option) *idem.Client {
	t.Helper()
	c := idem.New(b.Client(t), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Advance moves time forward by d: on miniredis, both the clock that Lua's
// TIME reads and the TTLs; on a real server, it sleeps.
func (b *Backend) Advance(t testing.TB, d time.Duration) {
	t.Helper()
	if b.MR == nil {
		time.Sleep(d)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.now.IsZero() {
		b.now = time.Now()
	}
	b.now = b.now.Add(d)
	b.MR.SetTime(b.now)
	b.MR.FastForward(d)
}

// Do sends one raw command to the backend, failing the test on an error.
func (b *Backend) Do(t testing.TB, args ...any) any {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: b.Addr, MaxRetries: -1})
	defer rdb.Close()
	v, err := rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("%s: %v: %v", b.Name, args, err)
	}
	return v
}

// InProgress builds the record an owner leaves while its attempt runs, in
// the format of lua/record.lua, written here independently of the scripts:
// attempt n of owner own, with no fingerprint, for a record whose TTL is
// ttl, with leaseLeft of the lease left. The lease ends when the TTL has
// come down to ttl-leaseLeft, which must not be negative. Store it with
// SET ... PX ttl.
func InProgress(own string, n int, ttl, leaseLeft time.Duration) string {
	if leaseLeft > ttl {
		panic("InProgress: a lease that outlives the record")
	}
	return "1p\x00" + string([]byte{byte(len(own))}) + own +
		strconv.Itoa(n) + ":" + strconv.FormatInt((ttl-leaseLeft).Milliseconds(), 10)
}

// Runs records fn's executions: one entry per run, by key. The invariant
// of every test: at most one run per key unless the test says.
type Runs struct {
	mu sync.Mutex
	m  map[string][]int64 // guarded by mu; key -> attempt numbers that ran
}

// Add notes a run of fn, whose context is ctx, and returns its Attempt.
func (l *Runs) Add(ctx context.Context) idem.Attempt {
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

// Of returns the attempt numbers that ran fn for key, in order.
func (l *Runs) Of(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.m[key]...)
}

// Count returns how many times fn ran for key.
func (l *Runs) Count(key string) int { return len(l.Of(key)) }

// Fn returns an fn that notes its run and returns result#attempt.
func (l *Runs) Fn(result string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		a := l.Add(ctx)
		return []byte(fmt.Sprintf("%s#%d", result, a.Number)), nil
	}
}

// Want fails the test unless the attempts that ran fn for key are want,
// such as "[1 2]".
func (l *Runs) Want(t testing.TB, key, want string) {
	t.Helper()
	if got := fmt.Sprint(l.Of(key)); got != want {
		t.Fatalf("key %q: attempts that ran fn: %s, want %s", key, got, want)
	}
}

// Eventually polls cond until it holds, or fails the test when timeout
// ends.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// HashTag returns the part of a Redis key that Redis Cluster hashes.
func HashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Owners watches the promise of one live owner: Enter, at the start of an
// fn, notes an overlap if another fn of the same key is still running with
// a context that is not done; the fn calls the returned leave when it
// returns.
type Owners struct {
	mu       sync.Mutex
	live     map[string][]context.Context // guarded by mu; fns running, by key
	overlaps []string                     // guarded by mu
	started  map[string]int               // guarded by mu; fns started, by key
}

// Enter notes the start of an fn whose context is ctx.
func (o *Owners) Enter(ctx context.Context) (leave func()) {
	a, ok := idem.AttemptFrom(ctx)
	if !ok {
		panic("Owners.Enter outside fn")
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

// Started returns how many fns of key started.
func (o *Owners) Started(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.started[key]
}

// Overlaps returns the overlaps noted so far, each saying which attempts
// of which key ran with live contexts at once.
func (o *Owners) Overlaps() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.overlaps...)
}

// Check fails the test if two fns of one key ever ran with live contexts.
func (o *Owners) Check(t testing.TB) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.overlaps {
		t.Error("two live owners: " + s)
	}
}
