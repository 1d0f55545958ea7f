package idemtest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// ScriptSource returns the full source of idem's named script ("claim",
// "complete", "release", "renew", "status") as the Client sends it. The
// root package's tests set it (from its test-only export) in TestMain:
// the scripts are embedded in the root package, out of this one's reach.
var ScriptSource func(name string) string

// Scripts are the names of idem's scripts, as in lua/<name>.lua.
var Scripts = []string{"claim", "complete", "release", "renew", "status"}

// ScriptSHA returns the SHA-1 that EVALSHA sends for the named script.
func ScriptSHA(t testing.TB, name string) string {
	t.Helper()
	if ScriptSource == nil {
		t.Fatal("idemtest.ScriptSource is not set (the root package's TestMain sets it)")
	}
	sum := sha1.Sum([]byte(ScriptSource(name)))
	return hex.EncodeToString(sum[:])
}

// FaultRedis is the start of a fault test: a real redis-server with idem's
// scripts loaded, so that no fault rule acts on an EVALSHA that only
// answered NOSCRIPT.
func FaultRedis(t testing.TB, cfg redistest.Config) *Backend {
	t.Helper()
	b := Redis(t, cfg)
	LoadScripts(t, b)
	return b
}

// LoadScripts loads every script of idem into the server's cache.
func LoadScripts(t testing.TB, b *Backend) {
	t.Helper()
	for _, name := range Scripts {
		if got := b.Do(t, "SCRIPT", "LOAD", ScriptSource(name)); got != ScriptSHA(t, name) {
			t.Fatalf("SCRIPT LOAD %s answered %v", name, got)
		}
	}
}

// IsScript matches, in faultconn rules, runs of idem's named script.
func IsScript(t testing.TB, name string) func([]string) bool {
	return faultconn.IsScript(ScriptSHA(t, name))
}

// Count returns a rule that never acts but counts the commands that match:
// add it before the rules that act, which hide what they act on from the
// rules after them.
func Count(match func([]string) bool) (faultconn.Rule, *atomic.Int64) {
	n := new(atomic.Int64)
	return faultconn.Rule{Action: faultconn.DropReply, Match: func(cmd []string) bool {
		if match(cmd) {
			n.Add(1)
		}
		return false
	}}, n
}

// Faulty returns an idem.Client whose connections to b obey in, closed
// when the test ends. ro, if not nil, adjusts the go-redis options
// (MaxRetries, timeouts).
func Faulty(t testing.TB, b *Backend, in *faultconn.Injector, ro func(*redis.Options), opts ...idem.Option) *idem.Client {
	t.Helper()
	rdb := b.Client(t, func(o *redis.Options) {
		o.Dialer = in.Dialer(b.Addr)
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

// NoRetry turns go-redis's retries off.
func NoRetry(o *redis.Options) { o.MaxRetries = -1 }

// Status returns key's Status, read with a clean client.
func Status(t testing.TB, b *Backend, key string) idem.Status {
	t.Helper()
	st, err := b.Idem(t).Status(context.Background(), key)
	if err != nil {
		t.Fatalf("Status(%q): %v", key, err)
	}
	return st
}

// WantStatus fails the test unless key's record is in state with attempt n.
func WantStatus(t testing.TB, b *Backend, key string, state idem.State, n int64) idem.Status {
	t.Helper()
	st := Status(t, b, key)
	if st.State != state || st.Attempt != n {
		t.Fatalf("key %q: status %v attempt %d, want %v attempt %d", key, st.State, st.Attempt, state, n)
	}
	return st
}

// Replay checks that a call from a new Client replays want without
// running fn.
func Replay(t testing.TB, b *Backend, key, want string, l *Runs) {
	t.Helper()
	before := l.Count(key)
	res, err := b.Idem(t).Do(context.Background(), key, "fp", l.Fn("replay-ran-fn"))
	if err != nil || string(res) != want {
		t.Fatalf("key %q: replay got %q, %v; want %q", key, res, err, want)
	}
	if n := l.Count(key); n != before {
		t.Fatalf("key %q: the replay ran fn", key)
	}
}

// Info returns a field of the server's INFO section.
func Info(t testing.TB, b *Backend, section, field string) int64 {
	t.Helper()
	info := b.Do(t, "INFO", section).(string)
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

// LeaseLeft returns how much of key's lease is left by the server's clock
// (negative once it ended), read with a clean client.
func LeaseLeft(t testing.TB, b *Backend, key string) time.Duration {
	t.Helper()
	st := Status(t, b, key)
	now := b.Do(t, "TIME").([]any)
	s, _ := strconv.ParseInt(now[0].(string), 10, 64)
	us, _ := strconv.ParseInt(now[1].(string), 10, 64)
	return st.LeaseEnds.Sub(time.Unix(s, us*1000))
}
