// Package redistest runs real redis-server processes for tests.
//
// Start launches one server on a free loopback port with its own temporary
// directory; StartCluster launches a Redis Cluster of several. Every server
// is stopped when its test ends, and dies with the test binary if that dies
// first (Linux). Tests can crash a server (Kill), bring it back on the same
// port and data directory (Restart), freeze it (Pause, Resume), cut its
// pub/sub clients (KillPubSub) and send it admin commands (Do).
//
// When redis-server is not installed the tests that need it are skipped,
// unless the environment variable IDEM_REQUIRE_REDIS is "1": then they fail,
// so that CI cannot pass by running nothing. Under go test -short they are
// skipped whatever the environment says: -short runs the fast part of the
// suite, on miniredis.
//
// The package never uses port 6379 or a fixed port, and never flushes a
// database: every server it talks to is one it started.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that turns a missing redis-server
// from a skipped test into a failed one when it is set to "1".
const RequireEnv = "IDEM_REQUIRE_REDIS"

const (
	// startTimeout bounds how long a server may take to answer PING (and to
	// finish loading its data) after it was started.
	startTimeout = 15 * time.Second
	// pollInterval is how often readiness is polled.
	pollInterval = 10 * time.Millisecond
	// stopTimeout is how long a server may take to exit after SHUTDOWN
	// before it is killed.
	stopTimeout = 2 * time.Second
	// bindAttempts is how many ports Start tries before it gives up: a
	// free port can be taken by another process before the server binds it.
	bindAttempts = 5
	// logFile is the name of the server's log in its directory.
	logFile = "redis.log"
	// confFile is the name of the server's configuration in its directory.
	confFile = "redis.conf"
)

// Config describes one redis-server.
type Config struct {
	// AppendOnly turns on the append-only file with appendfsync always, so
	// that every write the server acknowledged survives a kill -9. The
	// default is false: no persistence at all.
	AppendOnly bool

	// MaxMemory is the maxmemory setting, such as "2mb". The default, "",
	// leaves memory unlimited.
	MaxMemory string

	// MaxMemoryPolicy is the maxmemory-policy setting. The default is
	// "noeviction".
	MaxMemoryPolicy string

	// Extra holds further configuration lines of the form "directive
	// value". They are written after all others, so they take precedence.
	// The default is none.
	Extra []string
}

// Server is one redis-server process started by Start. Its methods are safe
// for concurrent use.
type Server struct {
	tb   testing.TB // the test that started the server; reports errors of Kill, Pause and Resume
	cfg  Config
	dir  string
	port int
	// cluster holds the extra configuration of a cluster node; nil otherwise.
	cluster []string

	mu     sync.Mutex // guards proc and paused
	proc   *process   // the running process; nil before the first start
	paused bool       // proc was stopped with SIGSTOP and not continued since
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
	err  error         // cmd.Wait's error, valid after done is closed
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Require skips the test when redis-server is not on PATH, or fails it when
// the environment variable IDEM_REQUIRE_REDIS is "1". Start calls it, so
// tests need to call it only to skip before other expensive setup.
func Require(tb testing.TB) {
	tb.Helper()
	requireProgram(tb, "redis-server", "redis-server")
}

// requireProgram skips or fails the test when program is not on PATH; pkg
// is the Debian package that provides it. Under -short it skips the test
// whatever the environment says: -short is the fast part of the suite,
// on miniredis alone.
func requireProgram(tb testing.TB, program, pkg string) bool {
	tb.Helper()
	if testing.Short() {
		tb.Skip("redistest: real-Redis test skipped with -short; run go test without -short to include it")
		return false
	}
	if _, err := exec.LookPath(program); err == nil {
		return true
	}
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("redistest: %s not found on PATH, and %s=1 requires the real-Redis tests to run; install it (apt-get install %s)", program, RequireEnv, pkg)
		return false
	}
	tb.Skipf("redistest: %s not found on PATH; install it (apt-get install %s) or these real-Redis tests do not run", program, pkg)
	return false
}

// Start starts a redis-server with cfg on a free loopback port, in a new
// temporary directory, and returns once it answers PING. The server is
// stopped when the test ends: SHUTDOWN NOSAVE first, SIGKILL if that does
// not end it within two seconds. Start fails the test, showing the end of
// the server's log, if the server does not come up.
func Start(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	if !requireProgram(tb, "redis-server", "redis-server") {
		return nil
	}
	s := &Server{tb: tb, cfg: cfg, dir: tb.TempDir()}
	if err := s.startFresh(func() (int, error) { return freePort(false) }); err != nil {
		tb.Fatalf("redistest: %v", err)
		return nil
	}
	tb.Cleanup(s.stop)
	return s
}

