package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A claim that cannot reach Redis says so (ErrUnavailable), fn does not
// run, and nothing warns of a claim that was never made.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		for _, warm := range []bool{false, true} {
			t.Run(fmt.Sprintf("after calls %v", warm), func(t *testing.T) {
				ctx := context.Background()
				// The Client, down for good: closed or killed before its
				// first connection, or after a call; no other test's
				// server may take the port.
				type live struct {
					c    *idem.Client
					logs *syncBuffer
				}
				newClient := func(b *idemtest.Backend) live {
					logs := new(syncBuffer)
					return live{b.Idem(t, idem.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))), logs}
				}
				if warm { // the first subtest took b down
					b = b.Another(t, redistest.Config{})
				}
				var l live
				if !warm {
					l = newClient(idemtest.Downed(t, b, redistest.Config{}, func(b *idemtest.Backend) *idemtest.Backend { return b }))
				} else {
					l = idemtest.Downed(t, b, redistest.Config{}, func(b *idemtest.Backend) live {
						l := newClient(b)
						if _, err := l.c.Do(ctx, "before", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
							t.Fatal(err)
						}
						return l
					})
				}
				c, logs := l.c, l.logs
				ran := false
				_, err := c.Do(ctx, "k", "fp", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
				if !errors.Is(err, idem.ErrUnavailable) || ran {
					t.Fatalf("got %v, ran %v; want ErrUnavailable and fn not run", err, ran)
				}
				if !strings.Contains(err.Error(), `claim key "k"`) {
					t.Errorf("error %q does not name the key", err)
				}
				_ = c.Close()
				if strings.Contains(logs.String(), "release") {
					t.Errorf("warned of a release with no claim made:\n%s", logs.String())
				}
			})
		}
	})
}

// Claims sent to a frozen server time out: ErrUnavailable, and the
// give-backs of those claims, which fail when the server is gone, warn of
// no claim (none survives: the server had no persistence).
func TestUnavailableFrozen(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	var logs syncBuffer
	c := idem.New(b.Client(t, func(o *redis.Options) { o.ReadTimeout = 300 * time.Millisecond }),
		idem.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		idem.WithStoreTimeout(time.Second))
	ctx := context.Background()
	if _, err := c.Do(ctx, "warm", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	b.Srv.Pause()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = c.Do(ctx, fmt.Sprint("k", i), "", func(context.Context) ([]byte, error) {
				t.Error("fn ran on a frozen server")
				return nil, nil
			})
		})
	}
	wg.Wait()
	b.Srv.Kill() // the give-backs fail
	_ = c.Close()
	for i, err := range errs {
		if !errors.Is(err, idem.ErrUnavailable) {
			t.Errorf("call %d: %v, want ErrUnavailable", i, err)
		}
	}
	if strings.Contains(logs.String(), "release") {
		t.Errorf("warned of releases of claims whose replies were lost:\n%s", logs.String())
	}
}

// What is not ErrUnavailable: the caller's own context, a conflict, and
// an error reply that is not about availability; a reply that is (BUSY)
// matches it.
func TestNotUnavailable(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	c := b.Idem(t, idem.WithLogger(nil))
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Do(ctx, "k", "a", fn); !errors.Is(err, context.Canceled) || errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("cancelled context: %v", err)
	}
	if _, err := c.Do(context.Background(), "k", "a", fn); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(context.Background(), "k", "b", fn); !errors.Is(err, idem.ErrConflict) || errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("conflict: %v", err)
	}
	b.MR.SetError("ERR something else")
	if _, err := c.Do(context.Background(), "k2", "a", fn); err == nil || errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("ERR reply: %v, want an error that is not ErrUnavailable", err)
	}
	b.MR.SetError("BUSY Redis is busy running a script")
	if _, err := c.Do(context.Background(), "k3", "a", fn); !errors.Is(err, idem.ErrUnavailable) {
		t.Errorf("BUSY reply: %v, want ErrUnavailable", err)
	}
}
