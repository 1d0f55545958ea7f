// Command debit shows what idem.Do with a ledger buys a payment service
// whose clients retry, next to the classic check-then-set that it replaces.
//
// A client makes payments through a flaky network: the network loses some
// replies, some payments are slower than the client's timeout, the card
// network now and then refuses one, and Redis now and then loses the
// record of a payment already answered (a restart without persistence, a
// failover). The client cannot tell a lost reply from a slow one, so it
// retries the payment with the same key; a load balancer sends each
// attempt to one of two service instances, each with its own Redis
// connection and idem.Client, as two processes would have. The workload
// runs once with idem.Do and once with check-then-set (GET the key; if
// absent, debit, then SET it), and the service's database counts the
// debits of every payment.
//
// With idem.Do, each debit commits in one transaction with its receipt,
// through the ledger (idempgx.Commit in a native pgx transaction on
// PostgreSQL, idemsql.Commit on SQLite): a retry that finds no record in
// Redis runs fn again, its commit meets the receipt already in the
// ledger, rolls back, and returns that receipt. fn has no reconcile code.
//
// Usage (from the examples directory, a module of its own):
//
//	go run ./debit [-payments 200] [-loss 0.3] [-slow 0.2] [-bankerr 0.05] [-lose 0.2]
//		[-seed 1] [-lb random|alternate] [-clients 4] [-redis ADDR] [-postgres DSN]
//
// Without -redis it runs on an embedded miniredis; with one, it writes only
// keys under a prefix unique to the run and deletes them at the end.
// Without -postgres the database is a SQLite file in a temporary directory,
// removed at the end; with one (postgres://user@host/db), its tables are
// created under a prefix unique to the run and dropped at the end. It exits
// with status 1 if idem.Do debited a payment twice, or confirmed one it
// never debited, so it doubles as a smoke test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

// main parses the flags, runs the demo and exits with its status.
func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.payments, "payments", cfg.payments, "logical payments to make, each with its own idempotency key")
	flag.Float64Var(&cfg.loss, "loss", cfg.loss, "share of replies the network loses, 0 to 1")
	flag.Float64Var(&cfg.slow, "slow", cfg.slow, "share of debits slower than the client's timeout, 0 to 1")
	flag.Float64Var(&cfg.bankErr, "bankerr", cfg.bankErr, "share of payments the card network refuses with a transient error, 0 to 1")
	flag.Float64Var(&cfg.lose, "lose", cfg.lose, "share of answered payments whose record Redis then loses, 0 to 1")
	flag.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of the network's, the bank's and the balancer's choices")
	flag.StringVar(&cfg.balance, "lb", cfg.balance, "how the load balancer picks an instance: random or alternate")
	flag.IntVar(&cfg.clients, "clients", cfg.clients, "payments in flight at once")
	addr := flag.String("redis", "", "address of a Redis server to use instead of an embedded miniredis")
	dsn := flag.String("postgres", "", "URL of a PostgreSQL database to use instead of a temporary SQLite file")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "debit: unexpected argument %q\n", flag.Arg(0))
		flag.Usage()
		os.Exit(2)
	}

	os.Exit(runDemo(cfg, *addr, *dsn, os.Stdout, os.Stderr))
}

// runDemo runs the demo and returns the exit status: 0 on success, 1 if
// idem.Do failed to debit exactly once, 2 if the demo could not run. It
// returns rather than exits so that deferred cleanup runs.
func runDemo(cfg config, addr, dsn string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := compare(ctx, cfg, addr, dsn)
	if err != nil {
		fmt.Fprintln(stderr, "debit:", err)
		return 2
	}
	rep.print(stdout)
	if !rep.idem.exactlyOnce() {
		fmt.Fprintln(stderr, "debit: FAIL: idem.Do did not debit every payment exactly once")
		return 1
	}
	return 0
}

// print writes the summary table and what it means.
func (r report) print(w io.Writer) {
	c := r.cfg
	fmt.Fprintf(w, "payments: %d, replies lost: %s, slow payments: %s (%v against a client timeout of %v), card network errors: %s, records Redis loses: %s, seed: %d\n",
		c.payments, percent(c.loss), percent(c.slow), c.slowDebit, c.timeout, percent(c.bankErr), percent(c.lose), c.seed)

	const row = "%-16s%8v%23v%15v%16v\n"
	fmt.Fprintf(w, row, "", "debits", "debited twice or more", "never debited", "client retries")
	for _, x := range []struct {
		name string
		res  result
	}{{"idem.Do", r.idem}, {"check-then-set", r.naive}} {
		fmt.Fprintf(w, row, x.name, x.res.debits, x.res.twice, x.res.notDebited, x.res.retries)
	}
	fmt.Fprintln(w, "Why: under check-then-set, a retry that arrives while the first debit still runs, or after Redis lost its record, finds no key and debits again;")
	fmt.Fprintln(w, "idem.Do makes it wait for the first attempt's receipt (hence its extra retries: the wait can outlast the client's timeout),")
	fmt.Fprintln(w, "and the ledger, in the debit's own transaction, keeps the debit once when Redis has forgotten it.")
	if n := r.idem.lost; n > 0 {
		fmt.Fprintf(w, "idem.Do: Redis lost %d records; %d payments ran fn again, whose commit met the receipt in the ledger and rolled back.\n", n, r.idem.fromLedger)
	}
	if n := r.idem.takeovers; n > 0 {
		fmt.Fprintf(w, "idem.Do: %d payments ran fn again as attempt 2 or later after the card network refused an attempt; still one debit each.\n", n)
	}
	for _, row := range []struct {
		name string
		res  result
	}{{"idem.Do", r.idem}, {"check-then-set", r.naive}} {
		if n := row.res.unconfirmed; n > 0 {
			fmt.Fprintf(w, "%s: the client gave up on %d payments after %d attempts without a reply.\n", row.name, n, c.maxAttempts)
		}
		if n := row.res.silentLoss; n > 0 {
			fmt.Fprintf(w, "%s: %d payments were confirmed to the client but never debited.\n", row.name, n)
		}
		if n := row.res.unexpected; n > 0 {
			fmt.Fprintf(w, "%s: %d unexpected errors; the first: %v\n", row.name, n, row.res.firstErr)
		}
	}
}

// percent formats a share as a whole percentage, or with decimals when it
// has them.
func percent(share float64) string {
	s := fmt.Sprintf("%.2f", share*100)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "%"
}