// startFresh starts the server on ports from pick until one binds.
func (s *Server) startFresh(pick func() (int, error)) error {
	var err error
	for range bindAttempts {
		s.port, err = pick()
		if err != nil {
			return err
		}
		var busy bool
		busy, err = s.launch(false)
		if err == nil || !busy {
			return err
		}
	}
	return fmt.Errorf("no free port after %d attempts: %w", bindAttempts, err)
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Dir returns the server's data directory, which also holds its
// configuration (redis.conf) and its log (redis.log).
func (s *Server) Dir() string { return s.dir }

// Client returns a go-redis client for the server, after applying opts to
// its options. The client is closed when the test ends.
func (s *Server) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	o := &redis.Options{Addr: s.Addr()}
	for _, opt := range opts {
		opt(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill kills the server with SIGKILL and waits until it has exited. Kill
// does nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// killLocked kills the running process, if any, and waits for it. s.mu
// must be held.
func (s *Server) killLocked() {
	p := s.proc
	if p == nil || p.exited() {
		return
	}
	// SIGKILL also ends a process stopped by SIGSTOP.
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.tb.Errorf("redistest: kill %s: %v", s.Addr(), err)
	}
	<-p.done
	s.paused = false
}

// Restart starts the server again on the same port, with the same
// directory and configuration, and waits until it answers PING and has
// finished loading its data (INFO persistence shows loading:0). A server
// that is still running is killed first, as if it had crashed. Restart
// fails the test if the server does not come back, for example because
// another process took its port.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	s.killLocked()
	s.mu.Unlock()
	if _, err := s.launch(true); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// signal sends sig to the running server and records whether it is paused.
func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil || p.exited() {
		s.tb.Errorf("redistest: %v %s: the server is not running", sig, s.Addr())
		return
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		s.tb.Errorf("redistest: %v %s: %v", sig, s.Addr(), err)
		return
	}
	s.paused = paused
}

// KillPubSub closes every connection of the server that is in pub/sub mode
// (CLIENT KILL TYPE pubsub) and returns how many it closed.
func (s *Server) KillPubSub(tb testing.TB) int {
	tb.Helper()
	n, ok := s.Do(tb, "CLIENT", "KILL", "TYPE", "pubsub").(int64)
	if !ok {
		tb.Fatalf("redistest: CLIENT KILL TYPE pubsub on %s did not return an integer", s.Addr())
	}
	return int(n)
}

// Do sends one command on a new connection that is closed right after and
// returns the reply, failing the test on any error. A nil reply is returned
// as nil. The connection speaks RESP2, so replies are strings, int64s and
// []any, never maps. It waits up to a minute for the reply, long enough
// for a DEBUG SLEEP; run Do in a goroutine to keep the test going while
// the server sleeps.
func (s *Server) Do(tb testing.TB, args ...any) any {
	tb.Helper()
	v, err := s.do(args...)
	if err != nil {
		tb.Fatalf("redistest: %v on %s: %v", args, s.Addr(), err)
	}
	return v
}

// do sends one command on a new connection and returns its reply.
func (s *Server) do(args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{
		Addr:            s.Addr(),
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		PoolSize:        1,
		DialTimeout:     5 * time.Second,
		ReadTimeout:     time.Minute,
		WriteTimeout:    5 * time.Second,
	})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// launch writes the configuration and starts the process, then waits until
// it is ready. busy reports that the server could not bind its port.
// afterCrash also waits until the server has loaded its data.
func (s *Server) launch(afterCrash bool) (busy bool, err error) {
	conf := filepath.Join(s.dir, confFile)
	if err := os.WriteFile(conf, []byte(s.config()), 0o644); err != nil {
		return false, err
	}
	logPath := filepath.Join(s.dir, logFile)
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return false, err
	}
	logStart, _ := log.Seek(0, 2)

	cmd := exec.Command("redis-server", conf)
	cmd.Dir = s.dir
	// An *os.File is handed to the child as is: no copying goroutine.
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	log.Close()
	if err != nil {
		return false, fmt.Errorf("start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.paused = false
	s.mu.Unlock()

	if err := s.waitReady(p, afterCrash); err != nil {
		s.Kill()
		newLog := readFrom(logPath, logStart)
		busy = bytes.Contains(newLog, []byte("Address already in use"))
		return busy, fmt.Errorf("redis-server on %s: %w\n%s", s.Addr(), err, s.logTail())
	}
	return false, nil
}

// waitReady polls until the server answers PING and, if loaded is set, has
// finished loading its data.
func (s *Server) waitReady(p *process, loaded bool) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("exited before it was ready (%v)", p.err)
		}
		last = s.ready(p.cmd.Process.Pid, loaded)
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v: %w", startTimeout, last)
		}
		time.Sleep(pollInterval)
	}
}

