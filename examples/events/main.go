// Command events shows a Redis Streams consumer group that applies every
// event exactly once, though the producer sends some events twice and
// consumer processes are killed with SIGKILL as they work, next to a
// plain handler that applies some twice.
//
// A producer sends events ("credit 42 to acct-3", each with a stable
// business id) to a stream, a few of them twice, as a producer that lost
// the reply to an XADD would. Consumer processes (this program run
// again) read the stream with idemstream: each event's id is its
// idempotency key, and the handler credits the account in SQLite and
// records the outcome in the same transaction (idemsql.Commit). Consumers
// are killed with SIGKILL right after committing some events, before
// idem recorded them in Redis or acknowledged them, and started again;
// the entries they held are taken back by the restarted consumer or taken
// over by the others. The handler has no reconcile code: a takeover finds
// the committed outcome in the ledger and does not apply the event again.
// The same workload then runs with a plain handler (commit, then XACK),
// whose credits show the double applications.
//
// Usage (from the examples directory, a module of its own):
//
//	go run ./events [-events 300] [-dup 0.1] [-consumers 3] [-kills 6]
//		[-lease 1s] [-work 2ms] [-seed 1] [-timeout 2m] [-redis ADDR]
//
// Without -redis it runs on an embedded miniredis. With one, it writes only
// keys under a prefix unique to the run and deletes them at the end. The
// databases are SQLite files in a temporary directory. It exits with
// status 1 if the idemstream consumers applied an event twice or never,
// so it doubles as a smoke test.
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
// a consumer process (childEnv set), it consumes.
func main() {
	if s, ok := os.LookupEnv(childEnv); ok {
		os.Exit(consumerMain(s))
	}
	cfg := defaultConfig()
	flag.IntVar(&cfg.events, "events", cfg.events, "distinct events the producer sends")
	flag.Float64Var(&cfg.dup, "dup", cfg.dup, "share of events the producer sends twice, 0 to 1")
	flag.IntVar(&cfg.consumers, "consumers", cfg.consumers, "consumer processes at once")
	flag.IntVar(&cfg.kills, "kills", cfg.kills, "consumer processes killed with SIGKILL (and started again), for each handler")
	flag.DurationVar(&cfg.lease, "lease", cfg.lease, "idem's lease: how long a killed consumer's claim holds an event")
	flag.DurationVar(&cfg.work, "work", cfg.work, "how long applying an event takes, besides SQLite")
	flag.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of the events, the duplicates and the kills")
	flag.DurationVar(&cfg.timeout, "timeout", cfg.timeout, "how long each handler's run may take to have every entry acknowledged")
	addr := flag.String("redis", "", "address of a Redis server to use instead of an embedded miniredis")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "events: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "events: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, cfg, *addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "events: %v\n", err)
		os.Exit(1)
	}
	rep.print(os.Stdout)
	if !rep.idem.exactlyOnce() {
		os.Exit(1)
	}
}

// print writes the report as a table.
func (r report) print(w io.Writer) {
	fmt.Fprintf(w, "events: %d, sent twice by the producer: %d (%d stream entries); %d consumer processes; lease %v; seed %d\n",
		r.cfg.events, r.dups, r.entries, r.cfg.consumers, r.cfg.lease, r.cfg.seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tapplications\tapplied twice or more\tnever applied\twrong balances\tkilled\tfound in the ledger\tdead letters\tpending")
	fmt.Fprintf(tw, "idemstream + ledger\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.idem.applications, r.idem.twice, r.idem.never,
		r.idem.badBalances, r.idem.kills, r.idem.found, r.idem.deadLetters, r.idem.pending)
	fmt.Fprintf(tw, "plain handler\t%d\t%d\t%d\t%d\t%d\t-\t-\t%d\n", r.plain.applications, r.plain.twice, r.plain.never,
		r.plain.badBalances, r.plain.kills, r.plain.pending)
	_ = tw.Flush()
}
