package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// main runs the command until it is done or interrupted (Ctrl-C).
func main() {
	if os.Getenv("GOMEMLIMIT") == "" {
		// A big trace's plan is a few hundred MB that live to the end, and
		// its slices hold no pointers, which makes collections cheap: let
		// the collector run when the heap nears 700 MiB rather than when it
		// doubles, which would take ten million requests past 1 GiB.
		debug.SetMemoryLimit(700 << 20)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // a run failed
	exitUsage = 2 // bad flags or a bad trace
)

// run is the command, with its arguments and streams given, for tests.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\nRun 'ttlbench -h' for usage.\n", err)
		return exitUsage
	}
	prog := newProgress(stderr)
	defer prog.stop()
	plan, err := cfg.plan(ctx, stdin, prog)
	if err != nil {
		prog.stop()
		fmt.Fprintf(stderr, "ttlbench: %v\n", err)
		if ctx.Err() != nil {
			return exitFail
		}
		return exitUsage
	}
	rep, err := study(ctx, cfg, plan, prog)
	prog.stop()
	if err != nil {
		fmt.Fprintf(stderr, "ttlbench: %v\n", err)
		return exitFail
	}
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

// study answers the question for plan: the duplicates at every retention
// (analyse), the smallest retention meeting the target, the replay of the
// grid's retentions and that one, and the bootstrap intervals.
func study(ctx context.Context, cfg *config, plan *traffic.Plan, prog *progress) (*report, error) {
	opts := cfg.opts
	grid := opts.Policies
	prog.phase("grouping requests by key", "", 0)
	a := analyse(plan, opts.Lease, grid)

	tooSmall := cfg.target > 0 && float64(plan.Ops()) < 3/cfg.target
	searched := time.Duration(-1)
	policies := slices.Clone(grid)
	if !tooSmall {
		searched = roundRetention(a.smallest(cfg.target), opts.Lease)
		if !slices.Contains(policies, searched) {
			policies = append(policies, searched)
			slices.Sort(policies)
		}
	}

	prog.phase("replaying", "requests", int64(plan.Len())*int64(len(policies)))
	opts.Progress = &prog.Done
	results, err := simulateReal(ctx, plan, policies, opts)
	if err != nil {
		return nil, err
	}
	if a.approx == 0 {
		for _, r := range results {
			if want := a.duplicatesAt(r.Retention); r.Duplicates != want {
				return nil, fmt.Errorf("internal error: retention %s: the replay counts %d duplicates, the keys' steps %d",
					units.ShortDuration(r.Retention), r.Duplicates, want)
			}
		}
	}
	var bs *bootstrap
	if cfg.resamples > 0 {
		prog.phase("bootstrap", "", 0)
		b := a.bootstrapKeys(policies, cfg.target, cfg.resamples, cfg.work.Seed)
		bs = &b
	}
	rep := newReport(plan, a, results, grid, searched, bs, cfg)
	if cfg.tombstones && searched >= 0 {
		prog.phase("replaying with tombstones", "requests", 0)
		opts.Progress = &prog.Done
		ps, err := studyPairs(ctx, plan, opts, grid, searched, results[rep.Searched], cfg.lateTarget)
		if err != nil {
			return nil, err
		}
		rep.Pairs = ps
	}
	return rep, nil
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
traffic, modelled or from your logs (-trace), once per retention of
-policies, and reports for each the replays, the duplicate executions of fn
and the duplicate rate (duplicates per operation) with a 95% interval, and
the peak number and bytes of live records. It searches the shortest
retention whose duplicate rate is at most -target (to 1% or 1s), with an
interval from resampling the keys, and prints the retry gaps (how long
after an operation's recorded outcome its later requests come: p50, p99,
p99.9, p99.99, max) that decide it. A trace too small to show a rate as low
as -target (fewer than 3/target operations) gets no recommendation.

Engines: -engine fast (the default) applies idem's rules in Go: a claim
writes a record whose TTL is the retention, the recorded outcome resets it
to the retention, a request finds the record, a conflict (another
fingerprint), the operation still running, or nothing (it runs fn again).
A test holds it to -engine real, which replays every request through
idem.New and Client.Do on an embedded miniredis with a virtual clock (days
of traffic in seconds, a few thousand requests a second), or on a real
Redis (-redis). The fast engine replays ten million requests in well under
a minute.

Traffic, modelled: -ops operations arrive at -rate per second (Poisson),
each with a random UUID as its key. An attempt times out at the client with
probability -timeout-share (the operation completes on the server all the
same), and the client retries, up to -retries times, pausing
min(-retry-cap, -retry-base * -retry-factor^(n-1)) +/- -retry-jitter before
retry n. A share -late-share of operations is delivered once more, late,
after a lognormal delay from the first attempt with median -late-median and
99th percentile -late-p99. fn runs for -op-time. -seed fixes every draw.

Traffic, recorded (-trace FILE, or - for stdin; gzip is detected): CSV
lines key,time[,fingerprint[,duration]], one per request, in any order.
With -columns, the first line is a header and the named columns are read
(-columns key=idempotency_key,time=ts,fingerprint=body_sha,duration=ms);
without it, a first line starting with "key" is a header. time is RFC 3339
or a Unix time in -time-unit (s, ms, us or ns; a fraction is allowed);
numbers that read as a date before 1995 or after 2100 are refused, naming
the unit they look like. The fingerprint stands for the request's
parameters (a key reused with another gets ErrConflict); duration is how
long fn ran (250ms, 1.5s, or a number of milliseconds). The first request
with a key is the operation, later ones its retries. Lines starting with #
and blank lines are skipped; a field with a comma or a quote is quoted.
Rows without a key (an empty field, or -) are skipped and counted in the
report; -strict refuses them. Errors name the line, and a header that
fails to parse gets the -columns to name. Only hashes of keys and
fingerprints are kept, about 21 bytes a request.

The target: -target 0, the default, admits no duplicate in the traffic,
so its single longest retry gap sets the answer (the report says which);
a rate such as 0.0001 (one duplicate in 10,000 operations) lets rare
outliers go.

Peak bytes: with miniredis and the fast engine, the key name and value of
every live record, summed: the data, without Redis's own overhead. A
finished record with a UUID key, a fingerprint and a 100-byte result holds
181 bytes of key and value, and takes 248 bytes by MEMORY USAGE on Redis
7.0 (measured by the tests). With -redis, MEMORY USAGE of each record,
taken after each write. Records change only at requests and recordings, so
both peaks are exact, not sampled. Memory at steady state grows with
-rate: scale it.

Two tiers (-tombstones): records kept for a retention R, then tombstones
(idem.WithTombstones) for T more, which refuse a late retry with
ErrLateRetry instead of running fn again. The pair's span R + T is the
retention that meets -target; R is the shortest retention whose late
retries (refused requests) are at most -late-target per operation, and
the pair is recommended when its peak memory, records plus tombstones of
-tombstone-bytes each, is below the span's alone. Fast engine only.

Ledger rows (idemsql, idempgx): the report recommends how long to keep
them, Prune(ctx, time.Now().Add(-age)): the longest of the recommended
retention, twice the trace's longest retry gap and a day, rounded up to
whole days, so that every retry that may come finds its receipt.

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