// ready returns nil if the server answers PING and, if loaded is set, has
// finished loading its data.
//
// The server that answers must be process pid: when another process's
// redis-server holds the port (two test binaries picked it at once), this
// one exits with "Address already in use", and until it does, PING would
// get the other's PONG: the test would use, and lose, a server that is not
// its own.
func (s *Server) ready(pid int, loaded bool) error {
	pong, err := rawDo(s.Addr(), time.Second, "PING")
	if err != nil {
		return err
	}
	if pong != "PONG" {
		return fmt.Errorf("PING answered %q", pong)
	}
	server, err := rawDo(s.Addr(), time.Second, "INFO", "server")
	if err != nil {
		return err
	}
	if v := infoField(server, "process_id"); v != strconv.Itoa(pid) {
		return fmt.Errorf("the server on the port is process %s, not %d", v, pid)
	}
	if !loaded {
		return nil
	}
	info, err := rawDo(s.Addr(), time.Second, "INFO", "persistence")
	if err != nil {
		return err
	}
	if v := infoField(info, "loading"); v != "0" {
		return fmt.Errorf("still loading (loading:%s)", v)
	}
	if v := infoField(info, "async_loading"); v != "" && v != "0" {
		return fmt.Errorf("still loading (async_loading:%s)", v)
	}
	return nil
}

// stop ends the server at the end of its test: SHUTDOWN NOSAVE, then
// SIGKILL if the server does not exit in time.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil || p.exited() {
		return
	}
	if s.paused {
		s.killLocked()
		return
	}
	args := []string{"SHUTDOWN", "NOSAVE"}
	if serverMajor() >= 7 {
		// Without NOW, Redis 7 waits up to shutdown-timeout (10 s) for
		// lagging replicas.
		args = append(args, "NOW")
	}
	_, _ = rawDo(s.Addr(), time.Second, args...)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		s.killLocked()
	}
}

// config returns the contents of redis.conf.
func (s *Server) config() string {
	var b strings.Builder
	line := func(args ...string) {
		b.WriteString(strings.Join(args, " "))
		b.WriteByte('\n')
	}
	line("port", strconv.Itoa(s.port))
	line("bind", "127.0.0.1")
	line("protected-mode", "no")
	line("daemonize", "no")
	line("dir", quoteConf(s.dir))
	line("logfile", `""`)
	// RDB snapshots are off in both modes: without AppendOnly nothing is
	// meant to survive, and with it the AOF alone is loaded at startup.
	line("save", `""`)
	if s.cfg.AppendOnly {
		line("appendonly", "yes")
		line("appendfsync", "always")
	} else {
		line("appendonly", "no")
	}
	if s.cfg.MaxMemory != "" {
		line("maxmemory", s.cfg.MaxMemory)
	}
	policy := s.cfg.MaxMemoryPolicy
	if policy == "" {
		policy = "noeviction"
	}
	line("maxmemory-policy", policy)
	if serverMajor() >= 7 {
		// Redis 7 refuses DEBUG unless enabled; older versions reject the
		// directive itself.
		line("enable-debug-command", "yes")
	}
	for _, l := range s.cluster {
		line(l)
	}
	for _, l := range s.cfg.Extra {
		line(l)
	}
	return b.String()
}

// quoteConf quotes s for a redis.conf line.
func quoteConf(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// logTail returns the last lines of the server's log, for failure messages.
func (s *Server) logTail() string {
	path := filepath.Join(s.dir, logFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	const keep = 20
	if len(lines) > keep {
		lines = lines[len(lines)-keep:]
	}
	return fmt.Sprintf("last lines of %s:\n\t%s", path, strings.Join(lines, "\n\t"))
}

// readFrom returns the contents of the file at path from offset on.
func readFrom(path string, offset int64) []byte {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return nil
	}
	return b[offset:]
}

var (
	versionOnce sync.Once
	versionMaj  int
)

// serverMajor returns the major version of the redis-server on PATH, or 0
// if it cannot be told.
func serverMajor() int {
	versionOnce.Do(func() {
		out, err := exec.Command("redis-server", "--version").Output()
		if err != nil {
			return
		}
		// "Redis server v=7.0.15 sha=..."
		m := regexp.MustCompile(`v=(\d+)\.`).FindSubmatch(out)
		if m != nil {
			versionMaj, _ = strconv.Atoi(string(m[1]))
		}
	})
	return versionMaj
}
