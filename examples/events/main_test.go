package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every consumer, idem.Client and Redis connection must be gone when a
	// run returns.
	goleak.VerifyTestMain(m)
}

// smallConfig is the default workload, shrunk to keep the race detector
// fast, with more duplicates and crashes so that a small run has several
// of each; the seed stays fixed, so the workload stays the same.
func smallConfig() config {
	cfg := defaultConfig()
	cfg.events = 60
	cfg.dup = 0.2
	cfg.crash = 0.1
	return cfg
}

// faults returns the events of cfg's workload that the producer sends
// twice, and those whose first handling kills its consumer.
func faults(t *testing.T, cfg config) (dups, crashes map[string]bool) {
	t.Helper()
	entries, crashes := cfg.workload()
	dups = make(map[string]bool)
	seen := make(map[string]bool)
	for _, ev := range entries {
		if seen[ev.ID] {
			dups[ev.ID] = true
		}
		seen[ev.ID] = true
	}
	if len(dups) == 0 || len(crashes) == 0 {
		t.Fatalf("the seed gives %d duplicates and %d crashes; choose one that gives some of each", len(dups), len(crashes))
	}
	return dups, crashes
}

func TestIdemAppliesEveryEventOnce(t *testing.T) {
	cfg := smallConfig()
	dups, crashes := faults(t, cfg)
	rep, err := compare(context.Background(), cfg, "")
	if err != nil {
		t.Fatal(err)
	}

	got := rep.idem
	if got.events != cfg.events || got.entries != cfg.events+len(dups) {
		t.Fatalf("the producer sent %d entries of %d events, want %d of %d", got.entries, got.events, cfg.events+len(dups), cfg.events)
	}
	if !got.exactlyOnce() {
		t.Errorf("idem.Do: %d applications of %d events, %d applied twice or more, %d never, %d wrong balances; want each event once",
			got.applications, got.events, got.twice, got.never, got.badBalances)
	}
	// Each crash killed a consumer after it applied its event: the event
	// was taken over by another consumer, which found it in the ledger.
	if got.deaths != len(crashes) {
		t.Errorf("idem.Do: %d consumers died, want %d", got.deaths, len(crashes))
	}
	if got.reclaimed < len(crashes) {
		t.Errorf("idem.Do: %d entries were taken over from a dead consumer, want at least %d", got.reclaimed, len(crashes))
	}
	if got.reconciled < len(crashes) {
		t.Errorf("idem.Do: %d attempts found their event applied, want at least %d (one for each dead consumer)", got.reconciled, len(crashes))
	}
	if got.rejected != 0 {
		t.Errorf("idem.Do rejected %d entries, want none", got.rejected)
	}

	// The plain handler, on the same workload, applies every duplicated
	// event and every event whose consumer died at least twice: the ledger
	// sees double applications when there are some.
	plain := rep.plain
	twice := len(dups)
	for id := range crashes {
		if !dups[id] {
			twice++
		}
	}
	if plain.twice < twice {
		t.Errorf("plain handler: %d events applied twice or more, want at least %d", plain.twice, twice)
	}
	if want := got.entries + len(crashes); plain.applications < want {
		t.Errorf("plain handler: %d applications, want at least %d (every entry, and the events of the dead consumers again)", plain.applications, want)
	}
	if plain.never != 0 || plain.deaths != len(crashes) {
		t.Errorf("plain handler: %d events never applied and %d consumers died, want 0 and %d", plain.never, plain.deaths, len(crashes))
	}
}

