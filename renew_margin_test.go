package idem_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

// renewWatch records when the renewals that succeeded were sent, and cuts
// the connection after the second: every later command fails.
type renewWatch struct {
	sha    string
	mu     sync.Mutex
	ok     []time.Time
	cut    atomic.Bool
	cutErr error
}

func (w *renewWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if w.cut.Load() {
			return nil, w.cutErr
		}
		return next(ctx, network, addr)
	}
}

func (w *renewWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if w.cut.Load() {
			cmd.SetErr(w.cutErr)
			return w.cutErr
		}
		args := cmd.Args()
		renew := len(args) > 1 && strings.EqualFold(args[0].(string), "evalsha") && args[1] == w.sha
		sent := time.Now()
		err := next(ctx, cmd)
		if renew && err == nil {
			w.mu.Lock()
			w.ok = append(w.ok, sent)
			if len(w.ok) == 2 {
				w.cut.Store(true)
			}
			w.mu.Unlock()
		}
		return err
	}
}

func (w *renewWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if w.cut.Load() {
			for _, c := range cmds {
				c.SetErr(w.cutErr)
			}
			return w.cutErr
		}
		return next(ctx, cmds)
	}
}

// A renewal extends the owner's deadline to its send time plus the lease
// less the margin (a thirty-second, for the clocks' drift), not the whole
// lease: fn's context ends a margin before the server may let another
// caller take over. Lease 6.4 s (margin 200 ms); after the second renewal
// Redis is cut off, and the deadline at which fn's context ended must be
// within the lease less half the margin of that renewal's send. The test
// reads the deadline, not the time fn saw its context end: on a loaded
// machine fn's goroutine may wake up long after the deadline passed.
func TestRenewalDeadlineKeepsTheMargin(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const lease = 6400 * time.Millisecond
	margin := lease / 32
	w := &renewWatch{sha: idemtest.ScriptSHA(t, "renew"), cutErr: errors.New("cut")}
	rdb := b.Client(t)
	rdb.AddHook(w)
	c := idem.New(rdb, idem.WithLease(lease), idem.WithPipelines(0), idem.WithStoreTimeout(100*time.Millisecond), idem.WithLogger(nil))
	t.Cleanup(func() { c.Close() })
	var ended time.Time
	var cause error
	_, _ = c.Do(context.Background(), "k", "", func(ctx context.Context) ([]byte, error) {
		for ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		d, ok := idem.LeaseDeadline(ctx)
		if !ok {
			t.Error("fn's context holds no lease deadline")
		}
		ended, cause = d, context.Cause(ctx)
		return nil, ctx.Err()
	})
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("fn's context ended with cause %v; want ErrLeaseLost", cause)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ok) != 2 {
		t.Fatalf("%d renewals succeeded; want 2 before the cut", len(w.ok))
	}
	if got := ended.Sub(w.ok[1]); got > lease-margin/2 {
		t.Fatalf("fn's context ended at its deadline %v after the last renewal was sent; want at most the lease less the margin, %v", got, lease-margin)
	}
}
