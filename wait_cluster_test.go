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
	"go.uber.org/goleak"
)

// FAULTS row 33: in a cluster, the subscriber connections to the masters
// are killed while waiters on keys over many slots wait. go-redis
// re-subscribes a connection's shard channels in one SSUBSCRIBE, which a
// master refuses (CROSSSLOT) when they span slots; the waiters must be
// re-subscribed and woken by pub/sub all the same. Half of them have an
// owner that finished without a notification (as if it was lost): only the
// re-claim that follows the re-subscription can wake them. The others are
// woken by their owner's notification once the channels are subscribed
// again.
func TestClusterPubSubKilledWhileWaiting(t *testing.T) {
	// In a process of its own: it checks for leaked goroutines, which
	// parallel tests would start.
	if idemtest.RunInChild(t) {
		return
	}
	if testing.Short() {
		t.Skip("cluster of three redis-server processes: skipped in -short")
	}
	// Close stops the hub's goroutines, re-subscriber and pinger included.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the other cleanups
	t0 := time.Now()
	cl := redistest.StartCluster(t, 3, 0)
	t.Logf("cluster started in %v", time.Since(t0))
	ctx := context.Background()
	// Only pub/sub wakes a waiter within wakeLimit of its owner's end: it
	// does not poll, and its wait budget and the owner's lease end well
	// after that, also for the owners that finish last, about wakeLimit
	// after the first waiters started when the test fails.
	const budget = 4 * wakeLimit
	owner := idem.New(cl.Client(t), idem.WithLease(2*budget))
	t.Cleanup(func() { _ = owner.Close() })
	silent := idem.New(cl.Client(t), idem.WithLease(2*budget))
	t.Cleanup(func() { _ = silent.Close() })
	idem.LosePublishes(silent)
	wcc := cl.Client(t)
	waiter := idem.New(wcc, idem.WithWait(budget), idem.WithPollInterval(2*budget))
	t.Cleanup(func() { _ = waiter.Close() })
	idem.NoPolling(waiter)

	nodes := map[string]*redistest.Server{}
	for _, s := range cl.Nodes() {
		nodes[s.Addr()] = s
	}

	// perMaster keys on each master, each in a slot of its own.
	const perMaster = 8
	type waiting struct {
		key, ch string
		srv     *redistest.Server
		lost    bool // its owner publishes nothing and finishes before the kill
		finish  func(res string, err error)
		done    <-chan error
		out     <-chan [2]any
		at      time.Time // when its owner finished
	}
	var all []*waiting
	perNode := map[*redistest.Server]int{}
	slots := map[int64]bool{}
	for i := 0; len(all) < 3*perMaster; i++ {
		if i > 10000 {
			t.Fatalf("found only %d keys on distinct slots in 10000 tries", len(all))
		}
		key := fmt.Sprint("wait-", i)
		ch := idem.ChannelKey(waiter, key)
		m, err := wcc.MasterForKey(ctx, ch)
		if err != nil {
			t.Fatalf("master of %q: %v", ch, err)
		}
		srv := nodes[m.Options().Addr]
		if srv == nil {
			t.Fatalf("master %s of %q is not a node of the cluster", m.Options().Addr, ch)
		}
		slot := wcc.ClusterKeySlot(ctx, ch).Val()
		if perNode[srv] == perMaster || slots[slot] {
			continue
		}
		all = append(all, &waiting{key: key, ch: ch, srv: srv, lost: perNode[srv]%2 == 0})
		perNode[srv]++
		slots[slot] = true
	}
	if len(perNode) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(perNode))
	}

	var l idemtest.Runs
	for _, w := range all {
		if w.lost {
			w.finish, w.done = startOwner(t, silent, w.key, &l)
		} else {
			w.finish, w.done = startOwner(t, owner, w.key, &l)
		}
		w.out = waitFor(waiter, w.key, &l)
	}
	pick := func(w *waiting) (*redistest.Server, string) { return w.srv, w.ch }
	idemtest.Eventually(t, 10*time.Second, "the waiters' subscriptions", func() bool { return idem.Subscribed(waiter) == len(all) })
	idemtest.Eventually(t, 10*time.Second, "every channel subscribed on its master", func() bool { return countSubscribed(t, all, pick) == len(all) })
	time.Sleep(20 * time.Millisecond) // the re-claims after the confirmations

	// The silent owners finish; their waiters, not notified, wait on.
	var rest []*waiting
	for _, w := range all {
		if !w.lost {
			rest = append(rest, w)
			continue
		}
		w.finish("owner-"+w.key, nil)
		if err := <-w.done; err != nil {
			t.Fatalf("owner of %s: %v", w.key, err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for _, w := range all {
		select {
		case got := <-w.out:
			t.Fatalf("waiter of %s returned %v before the kill, not woken by anything", w.key, got)
		default:
		}
	}

	for srv := range perNode {
		if n := srv.KillPubSub(t); n != 1 {
			t.Fatalf("%s: killed %d pub/sub connections, want 1", srv.Addr(), n)
		}
	}
	tKill := time.Now()
	for _, w := range all {
		if w.lost {
			w.at = tKill
		}
	}

	// The hub reconnects to every master.
	idemtest.Eventually(t, 10*time.Second, "the hub's reconnection to every master", func() bool {
		for srv := range perNode {
			if subscriberClients(t, srv) != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("reconnected to the 3 masters %v after the kill", time.Since(tKill))

	// The other half's channels are subscribed again on the server.
	deadline := time.Now().Add(10 * time.Second)
	for countSubscribed(t, rest, pick) != len(rest) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := countSubscribed(t, rest, pick); n != len(rest) {
		t.Errorf("10s after the reconnection, %d of %d waiting channels are subscribed on their masters (PUBSUB SHARDNUMSUB); errorstat_CROSSSLOT: %s",
			n, len(rest), crossSlotErrors(t, perNode))
	} else {
		t.Logf("all %d waiting channels subscribed again %v after the kill", len(rest), time.Since(tKill))
	}

	for _, w := range rest {
		w.finish("owner-"+w.key, nil)
		w.at = time.Now()
	}
	var slowest [2]time.Duration // lost, rest
	for _, w := range all {
		if !w.lost {
			if err := <-w.done; err != nil {
				t.Errorf("owner of %s: %v", w.key, err)
			}
		}
		got := <-w.out
		d := time.Since(w.at)
		if w.lost {
			slowest[0] = max(slowest[0], d)
		} else {
			slowest[1] = max(slowest[1], d)
		}
		if got[1] != nil || got[0] != "owner-"+w.key {
			t.Errorf("waiter of %s: got %v; want the owner's result", w.key, got)
		}
		if d > wakeLimit {
			what := "its owner finished"
			if w.lost {
				what = "the kill"
			}
			t.Errorf("waiter of %s returned %v after %s: not woken by pub/sub (it claims again only when woken or when its wait budget of %v ends)", w.key, d, what, budget)
		}
		if n := l.Count(w.key); n != 1 {
			t.Errorf("key %s: fn ran %d times, want 1", w.key, n)
		}
	}
	t.Logf("%d waiters over %d slots on 3 masters: the slowest of those whose owner finished unheard returned %v after the kill; of the others, %v after its owner finished",
		len(all), len(slots), slowest[0], slowest[1])
	idemtest.Eventually(t, 5*time.Second, "the unsubscribes", func() bool { return idem.Subscribed(waiter) == 0 })
}

// countSubscribed returns how many of items have their channel subscribed
// on the server, by PUBSUB SHARDNUMSUB.
func countSubscribed[T any](t *testing.T, items []T, of func(T) (*redistest.Server, string)) int {
	t.Helper()
	byServer := map[*redistest.Server][]string{}
	for _, it := range items {
		srv, ch := of(it)
		byServer[srv] = append(byServer[srv], ch)
	}
	n := 0
	for srv, chans := range byServer {
		n += shardSubscribed(t, srv, chans)
	}
	return n
}

// shardSubscribed returns how many of chans have at least one subscriber
// on srv.
func shardSubscribed(t *testing.T, srv *redistest.Server, chans []string) int {
	t.Helper()
	if len(chans) == 0 {
		return 0
	}
	args := []any{"PUBSUB", "SHARDNUMSUB"}
	for _, ch := range chans {
		args = append(args, ch)
	}
	reply, _ := srv.Do(t, args...).([]any)
	n := 0
	for i := 1; i < len(reply); i += 2 {
		if c, _ := reply[i].(int64); c > 0 {
			n++
		}
	}
	return n
}

// subscriberClients returns how many connections of srv last sent
// SSUBSCRIBE, SUNSUBSCRIBE or PING: the subscriber connections, also those
// that are not in pub/sub mode (CLIENT LIST TYPE pubsub) because every
// SSUBSCRIBE they sent was refused. (The other connections send scripts
// and CLUSTER commands.)
func subscriberClients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	list, _ := srv.Do(t, "CLIENT", "LIST").(string)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		for _, cmd := range []string{"ssubscribe", "sunsubscribe", "ping"} {
			if strings.Contains(line, " cmd="+cmd+" ") {
				n++
			}
		}
	}
	return n
}

// crossSlotErrors returns each server's errorstat_CROSSSLOT line.
func crossSlotErrors(t *testing.T, servers map[*redistest.Server]int) string {
	t.Helper()
	var b strings.Builder
	for srv := range servers {
		info, _ := srv.Do(t, "INFO", "errorstats").(string)
		stat := "none"
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "errorstat_CROSSSLOT:") {
				stat = strings.TrimSpace(line)
			}
		}
		fmt.Fprintf(&b, " %s %s;", srv.Addr(), stat)
	}
	return b.String()
}
