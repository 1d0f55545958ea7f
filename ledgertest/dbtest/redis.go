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
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is one redis-server started by StartRedis: without persistence,
// unless it was started with AppendFsyncAlways.
type Redis struct {
	addr string
	bin  string // the redis-server program
	conf string // its configuration file
	log  string // its log file

	mu   sync.Mutex
	proc *process // nil while killed
}

// A RedisOption configures the server StartRedis starts.
type RedisOption func(*redisConfig)

type redisConfig struct {
	lines []string // added to redis.conf
}

// AppendFsyncAlways turns on the append-only file with an fsync before
// every reply (appendonly yes, appendfsync always): a write Redis
// acknowledged survives Kill and Restart. Without it, the server persists
// nothing, and a restarted server starts empty.
func AppendFsyncAlways() RedisOption {
	return func(c *redisConfig) {
		c.lines = append(c.lines, "appendonly yes", "appendfsync always")
	}
}

// StartRedis starts a redis-server on a free loopback port, in a new
// temporary directory, and returns once it answers PING. It is stopped
// when the test ends. It skips the test when redis-server is not
// installed (and returns nil), or fails it under IDEM_REQUIRE_REDIS=1.
func StartRedis(tb testing.TB, opts ...RedisOption) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(tb, "redis-server", "redis-server")
		return nil
	}
	var cfg redisConfig
	for _, o := range opts {
		o(&cfg)
	}
	dir := tb.TempDir()
	r := &Redis{bin: bin, conf: filepath.Join(dir, "redis.conf"), log: filepath.Join(dir, "redis.log")}
	var last error
	for range 5 { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		r.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		lines := append([]string{
			"port " + strconv.Itoa(port), "bind 127.0.0.1", "dir " + dir,
			`save ""`, "appendonly no", "maxmemory-policy noeviction",
		}, cfg.lines...) // later lines win
		if err := os.WriteFile(r.conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
		var busy bool
		if busy, last = r.launch(); last == nil {
			tb.Cleanup(func() {
				r.mu.Lock()
				defer r.mu.Unlock()
				if r.proc != nil {
					r.proc.stop(os.Interrupt, 2*time.Second)
					r.proc = nil
				}
			})
			return r
		}
		if !busy {
			break
		}
	}
	tb.Fatalf("dbtest: %v", last)
	return nil
}

// launch starts the server and waits until it answers PING (a server
// loading its append-only file answers LOADING until it is done); busy
// reports that its port was taken. r.mu is held or r is not shared yet.
func (r *Redis) launch() (busy bool, err error) {
	p, err := start(exec.Command(r.bin, r.conf), nil, r.log)
	if err != nil {
		return false, err
	}
	if err := p.waitFor(func() error { return ping(r.addr, p.cmd.Process.Pid) }, 15*time.Second); err != nil {
		p.stop(nil, 0)
		out := p.output()
		return strings.Contains(out, "Address already in use"), fmt.Errorf("redis-server on %s: %w\n%s", r.addr, err, out)
	}
	r.proc = p
	return false, nil
}

// ping returns nil once the server on addr answers and is process pid:
// while another process's redis-server holds the port (two test binaries
// picked it at once), the one started exits with "Address already in
// use", and until then the other would answer in its place.
func ping(addr string, pid int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("the server on %s is process %s, not %d", addr, v, pid)
			}
			return nil
		}
	}
	return fmt.Errorf("the server on %s reports no process_id", addr)
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (r *Redis) Addr() string { return r.addr }

// Kill kills the server with SIGKILL, as a crash or an OOM kill would, and
// waits until it is gone: what it had not written to its append-only file
// (everything, without AppendFsyncAlways) is lost. Killing a killed server
// does nothing.
func (r *Redis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.proc.stop(nil, 0)
		r.proc = nil
	}
}

// Restart starts a killed server again, on the same port, with the same
// directory and configuration (so it loads its append-only file, if it has
// one), and returns once it answers PING; it fails tb if it cannot, as
// when another process took the port meanwhile. Restarting a running
// server does nothing.
func (r *Redis) Restart(tb testing.TB) {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		var busy bool
		if busy, err = r.launch(); err == nil {
			return
		}
		if !busy || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the old socket, not yet closed
	}
	tb.Fatalf("dbtest: restart: %v", err)
}

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
