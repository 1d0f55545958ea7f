package idem_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
)

// A maxmemory-policy changed at run time is reported by the Client's
// periodic check (every minute; here every 200ms), once per change, and
// by Check.
func TestEvictionPolicyRechecked(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	var logs syncBuffer
	c := idem.New(b.Client(t), idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		idem.WithPolicyCheckEvery(200*time.Millisecond))
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Check(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // checks of noeviction: nothing to say
	if s := logs.String(); s != "" {
		t.Fatalf("noeviction logged %q", s)
	}

	b.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	idemtest.Eventually(t, 10*time.Second, "a warning naming allkeys-lru", func() bool {
		return strings.Contains(logs.String(), "maxmemory-policy=allkeys-lru")
	})
	time.Sleep(time.Second) // five more checks of the same policy
	if n := strings.Count(logs.String(), "allkeys-lru"); n != 1 {
		t.Errorf("allkeys-lru logged %d times, want once:\n%s", n, logs.String())
	}
	if _, err := c.Check(ctx); err == nil || !strings.Contains(err.Error(), "maxmemory-policy is allkeys-lru") {
		t.Errorf("Check: %v, want the problem of allkeys-lru", err)
	}

	b.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	time.Sleep(time.Second)
	b.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
	idemtest.Eventually(t, 10*time.Second, "a warning naming volatile-ttl", func() bool {
		return strings.Contains(logs.String(), "maxmemory-policy=volatile-ttl")
	})

	// A check that cannot be made is said once, not every time.
	b.Srv.Kill()
	idemtest.Eventually(t, 10*time.Second, "a warning that the policy cannot be checked", func() bool {
		return strings.Contains(logs.String(), "cannot check")
	})
	time.Sleep(time.Second)
	if n := strings.Count(logs.String(), "cannot check"); n != 1 {
		t.Errorf("the failed check logged %d times, want once:\n%s", n, logs.String())
	}
}

// Close stops the periodic check: nothing is logged after it.
func TestEvictionPolicyCheckStopsAtClose(t *testing.T) {
	t.Parallel()
	b := idemtest.Redis(t, redistest.Config{})
	var logs syncBuffer
	c := idem.New(b.Client(t), idem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		idem.WithPolicyCheckEvery(100*time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	time.Sleep(time.Second)
	if s := logs.String(); s != "" {
		t.Errorf("logged after Close: %q", s)
	}
}
