package idemsql

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// On MySQL, a relay's batch holds its transaction open from its claim to
// its COMMIT, its XADDs in between. It runs under READ COMMITTED: under
// the session's REPEATABLE READ, the claim's locking read would lock the
// gap past the outbox's last row, and every Publish would wait for the
// batch. Here Redis never answers, so the batch stays open: a Publish
// beside it commits all the same, at once.
func TestMySQLPublishBesideAStalledRelay(t *testing.T) {
	l := mariadbLedger(t, "")
	ctx := context.Background()
	publish := func(ctx context.Context, n int) error {
		tx, err := l.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := Publish(NewContext(ctx, l), tx, "events", map[string]any{"n": n}); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	if err := publish(ctx, 1); err != nil {
		t.Fatal(err)
	}

	// A "Redis" that reads and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	heard := make(chan struct{})
	var once sync.Once
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				b := make([]byte, 512)
				for {
					if _, err := c.Read(b); err != nil {
						return
					}
					once.Do(func() { close(heard) })
				}
			}()
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ReadTimeout: time.Minute, MaxRetries: -1})
	rctx, cancel := context.WithCancel(ctx)
	relayed := make(chan error, 1)
	go func() { relayed <- l.Relay(rctx, rdb, WithRelayPoll(time.Hour)) }()
	defer func() {
		cancel()
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		if err := <-relayed; !errors.Is(err, context.Canceled) {
			t.Errorf("Relay returned %v, want context.Canceled", err)
		}
		rdb.Close()
	}()
	select {
	case <-heard: // the batch claimed its row and is sending to "Redis"
	case <-time.After(30 * time.Second):
		t.Fatal("the relay sent nothing to Redis in 30 s")
	}

	// InnoDB waits 50 s for a lock by default: 15 s is a wait for the
	// batch, not a slow machine.
	pctx, pcancel := context.WithTimeout(ctx, 15*time.Second)
	defer pcancel()
	start := time.Now()
	if err := publish(pctx, 2); err != nil {
		t.Fatalf("Publish beside the stalled relay batch: %v after %v; want it committed (no gap lock of the batch's claim)", err, time.Since(start).Round(time.Millisecond))
	}
}
