// check.go: Check, which tells whether the Redis behind a Client can keep
// idem's promises, for start-up and readiness probes; and the Client's own
// periodic check of maxmemory-policy.

package idem

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

// ServerCheck is what Check found on one Redis server: the server
// of a single or Sentinel-managed deployment, or one master of a cluster.
type ServerCheck struct {
	// Addr is the server's address.
	Addr string `json:"addr"`
	// Version is the server's redis_version ("" when unknown).
	Version string `json:"version"`
	// Role is "master", or "slave" for a replica.
	Role string `json:"role"`
	// MaxMemoryPolicy is the server's maxmemory-policy.
	MaxMemoryPolicy string `json:"maxmemory_policy"`
	// AppendOnly reports whether the append-only file is on.
	AppendOnly bool `json:"appendonly"`
	// AppendFsync is the appendfsync setting ("" when CONFIG GET is
	// refused).
	AppendFsync string `json:"appendfsync"`
	// Replicas is the number of replicas connected to the server.
	Replicas int `json:"replicas"`
	// Problems says what prevents idem from keeping its promises on this
	// server, each with what to change. Check fails when there are any.
	Problems []string `json:"problems"`
	// Notes tells what weakens the promises without breaking them
	// (persistence, replication), or could not be checked.
	Notes []string `json:"notes"`
}

// Check tells whether the Redis behind the Client can serve it and keep its
// promises: every server is reachable, is a primary, runs Redis 7 or later
// where sharded pub/sub is needed (a cluster), has maxmemory-policy
// noeviction, accepts idem's scripts (SCRIPT LOAD), and has at least the
// replicas WithReplicas waits for. It checks the one server of a single or
// Sentinel deployment and every master of a cluster, and returns what it
// found on each, sorted by address (settings, problems, and notes on
// persistence and replication), with the problems joined (errors.Join)
// as its error, each saying what to change. Use it at start-up and in
// readiness probes.
func (c *Client) Check(ctx context.Context) ([]ServerCheck, error) {
	if c == nil || c.rdb == nil {
		return nil, errors.New("idem: Client has no Redis client (use idem.New with a non-nil client)")
	}
	var (
		mu      sync.Mutex
		servers []ServerCheck
	)
	each := func(ctx context.Context, rdb *redis.Client) error {
		s := c.checkServer(ctx, rdb)
		mu.Lock()
		servers = append(servers, s)
		mu.Unlock()
		return nil
	}
	var err error
	switch rdb := c.rdb.(type) {
	case *redis.ClusterClient:
		err = rdb.ForEachMaster(ctx, each)
	case *redis.Ring:
		err = rdb.ForEachShard(ctx, each)
	case *redis.Client:
		err = each(ctx, rdb)
	default:
		return nil, fmt.Errorf("idem: check: cannot check a %T", c.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: cannot reach Redis (%w); check the address, the network and that Redis runs", err)
	}
	sort.Slice(servers, func(i, j int) bool { return servers[i].Addr < servers[j].Addr })
	var errs []error
	for _, s := range servers {
		for _, p := range s.Problems {
			errs = append(errs, fmt.Errorf("idem: Redis at %s: %s", s.Addr, p))
		}
	}
	return servers, errors.Join(errs...)
}

// checkServer checks one server.
func (c *Client) checkServer(ctx context.Context, rdb *redis.Client) ServerCheck {
	s := ServerCheck{Addr: rdb.Options().Addr}
	problem := func(format string, args ...any) { s.Problems = append(s.Problems, fmt.Sprintf(format, args...)) }
	note := func(format string, args ...any) { s.Notes = append(s.Notes, fmt.Sprintf(format, args...)) }

	if err := rdb.Ping(ctx).Err(); err != nil {
		problem("cannot reach it: %v; check the address, the network, the credentials and that Redis runs", err)
		return s
	}
	if ci, err := rdb.Do(ctx, "CLIENT", "INFO").Text(); err == nil {
		if a := field(ci, " ", "laddr="); a != "" {
			s.Addr = a // a Sentinel failover client knows no address of its own
		}
	}
	_, cluster := c.rdb.(*redis.ClusterClient)
	info, infoErr := rdb.Info(ctx).Result()
	if infoErr != nil {
		note("cannot read INFO (%v): version, role, maxmemory-policy, persistence and replicas not checked; make sure maxmemory-policy is noeviction", infoErr)
	} else {
		s.Version = field(info, "\r\n", "redis_version:")
		s.Role = field(info, "\r\n", "role:")
		s.MaxMemoryPolicy = field(info, "\r\n", "maxmemory_policy:")
		s.AppendOnly = field(info, "\r\n", "aof_enabled:") == "1"
		s.Replicas, _ = strconv.Atoi(field(info, "\r\n", "connected_slaves:"))
		if major, _, _ := strings.Cut(s.Version, "."); cluster && major != "" {
			if n, err := strconv.Atoi(major); err == nil && n < 7 {
				problem("Redis %s lacks sharded pub/sub (SSUBSCRIBE), which wakes waiters in a cluster; upgrade to Redis 7 or later", s.Version)
			}
		}
		if s.Role != "" && s.Role != "master" {
			problem("the server is a replica (role %s), which refuses writes; point the client at the primary (or use a Sentinel failover client)", s.Role)
		}
		switch s.MaxMemoryPolicy {
		case "noeviction":
		case "":
			note("INFO does not tell maxmemory-policy; make sure it is noeviction")
		default:
			problem("maxmemory-policy is %s: every record has a TTL, so Redis may evict a live claim and let a retry run fn twice; set maxmemory-policy noeviction", s.MaxMemoryPolicy)
		}
	}
	for _, sc := range []struct {
		name string
		s    pipeline.Script
	}{{"claim", claimScript}, {"complete", completeScript}, {"release", releaseScript}, {"renew", renewScript}, {"status", statusScript}, {"forget", forgetScript}, {"step", stepScript}} {
		sha, err := rdb.ScriptLoad(ctx, sc.s.Src).Result()
		if err != nil {
			problem("cannot load the %s script (%v); allow EVAL, EVALSHA and SCRIPT LOAD (ACL category @scripting) to the client's user", sc.name, err)
			break
		}
		if sha != sc.s.Hash() {
			problem("SCRIPT LOAD of the %s script answered %q, not its SHA-1 %s; is this a Redis-compatible server that runs Lua?", sc.name, sha, sc.s.Hash())
			break
		}
	}
	if infoErr != nil {
		return s // persistence and replicas unknown
	}
	if fs, err := rdb.ConfigGet(ctx, "appendfsync").Result(); err == nil {
		s.AppendFsync = fs["appendfsync"]
	} else {
		note("cannot read appendfsync (CONFIG GET: %v)", err)
	}
	switch {
	case !s.AppendOnly:
		note("appendonly no: a restart of Redis forgets every record it did not snapshot, and a retry of a finished operation runs fn again; set appendonly yes and appendfsync always to keep every acknowledged outcome")
	case s.AppendFsync == "everysec" || s.AppendFsync == "no":
		note("appendfsync %s: a crash of Redis can lose the latest claims and outcomes (about a second's with everysec); appendfsync always keeps every acknowledged outcome", s.AppendFsync)
	}
	switch n := c.cfg.replicas; {
	case n > s.Replicas:
		problem("WithReplicas(%d) waits for %d replicas, but %d are connected: claims would be given back (ErrNotReplicated) and fn would not run; connect replicas or lower WithReplicas", n, n, s.Replicas)
	case n == 0 && s.Replicas > 0:
		note("%d replicas, written to asynchronously: a failover may lose the latest outcomes; WithReplicas(n, timeout) makes claims and outcomes wait for n of them", s.Replicas)
	case s.Replicas == 0:
		note("no replicas: losing this server loses its records")
	}
	return s
}

// field returns the value after prefix in text, a list of fields separated
// by sep (INFO's lines, CLIENT INFO's words).
func field(text, sep, prefix string) string {
	for f := range strings.SplitSeq(text, sep) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(f), prefix); ok {
			return v
		}
	}
	return ""
}

