package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Row 23 of docs/faults.md and the replica-wait option, on real servers.

func TestClusterManySlotsWaitersAndFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of six redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 1)
	newClient := func(opts ...idem.Option) (*idem.Client, *redis.ClusterClient) {
		cc := cl.Client(t)
		c := idem.New(cc, opts...)
		t.Cleanup(func() { _ = c.Close() })
		return c, cc
	}
	c, cc := newClient(idem.WithReplicas(1, 2*time.Second))
	ctx := context.Background()
	var l idemtest.Runs

	// Keys over many slots, braces included: record and channel share a slot.
	keys := []string{"{", "}", "}x", "a{b}c", "\x00\xff"}
	for i := range 200 {
		keys = append(keys, fmt.Sprint("pay-", i))
	}
	results := map[string]string{}
	slots := map[int64]bool{}
	for _, k := range keys {
		res, err := c.Do(ctx, k, "fp", l.Fn("r-"+k))
		if err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
		results[k] = string(res)
		rs := cc.ClusterKeySlot(ctx, idem.RecordKey(c, k)).Val()
		if cs := cc.ClusterKeySlot(ctx, idem.ChannelKey(c, k)).Val(); rs != cs {
			t.Fatalf("key %q: record slot %d, channel slot %d", k, rs, cs)
		}
		slots[rs] = true
	}
	if len(slots) < 100 {
		t.Fatalf("205 keys landed in only %d slots", len(slots))
	}

	// Waiters in another Client are woken by sharded pub/sub, on every master.
	waiter, _ := newClient(idem.WithWait(wakeBudget))
	idem.NoPolling(waiter)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range 12 {
		key := fmt.Sprint("hot-", i)
		finish, done := startOwner(t, c, key, &l)
		out := waitFor(waiter, key, &l)
		wg.Go(func() {
			idemtest.Eventually(t, 5*time.Second, "the waiter's subscription", func() bool { return idem.Subscribed(waiter) > 0 })
			time.Sleep(50 * time.Millisecond)
			finish("owner-"+key, nil)
			if err := <-done; err != nil {
				t.Error(err)
			}
			if got := <-out; got[1] != nil || got[0] != "owner-"+key {
				t.Errorf("waiter of %s: got %v", key, got)
			}
		})
	}
	wg.Wait()
	mustBeWoken(t, t0)

	// Kill the master of one key; with WithReplicas every acknowledged
	// result survives on the promoted replica, and nothing runs twice.
	cl.KillMasterOf(t, idem.RecordKey(c, "pay-0"))
	after, _ := newClient()
	for _, k := range keys {
		var res []byte
		var err error
		for try := 0; try < 50; try++ { // the client learns the new topology
			res, err = after.Do(ctx, k, "fp", l.Fn("again"))
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || string(res) != results[k] {
			t.Fatalf("key %q after failover: got %q, %v; want %q", k, res, err, results[k])
		}
		if n := l.Count(k); n != 1 {
			t.Fatalf("key %q: fn ran %d times", k, n)
		}
	}
}

func TestReplicaWait(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.Start(t, redistest.Config{Extra: []string{"replicaof 127.0.0.1 " + portOf(primary.Addr())}})
	b := idemtest.OnServer(primary)
	idemtest.Eventually(t, 10*time.Second, "the replica's sync", func() bool {
		info := fmt.Sprint(replica.Do(t, "INFO", "replication"))
		return strings.Contains(info, "master_link_status:up")
	})
	ctx := context.Background()
	var l idemtest.Runs
	// A replica's acknowledgement can take seconds on a loaded machine;
	// WAIT's timeout stays under the read timeout, which bounds it.
	c := idem.New(b.Client(t, func(o *redis.Options) { o.ReadTimeout = 15 * time.Second }), idem.WithReplicas(1, 10*time.Second))
	t.Cleanup(func() { _ = c.Close() })
	res, err := c.Do(ctx, "k", "fp", l.Fn("ok"))
	if err != nil || string(res) != "ok#1" {
		t.Fatalf("with a replica: got %q, %v", res, err)
	}
	rk := idem.RecordKey(c, "k")
	if got := fmt.Sprint(replica.Do(t, "GET", rk)); !strings.HasSuffix(got, ":ok#1") {
		t.Fatalf("replica holds %q, want the result", got)
	}

	// Two replicas asked, one present: the claim is given back, fn not run.
	c2 := b.Idem(t, idem.WithReplicas(2, 100*time.Millisecond))
	_, err = c2.Do(ctx, "k2", "fp", l.Fn("never"))
	if !errors.Is(err, idem.ErrNotReplicated) {
		t.Fatalf("too few replicas: got %v, want ErrNotReplicated", err)
	}
	if n := l.Count("k2"); n != 0 {
		t.Fatalf("fn ran %d times, want 0", n)
	}
	if st, _ := c.Status(ctx, "k2"); st.State != idem.StateReleased {
		t.Fatalf("claim not given back: state %v", st.State)
	}
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}
