package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
)

// main runs the command until it is done or interrupted (Ctrl-C).
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // a run failed
	exitUsage = 2 // bad flags or a bad trace
)

// run is the command, with its arguments and outputs given, for tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\nRun 'ttlbench -h' for usage.\n", err)
		return exitUsage
	}
	plan, err := cfg.plan()
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\n", err)
		return exitUsage
	}

	var done atomic.Int64
	cfg.opts.Progress = &done
	stopProgress := startProgress(stderr, &done, int64(len(plan.Events)*len(cfg.opts.Policies)))
	results, err := Simulate(ctx, plan, cfg.opts)
	stopProgress()
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\n", err)
		return exitFail
	}

	rep := NewReport(plan, results, cfg.opts, cfg.target)
	if cfg.svg != "" {
		if err := writeFileAtomic(cfg.svg, rep.SVG()); err != nil {
			fmt.Fprintf(stderr, "ttlbench: -svg: %v\n", err)
			return exitFail
		}
	}
	if cfg.json {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\n", err)
		return exitFail
	}
	return exitOK
}

// usage prints the help: what ttlbench does, then the flags.
func usage(w io.Writer) {
	fmt.Fprint(w, usageText)
	fs := newFlagSet(&config{})
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// usageText is the help before the flags; doc.go says the same at length.
const usageText = `Usage: ttlbench [flags]

ttlbench helps choose idem's retention (WithRetention): how long the record
of a finished operation is kept. Too short, and a late retry runs the side
effect a second time; too long, and Redis memory grows. ttlbench replays
traffic through the real library (idem.New, Client.Do) once per retention,
on an embedded miniredis with a virtual clock (days of traffic in seconds)
or on a real Redis (-redis). For each retention it reports the retries, the
duplicate executions of fn (counted from a ledger fn writes to), the
duplicate rate (duplicates per operation), and the peak number and bytes of
live records; then it recommends the shortest retention whose duplicate
rate is at most -target.

Traffic, modelled: -ops operations arrive at -rate per second (Poisson),
each with a random UUID as its key. An attempt times out at the client with
probability -timeout-share (the operation completes on the server all the
same), and the client retries, up to -retries times, pausing
min(-retry-cap, -retry-base * -retry-factor^(n-1)) +/- -retry-jitter before
retry n. A share -late-share of operations is delivered once more, late,
after a lognormal delay from the first attempt with median -late-median and
99th percentile -late-p99. -seed fixes every random draw.

Traffic, recorded (-trace FILE): CSV lines key,unix_ms[,fingerprint], one
per request, in any order. unix_ms is the request's time in milliseconds
since 1970; the optional fingerprint stands for the request's parameters (a
key reused with another fingerprint gets ErrConflict, counted in -json).
The first request with a key is the operation, later ones its retries.
Lines starting with # and blank lines are skipped, as is a header line
"key,unix_ms,...". Quote a key that holds a comma or a quote, as in CSV.

Peak bytes: with miniredis, the key name, field names and values of every
live record, summed: the data, without Redis's own overhead, which Redis 7
puts at about 80 bytes a finished record (a record with a UUID key and a
100-byte result takes 264 bytes by MEMORY USAGE: 45 of key, 138 of value). With
-redis, MEMORY USAGE of each record, taken after each write. Records change
only at requests and expiries, so both peaks are exact, not sampled. Memory
at steady state grows with -rate: scale it.

With -redis ADDR, time runs -time-scale times faster than the traffic's:
retentions, the lease and the pauses between requests are divided by it,
and ttlbench sleeps in real time; a scale that leaves the lease under 250ms
of real time is refused (a shorter lease can end under a busy machine
before its owner records the outcome). Its keys get a prefix of their own,
ttlbench-<random>-<n>:, and only those are deleted at the end (SCAN MATCH,
never FLUSHDB).

Durations take the units ms, s, m, h and d (days): 90s, 1h30m, 7d.
Exit status: 0 done, 1 a run failed, 2 bad flags or a bad trace.

Flags:
`
