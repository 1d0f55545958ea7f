// env.go: what every scenario runs on: a backend of the driver, a
// redis-server the suite started, and Clients on it, healthy or cut off.

package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// env is one scenario's world.
type env struct {
	t     *testing.T
	b     Backend
	redis *redis.Client
	n     atomic.Int64 // prefixes handed out
}

func newEnv(t *testing.T, d Driver) *env {
	t.Helper()
	e := &env{t: t}
	e.redis = e.startRedis()
	e.b = d.Open(t)
	if e.b == nil {
		t.Fatal("ledgertest: Driver.Open returned a nil Backend")
	}
	if e.b.Ledger() == nil {
		t.Fatal("ledgertest: Backend.Ledger returned nil")
	}
	return e
}

// startRedis starts the scenario's redis-server. Each scenario has one of
// its own: scenarios flush Redis (the fault they test), and a server per
// scenario keeps them independent when a driver's test runs them beside
// others.
func (e *env) startRedis() *redis.Client {
	e.t.Helper()
	r := dbtest.StartRedis(e.t)
	if r == nil { // skipped: no redis-server
		return nil
	}
	return r.Client(e.t)
}

// client returns a Client on the scenario's Redis with the backend's
// ledger and a prefix of its own (two clients are two Redis records of one
// key: two live owners, as when Redis lost a record), plus opts.
func (e *env) client(opts ...idem.Option) *idem.Client {
	return e.clientOn(e.redis, opts...)
}

func (e *env) clientOn(rdb redis.UniversalClient, opts ...idem.Option) *idem.Client {
	e.t.Helper()
	return e.clientAt(rdb, e.prefix(), opts...)
}

// prefix returns a Redis prefix no Client of the scenario has used.
func (e *env) prefix() string { return fmt.Sprintf("lt%d", e.n.Add(1)) }

// clientAt returns a Client on rdb with the backend's ledger and prefix:
// two Clients with one prefix share their records (two processes).
func (e *env) clientAt(rdb redis.UniversalClient, prefix string, opts ...idem.Option) *idem.Client {
	e.t.Helper()
	all := append([]idem.Option{
		idem.WithLedger(e.b.Ledger()), idem.WithPrefix(prefix),
		idem.WithWait(30 * time.Second), idem.WithLogger(nil),
	}, opts...)
	c := idem.New(rdb, all...)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// cutRedis returns a client of the scenario's Redis whose commands all
// fail once cut is called: an owner whose process dies after its commit,
// before Redis hears of the outcome.
func (e *env) cutRedis() (rdb *redis.Client, cut func()) {
	e.t.Helper()
	var dead atomic.Bool
	rdb = redis.NewClient(&redis.Options{Addr: e.redis.Options().Addr, MaxRetries: -1})
	rdb.AddHook(cutHook{&dead})
	e.t.Cleanup(func() { rdb.Close() })
	return rdb, func() { dead.Store(true) }
}

var errCut = errors.New("ledgertest: this owner's Redis connection is cut")

type cutHook struct{ dead *atomic.Bool }

func (h cutHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.dead.Load() {
			return nil, errCut
		}
		return next(ctx, network, addr)
	}
}

func (h cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.dead.Load() {
			cmd.SetErr(errCut)
			return errCut
		}
		return next(ctx, cmd)
	}
}

func (h cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.dead.Load() {
			for _, c := range cmds {
				c.SetErr(errCut)
			}
			return errCut
		}
		return next(ctx, cmds)
	}
}

// flush empties the scenario's Redis: it lost every record.
func (e *env) flush() {
	e.t.Helper()
	if err := e.redis.FlushAll(context.Background()).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// movements returns the committed movements of account.
func (e *env) movements(account string) int {
	e.t.Helper()
	n, err := e.b.Movements(context.Background(), account)
	if err != nil {
		e.t.Fatalf("Movements(%q): %v", account, err)
	}
	return n
}

// lookup returns the ledger's entry of key.
func (e *env) lookup(key string) (idem.Entry, bool) {
	e.t.Helper()
	en, ok, err := e.b.Ledger().Lookup(context.Background(), key)
	if err != nil {
		e.t.Fatalf("Lookup(%q): %v", key, err)
	}
	if ok && en.Key != key {
		e.t.Fatalf("Lookup(%q) returned the entry of %q", key, en.Key)
	}
	return en, ok
}

// debit is a fn that moves account once and commits v in the same
// transaction: the business change and its outcome.
func (e *env) debit(account string, v any) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		tx, err := e.b.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tx.Move(ctx, account); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx, v)
	}
}

// raw adapts a debit to Client.Do's fn, returning v.
func raw(v []byte, f func(ctx context.Context) error) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) { return v, f(ctx) }
}

// mustNotRun is a fn that fails the scenario when it runs.
func (e *env) mustNotRun(why string) func(ctx context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		e.t.Errorf("fn ran: %s", why)
		return nil, errors.New("ledgertest: fn must not run here")
	}
}
