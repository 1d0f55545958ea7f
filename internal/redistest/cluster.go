package redistest

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterNodeTimeout is cluster-node-timeout in milliseconds: how long
	// a node may be unreachable before it is failed over. Low, so that
	// failover tests are quick; tests that Pause a cluster node for longer
	// than this cause a failover.
	clusterNodeTimeout = 1000
	// clusterTimeout bounds cluster creation and failover.
	clusterTimeout = 30 * time.Second
	// clusterPoll is how often cluster state is polled.
	clusterPoll = 20 * time.Millisecond
)

// Cluster is a Redis Cluster of servers started by StartCluster. Its
// methods are safe for concurrent use.
type Cluster struct {
	nodes    []*Server
	replicas int // replicas per master, as started
}

// StartCluster starts a Redis Cluster of masters masters with
// replicasPerMaster replicas each, on free loopback ports (each node's
// cluster bus port, port+10000, is free too), and returns once every node
// says cluster_state:ok, all 16384 slots are assigned and every replica is
// in sync with its master. It uses redis-cli --cluster create, so it needs
// redis-cli as well as redis-server. The nodes are stopped when the test
// ends.
func StartCluster(tb testing.TB, masters, replicasPerMaster int) *Cluster {
	tb.Helper()
	if !requireProgram(tb, "redis-server", "redis-server") || !requireProgram(tb, "redis-cli", "redis-tools") {
		return nil
	}
	if masters < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 masters, not %d", masters)
		return nil
	}
	total := masters * (1 + replicasPerMaster)
	c := &Cluster{replicas: replicasPerMaster}
	extra := []string{
		"cluster-enabled yes",
		"cluster-config-file nodes.conf",
		"cluster-node-timeout " + strconv.Itoa(clusterNodeTimeout),
		// Replicas may always take over, however long their link was down.
		"cluster-replica-validity-factor 0",
		// The default 5 s delay before a diskless full sync would dominate
		// the start.
		"repl-diskless-sync-delay 0",
	}
	// Start the nodes in parallel: each takes a few tens of milliseconds.
	var (
		wg   sync.WaitGroup
		errs = make([]error, total)
	)
	c.nodes = make([]*Server, total)
	for i := range total {
		s := &Server{tb: tb, dir: tb.TempDir(), cluster: extra}
		c.nodes[i] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.startFresh(func() (int, error) { return freePort(true) })
		}()
	}
	wg.Wait()
	for _, s := range c.nodes {
		if s.proc != nil {
			tb.Cleanup(s.stop)
		}
	}
	for _, err := range errs {
		if err != nil {
			tb.Fatalf("redistest: start cluster node: %v", err)
			return nil
		}
	}

	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
		return nil
	}
	// Every node must also know every master's replicas: CLUSTER REPLICATE
	// reaches the other nodes by gossip, and a node that has not heard yet
	// says a master has none (KillMasterOf asks one node, and failed so).
	deadline := time.Now().Add(clusterTimeout)
	for {
		err := c.stable(nil, "")
		if err == nil {
			err = c.replicasKnown(replicasPerMaster)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: cluster did not become ready within %v: %v\nredis-cli said:\n%s\n%s", clusterTimeout, err, out, c.logTails())
			return nil
		}
		time.Sleep(clusterPoll)
	}
	return c
}

// replicasKnown returns nil if every live node's CLUSTER NODES names at
// least perMaster replicas for every master that owns slots.
func (c *Cluster) replicasKnown(perMaster int) error {
	for _, s := range c.live() {
		nodes, err := clusterNodes(s.Addr())
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", s.Addr(), err)
		}
		for _, m := range nodes {
			if !hasFlag(m, "master") || len(m.ranges) == 0 {
				continue
			}
			n := 0
			for _, r := range nodes {
				if r.master == m.id && hasFlag(r, "slave") {
					n++
				}
			}
			if n < perMaster {
				return fmt.Errorf("%s: names %d replicas of master %s, want %d", s.Addr(), n, m.addr, perMaster)
			}
		}
	}
	return nil
}

