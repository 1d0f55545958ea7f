package idem_test

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
