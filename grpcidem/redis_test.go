package grpcidem_test

import (
	"context"
	"errors"
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

// requireEnv turns a missing redis-server from a skipped test into a
// failed one when it is "1" (CI sets it), as in the root module's
// internal/redistest, which this module cannot import.
const requireEnv = "IDEM_REQUIRE_REDIS"

// startRedis starts a redis-server of the test's own on a free loopback
// port (never 6379), in a temporary directory, with no persistence and
// maxmemory-policy noeviction, and returns its address once it answers
// PING. It is stopped when the test ends. Without redis-server the test is
// skipped, or fails when IDEM_REQUIRE_REDIS=1.
func startRedis(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv(requireEnv) == "1" {
			tb.Fatalf("redis-server not found on PATH, and %s=1 requires the real-Redis tests to run; install it (apt-get install redis-server)", requireEnv)
		}
		tb.Skipf("redis-server not found on PATH; install it (apt-get install redis-server) or these real-Redis tests do not run")
	}
	dir := tb.TempDir()
	var lastErr error
	for range 5 { // a free port can be taken before the server binds it
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		addr, stop, err := launchRedis(dir, port)
		if err == nil {
			tb.Cleanup(stop)
			return addr
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	tb.Fatalf("redis-server did not start: %v", lastErr)
	return ""
}

var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{} // ports given to a server of this process
)

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if port != 6379 && !handedOut[port] {
			handedOut[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port")
}

// launchRedis starts redis-server on port and waits until it answers PING.
func launchRedis(dir string, port int) (addr string, stop func(), err error) {
	conf := strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + strconv.Quote(dir),
		`logfile ""`,
		`save ""`,
		"appendonly no",
		"maxmemory-policy noeviction",
	}, "\n") + "\n"
	confPath := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return "", nil, err
	}
	logPath := filepath.Join(dir, "redis.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", confPath)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, log, log
	cmd.SysProcAttr = sysProcAttr() // dies with the test binary (Linux)
	err = cmd.Start()
	log.Close()
	if err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	kill := func() {
		_ = cmd.Process.Kill()
		<-done
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	for deadline := time.Now().Add(15 * time.Second); ; {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			return "", nil, fmt.Errorf("redis-server on port %d exited: %s", port, b)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			kill()
			return "", nil, fmt.Errorf("redis-server on port %d not ready in 15s: %v", port, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop = func() {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		_ = c.Do(context.Background(), "SHUTDOWN", "NOSAVE").Err()
		_ = c.Close()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			kill()
		}
	}
	return addr, stop, nil
}