// Addrs returns the addresses of all nodes, masters and replicas, in the
// order of Nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Client returns a go-redis cluster client seeded with all nodes, after
// applying opts to its options. The client is closed when the test ends.
func (c *Cluster) Client(tb testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, opt := range opts {
		opt(o)
	}
	cc := redis.NewClusterClient(o)
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns all nodes in the order they were started. Which of them
// are masters changes with failovers; ask a node with CLUSTER NODES.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// KillMasterOf waits until the master that owns the slot of key has a
// live replica in sync with it, kills that master with SIGKILL, then waits until a replica has been promoted in its place: every other
// node says cluster_state:ok and names a new master for the slot. It
// returns the killed server, which Restart brings back as a replica.
func (c *Cluster) KillMasterOf(tb testing.TB, key string) *Server {
	tb.Helper()
	live := c.live()
	if len(live) == 0 {
		tb.Fatalf("redistest: no cluster node is running")
		return nil
	}
	slotText, err := rawDo(live[0].Addr(), time.Second, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		tb.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
		return nil
	}
	slot, _ := strconv.Atoi(slotText)
	// Under load a replica may be flagged fail? for a moment, or still
	// syncing: wait until the slot's master has a live, synced replica to
	// take over, or the kill would leave the slot without a master.
	var (
		owner  string
		victim *Server
	)
	deadline := time.Now().Add(clusterTimeout)
	for {
		nodes, err := clusterNodes(live[0].Addr())
		if err != nil {
			tb.Fatalf("redistest: CLUSTER NODES on %s: %v", live[0].Addr(), err)
			return nil
		}
		owner = slotOwner(nodes, slot)
		victim = c.byAddr(owner)
		if victim == nil {
			tb.Fatalf("redistest: slot %d of %q is owned by %q, which is not a node of this cluster", slot, key, owner)
			return nil
		}
		// A cluster started without replicas has none to wait for; one
		// with replicas may be named late by the node asked (gossip).
		if c.replicas == 0 && !hasReplica(nodes, owner) {
			tb.Fatalf("redistest: master %s of slot %d has no live replica to take over: it has none", owner, slot)
			return nil
		}
		if hasLiveReplica(nodes, owner) && c.hasSyncedReplica(nodes, owner) {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: master %s of slot %d has no live replica to take over, in sync, within %v\n%s", owner, slot, clusterTimeout, c.logTails())
			return nil
		}
		time.Sleep(clusterPoll)
	}
	victim.Kill()
	if err := c.waitStable(victim, key); err != nil {
		tb.Fatalf("redistest: no replica took over slot %d from %s within %v: %v\n%s", slot, owner, clusterTimeout, err, c.logTails())
		return nil
	}
	return victim
}

// logTails returns the ends of the logs of all nodes.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, s := range c.nodes {
		fmt.Fprintf(&b, "node %s: %s\n", s.Addr(), s.logTail())
	}
	return b.String()
}

// live returns the nodes whose process is running.
func (c *Cluster) live() []*Server {
	var live []*Server
	for _, s := range c.nodes {
		s.mu.Lock()
		if s.proc != nil && !s.proc.exited() {
			live = append(live, s)
		}
		s.mu.Unlock()
	}
	return live
}

