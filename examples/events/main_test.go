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
		// A consumer process of a test's run: the test binary run again.
		os.Exit(consumerMain(s))
	}
	goleak.VerifyTestMain(m)
}

// TestConsumersKilled is row 40 of docs/faults.md with the ledger: on a
// real redis-server, consumer processes are killed with SIGKILL right
// after committing events, eight times, and started again; with
// idemstream and the ledger on SQLite every event is applied exactly once
// (its credit row written once, every balance right), nothing is left
// pending or dead-lettered, and the handler has no reconcile code.
func TestConsumersKilled(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	cfg := defaultConfig()
	cfg.events, cfg.kills, cfg.timeout = 400, 8, 3*time.Minute
	rep, err := run(context.Background(), cfg, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.print(&out)
	t.Log("\n" + out.String())
	got := rep.idem
	if !got.exactlyOnce() || got.applications != cfg.events {
		t.Errorf("idemstream + ledger: %+v; want every event applied once, nothing pending or dead-lettered", got)
	}
	if got.kills != cfg.kills {
		t.Errorf("idemstream + ledger: %d consumers killed, want %d", got.kills, cfg.kills)
	}
	if rep.plain.never != 0 || rep.plain.pending != 0 {
		t.Errorf("plain handler: %+v; want no event lost", rep.plain)
	}
	if rep.dups == 0 || rep.plain.twice < rep.dups*9/10 {
		t.Errorf("plain handler: %d events applied twice, for %d producer duplicates; the comparison shows nothing", rep.plain.twice, rep.dups)
	}
}

// TestDefaultRun is `go run ./events` with fewer events: on the
// embedded miniredis, every event once.
func TestDefaultRun(t *testing.T) {
	cfg := defaultConfig()
	cfg.events, cfg.kills = 100, 3
	rep, err := run(context.Background(), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.idem.exactlyOnce() || rep.idem.applications != cfg.events {
		var out bytes.Buffer
		rep.print(&out)
		t.Errorf("idemstream + ledger on miniredis: not every event once:\n%s", out.String())
	}
}

// TestBadSettings: settings out of range are refused, naming their flag.
func TestBadSettings(t *testing.T) {
	for flag, change := range map[string]func(*config){
		"-events":    func(c *config) { c.events = 0 },
		"-dup":       func(c *config) { c.dup = 1.5 },
		"-consumers": func(c *config) { c.consumers = 0 },
		"-kills":     func(c *config) { c.kills = -1 },
		"-lease":     func(c *config) { c.lease = time.Millisecond },
		"-work":      func(c *config) { c.work = -time.Second },
		"-timeout":   func(c *config) { c.timeout = 0 },
	} {
		cfg := defaultConfig()
		change(&cfg)
		if _, err := run(context.Background(), cfg, ""); err == nil || !strings.HasPrefix(err.Error(), flag+" ") {
			t.Errorf("%s out of range: %v, want an error naming it", flag, err)
		}
	}
}
