// restart.go: the outbox scenario of a real redis-server killed with
// SIGKILL and restarted on its port while the relay moves a steady stream
// of committed rows.

package ledgertest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

const (
	restartKills     = 4  // SIGKILLs of redis-server: down, reply lost, down, reply lost
	restartBatch     = 20 // the relay's batch
	restartPerTx     = 5  // events per publishing transaction
	restartProgress  = 60 // rows the relay publishes between two kills
	restartConsumers = 2  // idemstream consumers, in one group
)

// A redis-server with appendonly yes and appendfsync always is killed with
// SIGKILL and restarted on its port, restartKills times, while a publisher
// commits a steady stream of events and the relay moves them. Every other
// kill comes at a random point of the relay's work, and Redis stays down
// until the relay counted a failed batch; the others come just after Redis
// replied to a pipeline of XADDs, and the relay never reads that reply (it
// was lost with the connection): those XADDs are in the append-only file,
// their rows still in the outbox. After the last restart, every committed
// event is in the stream at least once, each event of a reply-lost batch
// twice (at least once, with the same id), and the outbox is empty.
// When the Outbox also implements Backend, two idemstream consumers then
// apply every entry through the ledger, keyed by the event's id: each
// event moves its account exactly once.
//
// The relay's client does not retry (MaxRetries -1, one dial attempt), so
// that every failure reaches the relay at once and its own backoff does
// the waiting: with go-redis's retries the scenario would last seconds
// longer and test the same thing.
//
// Redis without persistence would lose the entries it acknowledged before
// it died, whose rows the relay had deleted: the outbox cannot bring them
// back (docs/operating.md).
func relayRedisRestarted(t *testing.T, e *outboxEnv) {
	cut := &replyCutter{redis: e.redis}
	rdb := redis.NewClient(&redis.Options{Addr: e.redis.Addr(), MaxRetries: -1, DialerRetries: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &replyCutConn{Conn: c, cut: cut}, nil
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	var published, failures atomic.Int64
	var lastErr atomic.Value
	e.relay(t, rdb, restartBatch, func(s RelayCounts) {
		published.Store(s.Published)
		failures.Store(s.Failures)
		if s.Err != nil {
			lastErr.Store(s.Err.Error())
		}
	})

	// The publisher: one transaction of restartPerTx events after another,
	// until stopped.
	var (
		mu   sync.Mutex
		ids  []string
		pubs sync.WaitGroup
	)
	ctx, stopPublishing := context.WithCancel(context.Background())
	defer func() { stopPublishing(); pubs.Wait() }()
	pubs.Go(func() {
		for n := 0; ctx.Err() == nil; n += restartPerTx {
			fields := make([]map[string]any, restartPerTx)
			for i := range fields {
				fields[i] = map[string]any{"n": n + i}
			}
			got, err := e.o.Publish(context.Background(), "orders", fields, false)
			if err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	})

	progressed := func(what string) {
		t.Helper()
		from := published.Load()
		WaitUntil(t, what, func() bool { return published.Load() >= from+restartProgress })
	}
	for kill := range restartKills {
		progressed("the relay to publish")
		from := failures.Load()
		if kill%2 == 0 {
			e.redis.Kill()
		} else {
			cut.armed.Store(true)
			WaitUntil(t, "a reply to XADDs, cut", func() bool { return cut.kills.Load() == int64(kill/2+1) })
		}
		WaitUntil(t, "a failed batch while Redis is down", func() bool { return failures.Load() > from })
		e.redis.Restart(t)
		t.Logf("kill %d: %d published, %d failed batches", kill+1, published.Load(), failures.Load())
	}
	progressed("the relay to publish after the last restart")
	stopPublishing()
	pubs.Wait()
	e.emptied(t)

	msgs := StreamEntries(t, e.client(t), "orders")
	seen := CountIDs(msgs, e.d.EventIDField)
	lost, twice := 0, 0
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d committed events are not in the stream after the last restart", lost, len(ids))
	}
	if want := int(cut.xadds.Load()); twice < want || want < int(cut.kills.Load()) {
		t.Errorf("%d events added twice, want at least %d: each XADD of the %d batches whose replies were cut", twice, want, cut.kills.Load())
	}
	if len(seen) != len(ids) {
		t.Errorf("%d distinct ids in the stream, want the %d published", len(seen), len(ids))
	}
	t.Logf("%d events, %d entries (%d events added twice or more; %d XADDs in the cut batches), %d kills, %d failed batches; last error: %v",
		len(ids), len(msgs), twice, cut.xadds.Load(), restartKills, failures.Load(), lastErr.Load())

	b, ok := e.o.(Backend)
	if !ok {
		t.Log("the Outbox does not implement Backend: no consumer applies the events")
		return
	}
	began := time.Now()
	applyOnce(t, e, b, e.client(t), len(msgs))
	t.Logf("%d entries applied in %v", len(msgs), time.Since(began).Round(time.Millisecond))
	for _, id := range ids {
		if n, err := b.Movements(context.Background(), id); err != nil {
			t.Fatal(err)
		} else if n != 1 {
			t.Errorf("event %s applied %d times, want 1", id, n)
		}
	}
}

// applyOnce runs restartConsumers idemstream consumers of stream "orders",
// in one group, keyed by the event id, each applying an entry as a
// movement of the account named by its event id committed through the
// ledger, until the group has read and acknowledged all n entries.
func applyOnce(t *testing.T, e *outboxEnv, b Backend, rdb *redis.Client, n int) {
	t.Helper()
	keys := idem.New(rdb, idem.WithLedger(b.Ledger()), idem.WithPrefix("apply"), idem.WithLogger(nil))
	defer keys.Close()
	key := func(m redis.XMessage) string { id, _ := m.Values[e.d.EventIDField].(string); return id }
	handler := func(ctx context.Context, m redis.XMessage) error {
		id := key(m)
		if id == "" {
			return errors.New("ledgertest: an entry without an event id")
		}
		tx, err := b.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tx.Move(ctx, id); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx, []byte(nil))
	}
	ctx, stop := context.WithCancel(context.Background())
	var run sync.WaitGroup
	for i := range restartConsumers {
		c := idemstream.New(keys, rdb, "orders", "apply", "c"+string(rune('0'+i)),
			idemstream.WithKey(key), idemstream.WithLogger(nil), idemstream.WithWorkers(4), idemstream.WithBlock(50*time.Millisecond))
		run.Go(func() {
			if err := c.Run(ctx, handler); err != nil {
				t.Errorf("consumer %d: %v", i, err)
			}
		})
	}
	defer func() { stop(); run.Wait() }()
	WaitUntil(t, "the consumers to acknowledge every entry", func() bool {
		groups, err := rdb.XInfoGroups(context.Background(), "orders").Result()
		if err != nil || len(groups) != 1 {
			return false
		}
		return groups[0].EntriesRead >= int64(n) && groups[0].Pending == 0 && groups[0].Lag == 0
	})
}

// replyCutter kills Redis, once armed, when a reply to a pipeline of XADDs
// reaches the relay's connection, and has the relay read an error instead:
// Redis wrote those entries to its append-only file before it replied, and
// the relay does not know it.
type replyCutter struct {
	redis interface{ Kill() }
	armed atomic.Bool
	kills atomic.Int64
	xadds atomic.Int64 // the XADDs of the pipelines whose replies were cut
}

var errReplyCut = errors.New("ledgertest: the connection died before the reply was read")

// replyCutConn is a connection of the relay's client.
type replyCutConn struct {
	net.Conn
	cut   *replyCutter
	xadds int // the XADDs written, while the cutter was armed, since the last reply
}

func (c *replyCutConn) Write(b []byte) (int, error) {
	if c.cut.armed.Load() {
		c.xadds += bytes.Count(bytes.ToLower(b), []byte("xadd"))
	}
	return c.Conn.Write(b)
}

func (c *replyCutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.xadds > 0 && c.cut.armed.CompareAndSwap(true, false) {
		c.cut.redis.Kill()
		c.cut.kills.Add(1)
		c.cut.xadds.Add(int64(c.xadds))
		c.xadds = 0
		_ = c.Conn.Close()
		return 0, errReplyCut
	}
	if n > 0 {
		c.xadds = 0
	}
	return n, err
}
