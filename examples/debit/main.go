// Command debit shows what idem.Do buys a payment service whose clients
// retry, next to the classic check-then-set that it replaces.
//
// A client makes payments through a flaky network: the network loses some
// replies, some debits are slower than the client's timeout, and the bank
// now and then refuses a debit. The client cannot tell a lost reply from a
// slow one, so it retries the payment with the same key; a load balancer
// sends each attempt to one of two service instances, each with its own
// Redis connection and idem.Client, as two processes would have. The
// workload runs once with idem.Do and once with check-then-set (GET the key;
// if absent, debit, then SET it), and an in-memory bank counts the debits of
// every payment.
//
// Usage:
//
//	go run ./examples/debit [-payments 200] [-loss 0.3] [-slow 0.2] [-bankerr 0.05]
//		[-seed 1] [-lb random|alternate] [-clients 4] [-redis ADDR]
//
// Without -redis it runs on an embedded miniredis. With one, it writes only
// keys under a prefix unique to the run and deletes them at the end. It
// exits with status 1 if idem.Do debited a payment twice, or confirmed one
// it never debited, so it doubles as a smoke test.
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
	flag.Float64Var(&cfg.bankErr, "bankerr", cfg.bankErr, "share of debits the bank refuses with a transient error, 0 to 1")
	flag.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of the network's, the bank's and the balancer's choices")
	flag.StringVar(&cfg.balance, "lb", cfg.balance, "how the load balancer picks an instance: random or alternate")
	flag.IntVar(&cfg.clients, "clients", cfg.clients, "payments in flight at once")
	addr := flag.String("redis", "", "address of a Redis server to use instead of an embedded miniredis")
	flag.Parse()

	os.Exit(runDemo(cfg, *addr, os.Stdout, os.Stderr))
}

// runDemo runs the demo and returns the exit status: 0 on success, 1 if
// idem.Do failed to debit exactly once, 2 if the demo could not run. It
// returns rather than exits so that deferred cleanup runs.
func runDemo(cfg config, addr string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := compare(ctx, cfg, addr)
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
	fmt.Fprintf(w, "payments: %d, replies lost: %s, slow debits: %s (%v against a client timeout of %v), bank errors: %s, seed: %d\n",
		c.payments, percent(c.loss), percent(c.slow), c.slowDebit, c.timeout, percent(c.bankErr), c.seed)

	const row = "%-16s%8v%23v%15v%16v\n"
	fmt.Fprintf(w, row, "", "debits", "debited twice or more", "never debited", "client retries")
	for _, x := range []struct {
		name string
		res  result
	}{{"idem.Do", r.idem}, {"check-then-set", r.naive}} {
		fmt.Fprintf(w, row, x.name, x.res.debits, x.res.twice, x.res.notDebited, x.res.retries)
	}
	fmt.Fprintln(w, "Why: under check-then-set, a retry that arrives while the first debit still runs finds no key and debits again;")
	fmt.Fprintln(w, "idem.Do makes it wait for the first attempt's receipt (hence its extra retries: the wait can outlast the client's timeout).")
	if n := r.idem.takeovers; n > 0 {
		fmt.Fprintf(w, "idem.Do: %d payments ran fn again as attempt 2 or later (AttemptFrom) after the bank refused an attempt; still one debit each.\n", n)
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
