// Command events shows a Redis Streams consumer group that applies every
// event exactly once, though the producer sends some events twice and
// consumers die mid-handler, next to the plain handler that applies twice.
//
// A producer sends events ("credit 42 to acct-3", each with a stable
// business id) to a stream; a few it sends twice, as a producer that lost
// the reply to an XADD and retried would. A consumer group reads the stream
// (XREADGROUP); each consumer, with a Redis connection and an idem.Client
// of its own as a separate process would have, applies each event through
// idem.Do, with the event's id as the idempotency key and a fingerprint of
// its parameters, and acknowledges the entry (XACK) only after Do returned.
// Some consumers die right after applying an event, before Do recorded the
// outcome and before the acknowledgement, as a kill -9 would leave them;
// their unacknowledged entries go to another consumer once they have been
// idle for -min-idle (XAUTOCLAIM), and a new consumer takes the dead one's
// place. The handler uses the attempt number from idem.AttemptFrom: an
// attempt after the first looks the event up in the ledger before applying
// it, because the dead attempt may have applied it.
//
// The ledger, in Redis beside the stream, counts how often each event was
// applied. The same workload then runs with the plain handler (apply, then
// acknowledge, no idem), whose ledger shows the double applications that
// duplicates and redeliveries cause.
//
// Usage:
//
//	go run ./examples/events [-events 200] [-dup 0.1] [-crash 0.05] [-consumers 3]
//		[-batch 10] [-lease 1s] [-min-idle 1s] [-seed 1] [-timeout 2m] [-redis ADDR]
//
// Without -redis it runs on an embedded miniredis. With one, it writes only
// keys under a prefix unique to the run and deletes them at the end. It
// exits with status 1 if idem.Do applied an event twice or never, so it
// doubles as a smoke test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// main parses the flags, runs the demo and exits with its status.
func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.events, "events", cfg.events, "distinct events the producer sends")
	flag.Float64Var(&cfg.dup, "dup", cfg.dup, "share of events the producer sends twice, 0 to 1")
	flag.Float64Var(&cfg.crash, "crash", cfg.crash, "share of events whose first handling kills its consumer right after applying, 0 to 1")
	flag.IntVar(&cfg.consumers, "consumers", cfg.consumers, "consumers in the group at once")
	flag.IntVar(&cfg.batch, "batch", cfg.batch, "entries a consumer reads at once")
	flag.DurationVar(&cfg.lease, "lease", cfg.lease, "idem's lease: how long a dead consumer's claim holds an event")
	flag.DurationVar(&cfg.minIdle, "min-idle", cfg.minIdle, "how long an entry stays unacknowledged before another consumer takes it over")
	flag.Uint64Var(&cfg.seed, "seed", cfg.seed, "seed of the events, the duplicates and the crashes")
	flag.DurationVar(&cfg.timeout, "timeout", cfg.timeout, "how long each handler's run may take to have every entry acknowledged")
	addr := flag.String("redis", "", "address of a Redis server to use instead of an embedded miniredis")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `Usage: go run ./examples/events [flags]

A producer sends events to a Redis stream, some of them twice; a consumer group
applies them to a ledger through idem.Do, with each event's id as the key, and
acknowledges an entry only after Do returned. Some consumers die right after
applying an event; their entries go to another consumer (XAUTOCLAIM). The same
run with a plain handler (apply, then acknowledge) shows the double
applications that idem.Do prevents. Exit status 1 if idem.Do applied an event
twice or never, 2 if the demo could not run.

`)
		flag.PrintDefaults()
	}
	flag.Parse()

	os.Exit(runDemo(cfg, *addr, os.Stdout, os.Stderr))
}

// runDemo runs the demo and returns the exit status: 0 on success, 1 if
// idem.Do failed to apply every event exactly once, 2 if the demo could not
// run. It returns rather than exits so that deferred cleanup runs.
func runDemo(cfg config, addr string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := compare(ctx, cfg, addr)
	if err != nil {
		fmt.Fprintln(stderr, "events:", err)
		return 2
	}
	rep.print(stdout)
	if !rep.idem.exactlyOnce() {
		fmt.Fprintln(stderr, "events: FAIL: idem.Do did not apply every event exactly once")
		return 1
	}
	return 0
}

// print writes the summary table and what it means.
func (r report) print(w io.Writer) {
	c, x := r.cfg, r.idem
	fmt.Fprintf(w, "events: %d, sent twice by the producer: %d (%d stream entries); consumers: %d; lease %v, taken over after %v idle; seed %d\n",
		x.events, x.entries-x.events, x.entries, c.consumers, c.lease, c.minIdle, c.seed)

	const row = "%-14s%13v%23v%15v%16v%21v\n"
	fmt.Fprintf(w, row, "", "applications", "applied twice or more", "never applied", "consumers died", "entries taken over")
	for _, x := range []struct {
		name string
		res  result
	}{{"idem.Do", r.idem}, {"plain handler", r.plain}} {
		fmt.Fprintf(w, row, x.name, x.res.applications, x.res.twice, x.res.never, x.res.deaths, x.res.reclaimed)
	}
	fmt.Fprintln(w, "Why: the plain handler applies, then acknowledges: it applies a duplicate entry again, and an entry")
	fmt.Fprintln(w, "redelivered after its consumer died between the two. idem.Do replays the outcome of an applied event.")
	if n := r.idem.reconciled; n > 0 {
		fmt.Fprintf(w, "idem.Do: %d events were taken over as attempt 2 or later after their consumer died; each looked itself up\n", n)
		fmt.Fprintln(w, "  in the ledger (AttemptFrom) and found it applied, so it was applied once all the same.")
	}
	for _, x := range []struct {
		name string
		res  result
	}{{"idem.Do", r.idem}, {"plain handler", r.plain}} {
		if n := x.res.badBalances; n > 0 {
			fmt.Fprintf(w, "%s: %d accounts have a balance other than the sum of their events.\n", x.name, n)
		}
		if n := x.res.rejected; n > 0 {
			fmt.Fprintf(w, "%s: %d entries were acknowledged without being applied (malformed or conflicting).\n", x.name, n)
		}
	}
}
