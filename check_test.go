package idem_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Check on a healthy server and on misconfigured ones, on a single server,
// through Sentinel, and on every master of a cluster.

// mustProblems fails the test unless err names each of want, and
// the servers' problems count n in all.
func mustProblems(t *testing.T, servers []idem.ServerCheck, err error, n int, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Check found nothing; want %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check's error does not name %q:\n%v", w, err)
		}
	}
	got := 0
	for _, s := range servers {
		got += len(s.Problems)
	}
	if got != n || len(joined(err)) != n {
		t.Errorf("%d problems in the servers, %d errors joined; want %d:\n%v", got, len(joined(err)), n, err)
	}
}

func joined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

func TestCheckSingle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("healthy", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{AppendOnly: true})
		c := b.Idem(t)
		servers, err := c.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(servers) != 1 {
			t.Fatalf("%d servers", len(servers))
		}
		s := servers[0]
		if s.Addr != b.Addr || s.Role != "master" || s.MaxMemoryPolicy != "noeviction" || !s.AppendOnly || s.AppendFsync != "always" || s.Version == "" {
			t.Fatalf("server %+v", s)
		}
		if len(s.Notes) != 1 || !strings.Contains(s.Notes[0], "no replicas") {
			t.Fatalf("notes %q; want only the missing replicas", s.Notes)
		}
		if _, err := c.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("misconfigured", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{
			MaxMemoryPolicy: "allkeys-lru",
			// The client's user may not run scripts.
			Extra: []string{"user default on nopass ~* &* +@all -@scripting"},
		})
		c := b.Idem(t, idem.WithReplicas(1, time.Second), idem.WithLogger(nil))
		servers, err := c.Check(ctx)
		mustProblems(t, servers, err, 3,
			"maxmemory-policy is allkeys-lru", "set maxmemory-policy noeviction",
			"cannot load the claim script", "@scripting",
			"WithReplicas(1)", "0 are connected")
		if !strings.Contains(err.Error(), b.Addr) {
			t.Errorf("the error does not name the server %s: %v", b.Addr, err)
		}
		if notes := strings.Join(servers[0].Notes, "\n"); !strings.Contains(notes, "appendonly no") {
			t.Errorf("notes do not report the missing append-only file: %q", notes)
		}
	})

	t.Run("appendfsync everysec", func(t *testing.T) {
		b := idemtest.Redis(t, redistest.Config{AppendOnly: true, Extra: []string{"appendfsync everysec"}})
		servers, err := b.Idem(t).Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if notes := strings.Join(servers[0].Notes, "\n"); !strings.Contains(notes, "appendfsync everysec") {
			t.Fatalf("notes %q", notes)
		}
	})

	t.Run("replica", func(t *testing.T) {
		primary := redistest.Start(t, redistest.Config{})
		replica := redistest.Start(t, redistest.Config{Extra: []string{"replicaof 127.0.0.1 " + portOf(primary.Addr())}})
		idemtest.Eventually(t, 10*time.Second, "the replica's sync", func() bool {
			return strings.Contains(fmt.Sprint(replica.Do(t, "INFO", "replication")), "master_link_status:up")
		})
		b := idemtest.OnServer(replica)
		servers, err := b.Idem(t, idem.WithLogger(nil)).Check(ctx)
		mustProblems(t, servers, err, 1, "is a replica", "point the client at the primary")

		// The primary has one replica now: WithReplicas(1) is satisfied.
		b = idemtest.OnServer(primary)
		if _, err := b.Idem(t, idem.WithReplicas(1, time.Second)).Check(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		addr := redistest.RefusedAddr(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer rdb.Close()
		c := idem.New(rdb, idem.WithLogger(nil))
		defer c.Close()
		servers, err := c.Check(ctx)
		mustProblems(t, servers, err, 1, "cannot reach", addr)
	})
}

func TestCheckSentinel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newClient := func(t *testing.T, sentinel string, opts ...idem.Option) *idem.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel}})
		c := idem.New(rdb, opts...)
		t.Cleanup(func() {
			_ = c.Close()
			_ = rdb.Close()
		})
		return c
	}
	t.Run("healthy", func(t *testing.T) {
		primary := redistest.Start(t, redistest.Config{AppendOnly: true})
		c := newClient(t, startSentinel(t, primary.Addr()))
		servers, err := c.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(servers) != 1 || servers[0].Addr != primary.Addr() {
			t.Fatalf("servers %+v; want the primary %s", servers, primary.Addr())
		}
	})
	t.Run("misconfigured", func(t *testing.T) {
		primary := redistest.Start(t, redistest.Config{MaxMemoryPolicy: "volatile-lru"})
		c := newClient(t, startSentinel(t, primary.Addr()), idem.WithReplicas(1, time.Second), idem.WithLogger(nil))
		servers, err := c.Check(ctx)
		mustProblems(t, servers, err, 2, "maxmemory-policy is volatile-lru", "WithReplicas(1)", primary.Addr())
	})
}

func TestCheckCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of six redis-server processes: skipped in -short")
	}
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 1)
	c := idem.New(cl.Client(t))
	t.Cleanup(func() { _ = c.Close() })
	servers, err := c.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 3 {
		t.Fatalf("%d servers; want the 3 masters", len(servers))
	}
	for _, s := range servers {
		if s.Role != "master" || s.Replicas != 1 {
			t.Fatalf("server %+v", s)
		}
	}

	// One master evicts, and every master has fewer replicas than asked.
	evicting := servers[1].Addr
	for _, n := range cl.Nodes() {
		if n.Addr() == evicting {
			n.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-random")
		}
	}
	c2 := idem.New(cl.Client(t), idem.WithReplicas(2, time.Second), idem.WithLogger(nil))
	t.Cleanup(func() { _ = c2.Close() })
	servers, err = c2.Check(ctx)
	mustProblems(t, servers, err, 4, "Redis at "+evicting+": maxmemory-policy is allkeys-random", "WithReplicas(2)", "1 are connected")
	for _, s := range servers {
		if !strings.Contains(err.Error(), "Redis at "+s.Addr+": WithReplicas(2)") {
			t.Errorf("master %s: no replica problem in %v", s.Addr, err)
		}
	}
}