// policyCheckEvery is how often a Client checks maxmemory-policy again: a
// policy changed at run time is reported within it.
const policyCheckEvery = time.Minute

// policyWatch checks the servers' maxmemory-policy when the Client starts
// and every policyCheckEvery until Close, and logs what changed: a policy
// other than noeviction, or a check that cannot be made, each once until
// it changes again. Between checks it holds a timer, no goroutine.
type policyWatch struct {
	mu      sync.Mutex
	timer   *time.Timer // guarded by mu; the next check
	stopped bool        // guarded by mu; Close was called

	// The last policy seen per server ("" when unknown), and whether the
	// last check failed; only the check under way uses them.
	seen   map[string]string
	failed bool
}

// start runs the first check in the background and schedules the next.
func (w *policyWatch) start(c *Client, every time.Duration) {
	if every <= 0 {
		every = policyCheckEvery
	}
	w.seen = map[string]string{}
	var check func()
	check = func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		w.check(ctx, c)
		cancel()
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.stopped {
			w.timer = time.AfterFunc(every, func() {
				w.mu.Lock()
				defer w.mu.Unlock()
				if !w.stopped {
					c.bg.Add() // before Close can wait for c.bg, which it does once stopped
					go check()
				}
			})
		}
	}
	c.bg.Add() // the first check runs even if Close comes at once
	go check()
}

// stop cancels the next check; one under way goes on, and Close waits for
// it (c.bg).
func (w *policyWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
}

// check reads maxmemory-policy (on every master of a cluster) and logs
// what changed since the last check.
func (w *policyWatch) check(ctx context.Context, c *Client) {
	got := map[string]string{}
	var mu sync.Mutex
	read := func(ctx context.Context, rdb redis.Cmdable, addr string) error {
		m, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		got[addr] = m["maxmemory-policy"]
		mu.Unlock()
		return nil
	}
	var err error
	switch rdb := c.rdb.(type) {
	case *redis.ClusterClient:
		err = rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return read(ctx, node, node.Options().Addr)
		})
	default:
		err = read(ctx, rdb, "")
	}
	if err != nil {
		if !w.failed {
			c.cfg.logger.Warn("idem: cannot check Redis maxmemory-policy; make sure it is noeviction, or live claims may be evicted",
				"error", err)
		}
		w.failed = true
		return
	}
	w.failed = false
	for addr, p := range got {
		if p != "" && p != "noeviction" && w.seen[addr] != p {
			args := []any{"maxmemory-policy", p}
			if addr != "" {
				args = append(args, "server", addr)
			}
			c.cfg.logger.Warn("idem: Redis maxmemory-policy is not noeviction: records have TTLs, so Redis may evict live claims and let a retry run twice",
				args...)
		}
		w.seen[addr] = p
	}
}
