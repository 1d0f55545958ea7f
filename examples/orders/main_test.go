package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if s, ok := os.LookupEnv(childEnv); ok {
		// A process of a test's run: the test binary run again.
		os.Exit(childMain(s))
	}
	goleak.VerifyTestMain(m)
}

// TestProcessesKilled runs the demo on a real redis-server, killing each
// process twice or more: no order is charged twice, every paid order is
// charged exactly once (and no other), and every event is applied exactly
// once and in its order's version order, though some were relayed twice
// and some held back.
func TestProcessesKilled(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	cfg := defaultConfig()
	cfg.orders, cfg.kills, cfg.timeout = 150, 12, 3*time.Minute
	rep, err := run(context.Background(), cfg, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.print(&out)
	t.Log("\n" + out.String())
	check(t, rep)
	for _, role := range []string{roleOrders, roleRelay, rolePayments, roleProvider} {
		if rep.kills[role] < 2 {
			t.Errorf("%s killed %d times, want at least 2", role, rep.kills[role])
		}
	}
	if rep.relayedTwice == 0 {
		t.Errorf("no event relayed twice, though the relay was killed %d times after its XADDs: the run shows nothing", rep.kills[roleRelay])
	}
}

// TestDefaultRun is `go run ./orders` with fewer orders and kills, on the
// embedded miniredis.
func TestDefaultRun(t *testing.T) {
	cfg := defaultConfig()
	cfg.orders, cfg.kills = 60, 4
	rep, err := run(context.Background(), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	check(t, rep)
}

// check fails t unless rep has every paid order charged once and every
// event applied once, in order.
func check(t *testing.T, rep report) {
	t.Helper()
	if rep.doubleCharged != 0 || rep.wrongCharges != 0 || rep.charges != rep.paid {
		t.Errorf("%d orders charged twice, %d paid orders not charged once (or charged unpaid); %d charges for %d paid orders",
			rep.doubleCharged, rep.wrongCharges, rep.charges, rep.paid)
	}
	if rep.appliedTwice != 0 || rep.neverApplied != 0 || rep.applied != rep.published {
		t.Errorf("%d events applied twice, %d never; %d applications of %d events", rep.appliedTwice, rep.neverApplied, rep.applied, rep.published)
	}
	if rep.outOfOrder != 0 {
		t.Errorf("%d orders' events applied out of version order", rep.outOfOrder)
	}
	if rep.orders != rep.cfg.orders || rep.published != rep.orders+rep.paid {
		t.Errorf("%d orders, %d paid, %d events published; want %d orders and an event per change", rep.orders, rep.paid, rep.published, rep.cfg.orders)
	}
	if rep.deadLetters != 0 || rep.pending != 0 {
		t.Errorf("%d dead letters, %d entries pending; want none", rep.deadLetters, rep.pending)
	}
	if !rep.ok() {
		var out bytes.Buffer
		rep.print(&out)
		t.Errorf("report not ok:\n%s", out.String())
	}
}

// TestBadSettings: settings out of range are refused, naming their flag.
func TestBadSettings(t *testing.T) {
	for flag, change := range map[string]func(*config){
		"-orders":    func(c *config) { c.orders = 0 },
		"-paid":      func(c *config) { c.paid = 1.5 },
		"-consumers": func(c *config) { c.consumers = 0 },
		"-kills":     func(c *config) { c.kills = -1 },
		"-lease":     func(c *config) { c.lease = time.Millisecond },
		"-timeout":   func(c *config) { c.timeout = 0 },
	} {
		cfg := defaultConfig()
		change(&cfg)
		if _, err := run(context.Background(), cfg, ""); err == nil || !strings.HasPrefix(err.Error(), flag+" ") {
			t.Errorf("%s out of range: %v, want an error naming it", flag, err)
		}
	}
}