func TestNoFaultsNoDoubles(t *testing.T) {
	// Without duplicates or crashes even the plain handler applies every
	// event once: the doubles come from the faults alone. (And from slow
	// handlers: an entry left unacknowledged for min-idle goes to another
	// consumer, so min-idle is long here, for a loaded machine.)
	cfg := smallConfig()
	cfg.dup, cfg.crash = 0, 0
	cfg.minIdle = time.Minute
	rep, err := compare(context.Background(), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []result{rep.idem, rep.plain} {
		if !r.exactlyOnce() || r.entries != cfg.events || r.deaths != 0 || r.reclaimed != 0 {
			t.Errorf("got %+v, want %d entries, each applied once, no deaths, nothing taken over", r, cfg.events)
		}
	}
}

func TestConflictingEventIsAcknowledgedNotApplied(t *testing.T) {
	// The producer reuses an event's id for another amount: idem.Do
	// refuses the second entry with ErrConflict, and the consumer
	// acknowledges it, since no redelivery can change that.
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg := defaultConfig()
	cfg.consumers = 1 // the first entry of evt-2 is applied first
	entries := []event{
		{ID: "evt-1", Account: "acct-1", Amount: 10},
		{ID: "evt-2", Account: "acct-1", Amount: 20},
		{ID: "evt-2", Account: "acct-1", Amount: 99},
		{ID: "evt-3", Account: "acct-2", Amount: 30},
	}
	ctx := context.Background()
	admin := newTestClient(t, m.Addr())
	r := run{cfg: cfg, addr: m.Addr(), admin: admin, entries: entries}
	res, err := r.do(ctx, "t:", true)
	if err != nil {
		t.Fatal(err)
	}
	if !res.exactlyOnce() || res.events != 3 || res.rejected != 1 {
		t.Errorf("got %+v, want 3 events applied once each and 1 entry rejected", res)
	}
	bal, err := newLedger(admin, "t:").balances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bal["acct-1"] != 30 {
		t.Errorf("acct-1 has %d, want 30 (the conflicting 99 not applied)", bal["acct-1"])
	}
}

func TestParseEvent(t *testing.T) {
	ev, err := parseEvent(map[string]any{"id": "evt-1", "account": "acct-1", "amount": "42"})
	if err != nil || ev != (event{ID: "evt-1", Account: "acct-1", Amount: 42}) {
		t.Errorf("got %+v, %v; want evt-1 crediting 42 to acct-1", ev, err)
	}
	for _, v := range []map[string]any{
		{"account": "acct-1", "amount": "42"},
		{"id": "evt-1", "amount": "42"},
		{"id": "evt-1", "account": "acct-1"},
		{"id": "evt-1", "account": "acct-1", "amount": "4x"},
	} {
		if _, err := parseEvent(v); err == nil {
			t.Errorf("parseEvent(%v) accepted a malformed event", v)
		}
	}
}

func TestRunDeletesOnlyItsKeys(t *testing.T) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Set("someone-else:key", "keep"); err != nil {
		t.Fatal(err)
	}
	cfg := smallConfig()
	cfg.events = 10
	// No crashes: a miniredis given as -redis has no one to move its clock,
	// so a dead consumer's lease would never end (a real Redis's does).
	cfg.crash = 0
	if _, err := compare(context.Background(), cfg, m.Addr()); err != nil {
		t.Fatal(err)
	}
	if got, want := m.Keys(), []string{"someone-else:key"}; !slices.Equal(got, want) {
		t.Errorf("keys after the run: got %q, want %q", got, want)
	}
}

func TestWorkloadFollowsTheSeed(t *testing.T) {
	cfg := defaultConfig()
	a, ca := cfg.workload()
	b, cb := cfg.workload()
	if !slices.Equal(a, b) || len(ca) != len(cb) {
		t.Error("the same seed drew different workloads")
	}
	cfg.seed = 2
	c, _ := cfg.workload()
	if slices.Equal(a, c) {
		t.Error("seeds 1 and 2 drew the same workload")
	}
}

func TestRunDemoExitStatus(t *testing.T) {
	var out, errs bytes.Buffer
	cfg := smallConfig()
	cfg.events = 20
	cfg.crash = 0
	if got := runDemo(cfg, "", &out, &errs); got != 0 {
		t.Fatalf("exit status %d, want 0; stderr: %s", got, errs.String())
	}
	for _, want := range []string{"idem.Do", "plain handler", "applied twice or more"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	for flag, bad := range map[string]func(*config){
		"-dup":      func(c *config) { c.dup = 1.5 },
		"-events":   func(c *config) { c.events = 0 },
		"-lease":    func(c *config) { c.lease = time.Millisecond },
		"-min-idle": func(c *config) { c.minIdle = 0 },
	} {
		c := cfg
		bad(&c)
		out.Reset()
		errs.Reset()
		if got := runDemo(c, "", &out, &errs); got != 2 {
			t.Errorf("%s: exit status %d, want 2", flag, got)
		}
		if !strings.Contains(errs.String(), flag+" ") {
			t.Errorf("%s: stderr %q does not name the flag", flag, errs.String())
		}
	}
}

// newTestClient returns a go-redis client for addr, closed when the test
// ends.
func newTestClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
