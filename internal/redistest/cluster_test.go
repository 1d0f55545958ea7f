package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.StartCluster(t, 3, 1)
	t.Logf("cluster of 6 started in %v", time.Since(start))
	if got := len(c.Nodes()); got != 6 {
		t.Fatalf("len(Nodes()) = %d, want 6", got)
	}
	ctx := context.Background()
	cc := c.Client(t, func(o *redis.ClusterOptions) { o.MaxRedirects = 16 })
	const key = "{user:1}:record"
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	master, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Make sure the write reached the replica before its master dies.
	if n, err := master.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want 1 replica", n, err)
	}
	oldAddr := master.Options().Addr

	failover := time.Now()
	killed := c.KillMasterOf(t, key)
	t.Logf("failover took %v", time.Since(failover))
	if killed.Addr() != oldAddr {
		t.Errorf("KillMasterOf killed %s, but %s owned the key", killed.Addr(), oldAddr)
	}
	// go-redis keeps sending the slot to the dead master (connection
	// refused, no MOVED) until its slot map is refreshed.
	cc.ReloadState(ctx)
	var got string
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err = cc.Get(ctx, key).Result()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || got != "v" {
		t.Fatalf("GET after failover = %q, %v; want %q", got, err, "v")
	}
	newMaster, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if newMaster.Options().Addr == oldAddr {
		t.Errorf("the killed %s still owns the key", oldAddr)
	}

	// The killed master comes back as a replica.
	killed.Restart(t)
	if err := killed.Do(t, "PING"); err != "PONG" {
		t.Errorf("PING the restarted node = %v", err)
	}
}

func TestKillMasterOfWithoutReplicaFails(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	r := &recordingTB{TB: t}
	if got := c.KillMasterOf(r, "k"); got != nil {
		t.Errorf("KillMasterOf with no replica killed %s", got.Addr())
	}
	if !strings.Contains(r.fatal, "no live replica") {
		t.Errorf("failure = %q, want it to say there is no replica", r.fatal)
	}
	for _, s := range c.Nodes() {
		if got := s.Do(t, "PING"); got != "PONG" {
			t.Errorf("PING %s = %v: no master should have been killed", s.Addr(), got)
		}
	}
}