// byAddr returns the node listening on addr, or nil.
func (c *Cluster) byAddr(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// waitStable waits until every live node says cluster_state:ok with all
// slots assigned and every live replica's link to its master is up. If
// key is not "", it also waits until every live node names the same owner
// for key's slot and that owner is not dead.
func (c *Cluster) waitStable(dead *Server, key string) error {
	deadline := time.Now().Add(clusterTimeout)
	for {
		err := c.stable(dead, key)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(clusterPoll)
	}
}

// stable returns nil if the cluster is in the state waitStable waits for.
func (c *Cluster) stable(dead *Server, key string) error {
	slot := -1
	owner := ""
	for _, s := range c.live() {
		info, err := rawDo(s.Addr(), time.Second, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr(), err)
		}
		if v := infoField(info, "cluster_state"); v != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", s.Addr(), v)
		}
		if v := infoField(info, "cluster_slots_assigned"); v != "16384" {
			return fmt.Errorf("%s: cluster_slots_assigned:%s", s.Addr(), v)
		}
		repl, err := rawDo(s.Addr(), time.Second, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", s.Addr(), err)
		}
		if infoField(repl, "role") == "slave" {
			if v := infoField(repl, "master_link_status"); v != "up" {
				return fmt.Errorf("%s: replica with master_link_status:%s", s.Addr(), v)
			}
		}
		if key == "" {
			continue
		}
		if slot < 0 {
			text, err := rawDo(s.Addr(), time.Second, "CLUSTER", "KEYSLOT", key)
			if err != nil {
				return fmt.Errorf("%s: CLUSTER KEYSLOT: %w", s.Addr(), err)
			}
			slot, _ = strconv.Atoi(text)
		}
		nodes, err := clusterNodes(s.Addr())
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", s.Addr(), err)
		}
		o := slotOwner(nodes, slot)
		switch {
		case o == "":
			return fmt.Errorf("%s: slot %d has no master", s.Addr(), slot)
		case dead != nil && o == dead.Addr():
			return fmt.Errorf("%s: slot %d is still owned by the killed %s", s.Addr(), slot, o)
		case owner != "" && o != owner:
			return fmt.Errorf("nodes disagree on the owner of slot %d: %s and %s", slot, owner, o)
		}
		owner = o
	}
	return nil
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id     string
	addr   string   // "127.0.0.1:PORT"
	master string   // a replica's master's id; "-" for a master
	flags  []string // such as "myself", "master", "slave", "fail"
	ranges [][2]int // slot ranges owned, inclusive
}

// clusterNodes runs CLUSTER NODES on addr and parses the reply.
func clusterNodes(addr string) ([]clusterNode, error) {
	text, err := rawDo(addr, time.Second, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(text), nil
}

// parseClusterNodes parses the text of CLUSTER NODES:
//
//	<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
func parseClusterNodes(text string) []clusterNode {
	var nodes []clusterNode
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: addr, master: f[3], flags: strings.Split(f[2], ",")}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.ranges = append(n.ranges, [2]int{a, b})
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// slotOwner returns the address of the healthy master that owns slot, or "".
func slotOwner(nodes []clusterNode, slot int) string {
	for _, n := range nodes {
		if !hasFlag(n, "master") || hasFlag(n, "fail") || hasFlag(n, "fail?") {
			continue
		}
		for _, r := range n.ranges {
			if slot >= r[0] && slot <= r[1] {
				return n.addr
			}
		}
	}
	return ""
}

// hasLiveReplica reports whether the master at addr has a replica that is
// not failing.
func hasLiveReplica(nodes []clusterNode, addr string) bool {
	id := ""
	for _, n := range nodes {
		if n.addr == addr {
			id = n.id
		}
	}
	for _, n := range nodes {
		if id != "" && n.master == id && hasFlag(n, "slave") && !hasFlag(n, "fail") && !hasFlag(n, "fail?") {
			return true
		}
	}
	return false
}

// hasReplica reports whether nodes name a replica of the master at addr,
// live or not.
func hasReplica(nodes []clusterNode, addr string) bool {
	for _, n := range nodes {
		if n.addr == addr {
			for _, r := range nodes {
				if r.master == n.id && hasFlag(r, "slave") {
					return true
				}
			}
		}
	}
	return false
}

// hasSyncedReplica reports whether a running replica of the master at
// addr, as nodes name them, says its link to the master is up and no sync
// is in progress.
func (c *Cluster) hasSyncedReplica(nodes []clusterNode, addr string) bool {
	id := ""
	for _, n := range nodes {
		if n.addr == addr {
			id = n.id
		}
	}
	for _, n := range nodes {
		if id == "" || n.master != id || !hasFlag(n, "slave") || hasFlag(n, "fail") || hasFlag(n, "fail?") {
			continue
		}
		if s := c.byAddr(n.addr); s == nil || !slices.Contains(c.live(), s) {
			continue
		}
		repl, err := rawDo(n.addr, time.Second, "INFO", "replication")
		if err == nil && infoField(repl, "master_link_status") == "up" && infoField(repl, "master_sync_in_progress") == "0" {
			return true
		}
	}
	return false
}

// hasFlag reports whether n has flag.
func hasFlag(n clusterNode, flag string) bool {
	for _, f := range n.flags {
		if f == flag {
			return true
		}
	}
	return false
}
