package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":6379") {
		t.Fatalf("Addr() = %q, want a loopback address other than port 6379", s.Addr())
	}
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != "v" {
		t.Errorf("GET k = %q, want %q", got, "v")
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "redis.log")); err != nil {
		t.Errorf("the server's log is not in its directory: %v", err)
	}
}

func TestClientOptions(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	c := s.Client(t, func(o *redis.Options) { o.DB = 3 })
	ctx := context.Background()
	if err := c.Set(ctx, "k", "in db 3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := s.Do(t, "EXISTS", "k"); got != int64(0) {
		t.Errorf("EXISTS k in db 0 = %v, want 0: the option did not reach the client", got)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{
		MaxMemory: "2mb",
		Extra:     []string{"hz 17"},
	})
	for _, tc := range []struct{ param, want string }{
		{"maxmemory", "2097152"},
		{"maxmemory-policy", "noeviction"},
		{"hz", "17"},
		{"appendonly", "no"},
		{"save", ""},
		{"bind", "127.0.0.1"},
	} {
		got := s.Do(t, "CONFIG", "GET", tc.param)
		want := []any{tc.param, tc.want}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("CONFIG GET %s = %q, want %q", tc.param, got, want)
		}
	}
}

func TestConfigPolicyAndAppendOnly(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{AppendOnly: true, MaxMemoryPolicy: "volatile-lru"})
	for _, tc := range []struct{ param, want string }{
		{"maxmemory-policy", "volatile-lru"},
		{"appendonly", "yes"},
		{"appendfsync", "always"},
	} {
		got := s.Do(t, "CONFIG", "GET", tc.param)
		want := []any{tc.param, tc.want}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("CONFIG GET %s = %q, want %q", tc.param, got, want)
		}
	}
}

func TestDebugSleepIsEnabled(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	start := time.Now()
	if got := s.Do(t, "DEBUG", "SLEEP", "0.1"); got != "OK" {
		t.Errorf("DEBUG SLEEP = %v, want OK", got)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("DEBUG SLEEP 0.1 returned after %v", d)
	}
}

func TestKillRestartAppendOnlyKeepsData(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{AppendOnly: true})
	addr := s.Addr()
	ctx := context.Background()
	c := s.Client(t)
	for i := range 20 {
		if err := c.Set(ctx, fmt.Sprint("k", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s.Kill()
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("the server still accepts connections after Kill")
	}
	s.Restart(t)
	if s.Addr() != addr {
		t.Errorf("Addr() after Restart = %s, want %s", s.Addr(), addr)
	}
	n, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Errorf("DBSIZE after kill -9 and restart = %d, want 20", n)
	}
}

func TestKillRestartWithoutAppendOnlyLosesData(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart(t)
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("EXISTS k after restart without persistence = %d, want 0", n)
	}
}

func TestRestartKillsARunningServer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{AppendOnly: true})
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	id1 := s.Do(t, "INFO", "server")
	s.Restart(t)
	id2 := s.Do(t, "INFO", "server")
	if runID(t, id1) == runID(t, id2) {
		t.Error("run_id unchanged: Restart did not restart a running server")
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET k after Restart = %q, %v; want %q", got, err, "v")
	}
}

func runID(t *testing.T, info any) string {
	t.Helper()
	for _, line := range strings.Split(info.(string), "\r\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return v
		}
	}
	t.Fatal("INFO server has no run_id")
	return ""
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	c := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 100 * time.Millisecond
		o.MaxRetries = -1
	})
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	start := time.Now()
	err := c.Ping(ctx).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING to a paused server: %v, want a timeout", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("PING to a paused server failed after %v, before its read timeout", d)
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Resume: %v", err)
	}
}

func TestCleanupOfPausedServer(t *testing.T) {
	redistest.Require(t) // the server starts in a subtest: skip here, not there
	t.Parallel()
	var s *redistest.Server
	t.Run("pause", func(t *testing.T) {
		s = redistest.Start(t, redistest.Config{})
		s.Pause()
	})
	// The subtest's cleanup must have killed the paused server.
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Error("a paused server still listens after its test ended")
	}
}

func TestCleanupStopsServer(t *testing.T) {
	redistest.Require(t) // the server starts in a subtest: skip here, not there
	t.Parallel()
	var s *redistest.Server
	t.Run("start", func(t *testing.T) {
		s = redistest.Start(t, redistest.Config{})
	})
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Error("the server still listens after its test ended")
	}
}

func TestKillPubSub(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	c := s.Client(t)
	if got := s.KillPubSub(t); got != 0 {
		t.Errorf("KillPubSub with no subscriber = %d, want 0", got)
	}
	sub := c.Subscribe(ctx, "ch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.KillPubSub(t); got != 1 {
		t.Errorf("KillPubSub with one subscriber = %d, want 1", got)
	}
	// The subscriber's connection is gone: a receive sees the error.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := sub.ReceiveTimeout(rctx, time.Second); err == nil {
		t.Error("Receive after KillPubSub succeeded, want a connection error")
	}
}

func TestPortsAreDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 3 {
		s := redistest.Start(t, redistest.Config{})
		if seen[s.Addr()] {
			t.Fatalf("port %s handed out twice", s.Addr())
		}
		seen[s.Addr()] = true
	}
}
