package idem_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// startSentinel starts a redis-server in sentinel mode that monitors the
// primary at addr as "mymaster", stopped when the test ends.
func startSentinel(t *testing.T, primary string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(primary)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sport := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\n"+
		"sentinel down-after-milliseconds mymaster 1000\n", sport, dir, host, port)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sport))
	idemtest.Eventually(t, 10*time.Second, "the sentinel to know the primary", func() bool {
		s := redis.NewSentinelClient(&redis.Options{Addr: addr})
		defer s.Close()
		got, err := s.GetMasterAddrByName(context.Background(), "mymaster").Result()
		return err == nil && len(got) == 2 && got[1] == port
	})
	return addr
}

// The README promises Sentinel: a failover client found through a
// sentinel claims, replays and wakes waiters like a plain client.
func TestSentinelFailoverClient(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.Config{})
	sentinel := startSentinel(t, primary.Addr())
	newClient := func(opts ...idem.Option) *idem.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel}})
		c := idem.New(rdb, opts...)
		t.Cleanup(func() {
			_ = c.Close()
			_ = rdb.Close()
		})
		return c
	}
	owner, waiter := newClient(), newClient(idem.WithWait(wakeBudget))
	idem.NoPolling(waiter)
	var l idemtest.Runs
	finish, done := startOwner(t, owner, "k", &l)
	out := waitFor(waiter, "k", &l)
	awaitSubscribed(t, waiter)
	finish("via-sentinel", nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := woken(t, out)
	if got[1] != nil || got[0] != "via-sentinel" {
		t.Fatalf("waiter: got %v, want the owner's result", got)
	}
	res, err := newClient().Do(context.Background(), "k", "fp", l.Fn("again"))
	if err != nil || string(res) != "via-sentinel" {
		t.Fatalf("replay: got %q, %v", res, err)
	}
	if n := l.Count("k"); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	// The record is on the primary the sentinel named.
	if n := primary.Do(t, "EXISTS", idem.RecordKey(owner, "k")); n != int64(1) {
		t.Fatalf("EXISTS on the primary: %v", n)
	}
}
