// Command orders runs an order service and a payment service end to end,
// as processes that it kills with SIGKILL at random points, and counts
// that every paid order was charged exactly once and every event applied
// once, in order.
//
// The processes (this program run again) are:
//
//   - the order service: POST /orders places an order, POST
//     /orders/{id}/pay pays it, both behind httpidem with a required
//     Idempotency-Key. The handler writes the order's row and publishes
//     its event (idemsql.Publish, "placed" as the order's version 1,
//     "paid" as its version 2) in one SQLite transaction, in which it
//     also commits its answer through the ledger (idemsql.Commit): the
//     change, the event and the answer commit together or not at all;
//   - the relay (Ledger.Relay), which moves the outbox's rows to a Redis
//     Stream; it is killed between its XADDs and the DELETE of their rows,
//     so that its successor relays them again, under the same ids;
//   - payment consumers (idemstream and the ledger, in a database of
//     their own): each event's key is its id, so an event relayed twice is
//     applied once; AdvanceInOrder keeps each order's events in version
//     order, holding back a paid event whose placed event is not applied
//     yet; the charge is an idem.Step whose key (idem.StepKey, sent by
//     httpidem.NewTransport) the provider deduplicates by;
//   - a fake payment provider, which charges once per Idempotency-Key.
//
// A client places the orders and pays most of them, retrying each request
// with its key until it has an answer. The order service, the relay, the
// consumers and the provider are killed in turn, and started again.
//
// Usage (from the examples directory, a module of its own):
//
//	go run ./orders [-orders 200] [-paid 0.8] [-consumers 2] [-kills 12]
//		[-lease 1s] [-seed 1] [-timeout 2m] [-redis ADDR]
//
// Without -redis it runs on an embedded miniredis. With one, it writes only
// keys under a prefix unique to the run and deletes them at the end. The
// databases are SQLite files in a temporary directory. It exits with
// status 1 if an order was charged twice, a paid order not charged once, or
// an event applied twice, never, or out of order: it doubles as a smoke
// test. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"text/tabwriter"
)

// main parses the flags, runs the demo and exits with its status; run as
// one of the demo's processes (childEnv set), it plays its role.
func main() {
	if s, ok := os.LookupEnv(childEnv); ok {
		os.Exit(childMain(s))
	}
	cfg := defaultConfig()
	flag.IntVar(&cfg.orders, "orders", cfg.orders, "orders the client places")
	flag.Float64Var(&cfg.paid, "paid", cfg.paid, "share of the orders the client pays, 0 to 1")
	flag.IntVar(&cfg.consumers, "consumers", cfg.consumers, "payment consumer processes")
	flag.IntVar(&cfg.kills, "kills", cfg.kills, "processes killed with SIGKILL (and started again), each role in turn")
	flag.DurationVar(&cfg.lease, "lease", cfg.lease, "idem's lease: how long a killed process's claim holds a key")
	flag.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of the orders, the payments and the kills")
	flag.DurationVar(&cfg.timeout, "timeout", cfg.timeout, "how long the run may take")
	addr := flag.String("redis", "", "address of a Redis server to use instead of an embedded miniredis")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "orders: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "orders: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, cfg, *addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "orders: %v\n", err)
		os.Exit(1)
	}
	rep.print(os.Stdout)
	if !rep.ok() {
		os.Exit(1)
	}
}

// print writes the report as a table.
func (r report) print(w io.Writer) {
	fmt.Fprintf(w, "orders: %d placed, %d paid; %d payment consumers; lease %v; seed %d\n", r.orders, r.paid, r.cfg.consumers, r.cfg.lease, r.cfg.seed)
	fmt.Fprintf(w, "killed: order service %d, relay %d, payment consumers %d, provider %d\n",
		r.kills[roleOrders], r.kills[roleRelay], r.kills[rolePayments], r.kills[roleProvider])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, v any) { fmt.Fprintf(tw, "%s\t%v\n", name, v) }
	row("events published (outbox)", r.published)
	row("stream entries", r.entries)
	row("events relayed twice", r.relayedTwice)
	row("events applied", r.applied)
	row("applied twice", r.appliedTwice)
	row("never applied", r.neverApplied)
	row("orders applied out of order", r.outOfOrder)
	row("out of order, held back (ErrGap)", r.held)
	row("stale (ErrStale)", r.stale)
	row("provider charges", r.charges)
	row("provider requests replayed by key", r.replayed)
	row("orders charged twice", r.doubleCharged)
	row("paid orders not charged once", r.wrongCharges)
	row("dead letters", r.deadLetters)
	row("pending", r.pending)
	_ = tw.Flush()
	if r.ok() {
		fmt.Fprintln(w, "ok: every paid order charged exactly once, every event applied once and in order")
	} else {
		fmt.Fprintln(w, "FAILED: see the counts above")
	}
}
