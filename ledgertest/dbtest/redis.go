package dbtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is one redis-server started by StartRedis, without persistence.
type Redis struct {
	addr string
}

// StartRedis starts a redis-server on a free loopback port, in a new
// temporary directory, and returns once it answers PING. It is stopped
// when the test ends.
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(tb, "redis-server", "redis-server")
		return nil
	}
	dir := tb.TempDir()
	var last error
	for range 5 { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		conf := strings.Join([]string{
			"port " + strconv.Itoa(port), "bind 127.0.0.1", "dir " + dir,
			`save ""`, "appendonly no", "maxmemory-policy noeviction",
		}, "\n") + "\n"
		confPath := filepath.Join(dir, "redis.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			tb.Fatal(err)
		}
		p, err := start(exec.Command(bin, confPath), nil, filepath.Join(dir, "redis.log"))
		if err != nil {
			tb.Fatal(err)
		}
		err = p.waitFor(func() error { return ping(addr) }, 15*time.Second)
		if err == nil {
			tb.Cleanup(func() { p.stop(os.Interrupt, 2*time.Second) })
			return &Redis{addr: addr}
		}
		p.stop(nil, 0)
		last = fmt.Errorf("redis-server on %s: %w\n%s", addr, err, p.output())
		if !strings.Contains(p.output(), "Address already in use") {
			break
		}
	}
	tb.Fatalf("dbtest: %v", last)
	return nil
}

func ping(addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (r *Redis) Addr() string { return r.addr }

// Client returns a go-redis client for the server, after applying opts to
// its options. The client is closed when the test ends.
func (r *Redis) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: r.addr}
	for _, opt := range opts {
		opt(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
