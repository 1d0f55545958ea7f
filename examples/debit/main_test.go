package main

import (
	"bytes"
	"context"
	"database/sql"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every handler, idem.Client and Redis connection must be gone when run
	// returns.
	goleak.VerifyTestMain(m)
}

// smallConfig is the default workload, shrunk to keep the race detector
// fast; the seed stays fixed, so the fates stay the same from run to run.
func smallConfig() config {
	cfg := defaultConfig()
	cfg.payments = 30
	if raceEnabled {
		// The same fates, at a tenth of the speed: a debit under the
		// race detector takes longer than the client's 10ms timeout.
		cfg.timeout *= 10
		cfg.fastDebit *= 10
		cfg.slowDebit *= 10
	}
	return cfg
}

func TestIdemDebitsExactlyOnce(t *testing.T) {
	cfg := smallConfig()
	rep, err := compare(context.Background(), cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got := rep.idem
	if got.debits != cfg.payments {
		t.Errorf("idem.Do made %d debits for %d payments, want %d", got.debits, cfg.payments, cfg.payments)
	}
	if got.twice != 0 {
		t.Errorf("idem.Do debited %d payments twice or more, want 0", got.twice)
	}
	if got.notDebited != 0 || got.unconfirmed != 0 {
		t.Errorf("idem.Do left %d payments undebited and %d unconfirmed, want 0 and 0", got.notDebited, got.unconfirmed)
	}
	if got.unexpected != 0 {
		t.Errorf("idem.Do returned %d unexpected errors, the first: %v", got.unexpected, got.firstErr)
	}
	if got.retries == 0 {
		t.Errorf("the client made no retries: the workload exercises nothing")
	}
}

func TestCheckThenSetDebitsTwice(t *testing.T) {
	// The race is made reliable rather than lucky: each slow debit (25ms)
	// outlasts the client's timeout (10ms) by far, so the retry's GET comes
	// long before the first attempt's SET, and the seed fixes which
	// payments get a slow first debit.
	cfg := smallConfig()
	rep, err := compare(context.Background(), cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if rep.naive.twice == 0 {
		t.Errorf("check-then-set debited no payment twice (%+v), want some", rep.naive)
	}
	if rep.naive.debits <= cfg.payments {
		t.Errorf("check-then-set made %d debits for %d payments, want more", rep.naive.debits, cfg.payments)
	}
}

func TestNoRetriesNoDuplicates(t *testing.T) {
	// Without lost replies, slow debits or bank errors the client never
	// retries, and even check-then-set debits once: the duplicates come
	// from retries alone.
	cfg := smallConfig()
	cfg.loss, cfg.slow, cfg.bankErr, cfg.lose = 0, 0, 0, 0
	cfg.timeout = time.Minute // no reply is lost, so none may be late either
	rep, err := compare(context.Background(), cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []result{rep.idem, rep.naive} {
		if r.debits != cfg.payments || r.twice != 0 || r.retries != 0 {
			t.Errorf("got %+v, want %d debits, none twice, no retries", r, cfg.payments)
		}
	}
}

func TestTakeoverAfterBankRefusal(t *testing.T) {
	// With no lost or late replies the client waits for each reply, so a
	// payment's attempts never overlap: when the bank refuses an attempt,
	// the next one runs fn again, as attempt 2. That happens exactly for
	// the payments whose first attempt the seed gives a refusal.
	cfg := smallConfig()
	cfg.loss, cfg.slow, cfg.bankErr, cfg.lose = 0, 0, 0.2, 0
	cfg.timeout = time.Minute
	want := 0
	for i := range cfg.payments {
		if cfg.fate(mrand.New(mrand.NewPCG(cfg.seed, uint64(i))), i, 0).bankDown {
			want++
		}
	}
	if want == 0 {
		t.Fatal("the seed refuses no first attempt; choose another")
	}
	rep, err := compare(context.Background(), cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.idem.takeovers; got != want {
		t.Errorf("idem.Do ran fn as attempt 2 or later for %d payments, want %d", got, want)
	}
	for _, r := range []result{rep.idem, rep.naive} {
		if r.debits != cfg.payments || r.twice != 0 {
			t.Errorf("got %+v, want %d debits and none twice", r, cfg.payments)
		}
	}
}

// Redis loses the record of every answered payment, and many replies are
// lost: every retry finds nothing in Redis. Check-then-set debits those
// payments again; idem.Do runs fn again, whose commit meets the receipt in
// the ledger and rolls back, so every payment is still debited once.
func TestLedgerKeepsDebitsOnceWhenRedisLosesRecords(t *testing.T) {
	cfg := smallConfig()
	cfg.lose, cfg.loss, cfg.slow, cfg.bankErr = 1, 0.5, 0, 0
	rep, err := compare(context.Background(), cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got := rep.idem
	if got.debits != cfg.payments || got.twice != 0 || got.unexpected != 0 {
		t.Errorf("idem.Do: %+v (first unexpected error: %v); want %d debits, none twice, no unexpected error", got, got.firstErr, cfg.payments)
	}
	if got.lost == 0 || got.fromLedger == 0 {
		t.Errorf("idem.Do: Redis lost %d records and %d payments met the ledger's receipt; want some of each", got.lost, got.fromLedger)
	}
	if rep.naive.twice == 0 {
		t.Errorf("check-then-set debited no payment twice (%+v), want some", rep.naive)
	}
}

// With -postgres, the demo runs on PostgreSQL: set IDEM_EXAMPLES_POSTGRES
// to the URL of a database it may create tables in (and drops them after).
func TestPostgres(t *testing.T) {
	dsn := os.Getenv("IDEM_EXAMPLES_POSTGRES")
	if dsn == "" {
		t.Skip("IDEM_EXAMPLES_POSTGRES is not set: the -postgres path is not run")
	}
	cfg := smallConfig()
	var out, errs bytes.Buffer
	if got := runDemo(cfg, "", dsn, &out, &errs); got != 0 {
		t.Fatalf("exit status %d, want 0; stderr: %s", got, errs.String())
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'debit_example_%'").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d tables of the demo left (%v), want 0", n, err)
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
	cfg.payments = 10
	if _, err := compare(context.Background(), cfg, m.Addr(), ""); err != nil {
		t.Fatal(err)
	}
	if got, want := m.Keys(), []string{"someone-else:key"}; !slices.Equal(got, want) {
		t.Errorf("keys after the run: got %q, want %q", got, want)
	}
}

func TestFatesFollowTheSeed(t *testing.T) {
	cfg := defaultConfig()
	draw := func(seed uint64) []fate {
		rng := mrand.New(mrand.NewPCG(seed, 7))
		var fs []fate
		for n := range 20 {
			fs = append(fs, cfg.fate(rng, 7, n))
		}
		return fs
	}
	if !slices.Equal(draw(1), draw(1)) {
		t.Error("the same seed drew different fates")
	}
	if slices.Equal(draw(1), draw(2)) {
		t.Error("seeds 1 and 2 drew the same fates")
	}
}

func TestRunDemoExitStatus(t *testing.T) {
	var out, errs bytes.Buffer
	cfg := smallConfig()
	cfg.payments = 10
	if got := runDemo(cfg, "", "", &out, &errs); got != 0 {
		t.Fatalf("exit status %d, want 0; stderr: %s", got, errs.String())
	}
	for _, want := range []string{"idem.Do", "check-then-set", "debited twice or more"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	cfg.loss = 1.5
	out.Reset()
	errs.Reset()
	if got := runDemo(cfg, "", "", &out, &errs); got != 2 {
		t.Errorf("-loss 1.5: exit status %d, want 2", got)
	}
	if !strings.Contains(errs.String(), "-loss") {
		t.Errorf("-loss 1.5: stderr %q does not name the flag", errs.String())
	}
}
