package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// config is what the command line asks for.
type config struct {
	work      traffic.Workload
	trace     string // file of recorded requests, or "-" for stdin; replaces work
	format    traceFormat
	columns   string // -columns, parsed into format
	timeUnit  string // -time-unit, parsed into format
	opts      options
	target    float64
	resamples int // bootstrap resamples
	json      bool
	svg       string // file to write the chart to

	tombstones bool    // also study the two-tier policy (pairs.go)
	lateTarget float64 // highest acceptable rate of late retries refused, with tombstones
}

// minRealLease is the shortest lease, in real time, that a run against a
// real Redis accepts: a claim, a request's pause and its completion must fit
// in it on a busy machine, or the owner loses the lease mid-run.
const minRealLease = 250 * time.Millisecond

// maxTimeScale returns the largest -time-scale that leaves lease at least
// minRealLease of real time, formatted for a message.
func maxTimeScale(lease time.Duration) string {
	return strconv.FormatFloat(math.Floor(float64(lease)/float64(minRealLease)*1000)/1000, 'f', -1, 64)
}

// defaultPolicies are the retentions compared when -policies is not given.
const defaultPolicies = "1m,10m,1h,6h,24h,7d"

// newFlagSet declares the flags, with their defaults, into cfg.
func newFlagSet(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("ttlbench", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by run, help by usage
	fs.Usage = func() {}

	cfg.work = traffic.Workload{
		Ops: 5000, Rate: 0.05, Seed: 1,
		TimeoutShare: 0.05, Retries: 5, RetryBase: time.Second, RetryFactor: 2, RetryJitter: 0.2, RetryCap: time.Minute,
		LateShare: 0.02, LateMedian: 5 * time.Minute, LateP99: 2 * time.Hour,
	}
	cfg.opts = options{Lease: 30 * time.Second, ResultSize: 256, TimeScale: 1, Engine: engineFast, TombstoneBytes: tombstoneBytes}
	cfg.lateTarget = 0.001
	cfg.timeUnit, cfg.resamples = "ms", 400
	cfg.opts.Policies, _ = parsePolicies(defaultPolicies)

	w := &cfg.work
	fs.IntVar(&w.Ops, "ops", w.Ops, "number of `operations` to generate")
	fs.Float64Var(&w.Rate, "rate", w.Rate, "arrivals of operations per second (Poisson)")
	fs.Float64Var(&w.TimeoutShare, "timeout-share", w.TimeoutShare, "probability that an attempt times out at the client, which retries")
	fs.IntVar(&w.Retries, "retries", w.Retries, "most retries a client sends after the first attempt")
	fs.Var(durationValue{&w.RetryBase}, "retry-base", "`pause` before the first retry")
	fs.Float64Var(&w.RetryFactor, "retry-factor", w.RetryFactor, "each retry's pause is this many times the last one's")
	fs.Float64Var(&w.RetryJitter, "retry-jitter", w.RetryJitter, "each pause varies randomly by up to ± this `fraction`")
	fs.Var(durationValue{&w.RetryCap}, "retry-cap", "longest `pause` between retries (before jitter)")
	fs.Float64Var(&w.LateShare, "late-share", w.LateShare, "share of operations redelivered once more, late")
	fs.Var(durationValue{&w.LateMedian}, "late-median", "median `delay` of a late redelivery after the first attempt")
	fs.Var(durationValue{&w.LateP99}, "late-p99", "99th percentile of that `delay` (lognormal)")
	fs.Var(durationValue{&w.OpTime}, "op-time", "`duration` of each fn, from claim to recorded outcome; requests meanwhile find it in progress")
	fs.Uint64Var(&w.Seed, "seed", w.Seed, "seed of the random draws: the same seed gives the same report")
	fs.StringVar(&cfg.trace, "trace", "", "replay recorded requests from `FILE` (CSV key,time[,fingerprint[,duration]], gzip or not; - for stdin) instead of the model")
	fs.StringVar(&cfg.columns, "columns", "", "the trace starts with a header: read the columns it `names`, as key=NAME,time=NAME[,fingerprint=NAME][,duration=NAME]")
	fs.StringVar(&cfg.timeUnit, "time-unit", cfg.timeUnit, "`unit` of the trace's numeric (Unix) times: s, ms, us or ns; RFC 3339 times need none")
	fs.BoolVar(&cfg.format.Strict, "strict", false, "refuse a trace with a row without a key (empty, or -), instead of skipping and counting such rows")

	o := &cfg.opts
	fs.Var(policiesValue{&o.Policies}, "policies", "`retentions` to compare, comma-separated (units ms, s, m, h, d)")
	fs.Var(durationValue{&o.Lease}, "lease", "`duration` of the lease given to idem (WithLease); at most the shortest retention")
	fs.IntVar(&o.ResultSize, "result-size", o.ResultSize, "`bytes` of the result fn returns, which each record stores")
	fs.StringVar(&o.Engine, "engine", o.Engine, "`how` to replay: fast (the protocol's rules in Go) or real (through idem.Client.Do on miniredis, slow)")
	fs.StringVar(&o.Redis, "redis", "", "run against the Redis at `ADDR` (host:port or redis://...) instead of miniredis; implies -engine real")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "with -redis, run time `N` times faster than the traffic's")

	fs.Float64Var(&cfg.target, "target", 0, "highest acceptable duplicate `rate` (duplicates per operation) for the recommendation; 0: no duplicate in the traffic, which its single longest retry gap decides")
	fs.IntVar(&cfg.resamples, "bootstrap", cfg.resamples, "`resamples` of the keys for the 95% intervals (0: none)")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON object per retention per line, then a summary, instead of the table")
	fs.StringVar(&cfg.svg, "svg", "", "also write a chart of the trade-off to `FILE` (SVG)")
	fs.BoolVar(&cfg.tombstones, "tombstones", false, "also model idem.WithTombstones: a shorter retention, then tombstones up to the one that meets -target, and the cheapest such pair")
	fs.Float64Var(&cfg.lateTarget, "late-target", cfg.lateTarget, "with -tombstones, highest acceptable `rate` of late retries refused with ErrLateRetry (per operation)")
	fs.IntVar(&o.TombstoneBytes, "tombstone-bytes", o.TombstoneBytes, "with -tombstones, Redis memory of a tombstone in `bytes` (measured: 27 on one server, 50 on a Redis Cluster)")
	return fs
}

// workloadFlags are the model's flags, which a trace replaces.
var workloadFlags = []string{"ops", "rate", "timeout-share", "retries", "retry-base", "retry-factor",
	"retry-jitter", "retry-cap", "late-share", "late-median", "late-p99", "op-time", "seed"}

// traceFlags apply to a trace only.
var traceFlags = []string{"columns", "time-unit", "strict"}

// parseFlags parses and checks the command line. It returns flag.ErrHelp
// for -h and -help.
func parseFlags(args []string) (*config, error) {
	cfg := &config{}
	fs := newFlagSet(cfg)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: ttlbench takes flags only", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := cfg.check(set); err != nil {
		return nil, err
	}
	return cfg, nil
}

// check validates the flags together; each error names its flag.
func (cfg *config) check(set map[string]bool) error {
	w, o := cfg.work, cfg.opts
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("-%s: %s", name, fmt.Sprintf(format, args...)))
	}
	if cfg.trace != "" {
		for _, name := range workloadFlags {
			if set[name] {
				bad(name, "cannot be used with -trace: the trace is the workload")
			}
		}
		if cfg.columns != "" {
			m, err := parseColumns(cfg.columns)
			if err != nil {
				bad("columns", "%v", err)
			}
			cfg.format.Columns = m
		}
		u, err := parseTimeUnit(cfg.timeUnit)
		if err != nil {
			bad("time-unit", "%v", err)
		}
		cfg.format.TimeUnit = u
	} else {
		for _, name := range traceFlags {
			if set[name] {
				bad(name, "applies to -trace only")
			}
		}
		if w.Ops < 1 || w.Ops > math.MaxInt32 {
			bad("ops", "must be between 1 and %d, got %d", math.MaxInt32, w.Ops)
		}
		if !(w.Rate > 0) || math.IsInf(w.Rate, 0) {
			bad("rate", "must be a positive number of arrivals per second, got %v", w.Rate)
		}
		share := func(name string, v float64) {
			if !(v >= 0 && v <= 1) {
				bad(name, "must be between 0 and 1, got %v", v)
			}
		}
		share("timeout-share", w.TimeoutShare)
		share("late-share", w.LateShare)
		share("retry-jitter", w.RetryJitter)
		if w.Retries < 0 || w.Retries > 1000 {
			bad("retries", "must be between 0 and 1000, got %d", w.Retries)
		}
		if w.RetryBase <= 0 {
			bad("retry-base", "must be positive, got %s", w.RetryBase)
		}
		if !(w.RetryFactor >= 1) || math.IsInf(w.RetryFactor, 0) {
			bad("retry-factor", "must be at least 1, got %v", w.RetryFactor)
		}
		if w.RetryCap < w.RetryBase {
			bad("retry-cap", "must be at least -retry-base (%s), got %s", units.ShortDuration(w.RetryBase), w.RetryCap)
		}
		if w.LateMedian <= 0 {
			bad("late-median", "must be positive, got %s", w.LateMedian)
		}
		if w.LateP99 <= w.LateMedian {
			bad("late-p99", "must be longer than -late-median (%s), got %s", units.ShortDuration(w.LateMedian), w.LateP99)
		}
		if w.OpTime < 0 || w.OpTime > traffic.MaxDelay {
			bad("op-time", "must be between 0 and %s, got %s", units.ShortDuration(traffic.MaxDelay), w.OpTime)
		}
	}
	switch {
	case o.Engine != engineFast && o.Engine != engineReal:
		bad("engine", "must be fast or real, got %q", o.Engine)
	case o.Redis != "" && set["engine"] && o.Engine != engineReal:
		bad("engine", "-redis replays through the library: it takes -engine real, not %s", o.Engine)
	case o.Redis != "":
		cfg.opts.Engine = engineReal
	}
	if cfg.opts.Engine == engineReal && cfg.trace == "" && w.OpTime >= o.Lease {
		bad("op-time", "-engine real replays on a virtual clock, where idem renews no lease: each fn must be shorter than the lease (-lease %s), got %s",
			units.ShortDuration(o.Lease), units.ShortDuration(w.OpTime))
	}
	if cfg.resamples < 0 || cfg.resamples > 100000 {
		bad("bootstrap", "must be between 0 and 100000, got %d", cfg.resamples)
	}

	if o.Lease < 10*time.Millisecond {
		bad("lease", "must be at least 10ms (idem's minimum), got %s", o.Lease)
	}
	for _, p := range o.Policies {
		if p < o.Lease {
			bad("policies", "retention %s is shorter than the lease (-lease %s), which idem rejects; lower -lease",
				units.ShortDuration(p), units.ShortDuration(o.Lease))
			break
		}
	}
	if o.ResultSize < 0 || o.ResultSize > 1<<20 {
		bad("result-size", "must be between 0 and 1048576 bytes (1 MiB), got %d", o.ResultSize)
	}
	if !(cfg.target >= 0 && cfg.target <= 1) {
		bad("target", "must be a duplicate rate between 0 and 1, got %v", cfg.target)
	}
	if cfg.tombstones {
		if !(cfg.lateTarget >= 0 && cfg.lateTarget <= 1) {
			bad("late-target", "must be a rate of late retries between 0 and 1, got %v", cfg.lateTarget)
		}
		if o.TombstoneBytes < 1 || o.TombstoneBytes > 1<<10 {
			bad("tombstone-bytes", "must be between 1 and 1024, got %d", o.TombstoneBytes)
		}
		if cfg.opts.Engine == engineReal {
			bad("tombstones", "the fast engine models tombstones (held to the library by a test), -engine real does not: leave out -engine and -redis")
		}
	} else {
		for _, name := range []string{"late-target", "tombstone-bytes"} {
			if set[name] {
				bad(name, "applies with -tombstones only")
			}
		}
	}
	switch {
	case o.Redis == "" && set["time-scale"]:
		bad("time-scale", "applies to -redis only: miniredis runs on a virtual clock")
	case !(o.TimeScale >= 1) || math.IsInf(o.TimeScale, 0):
		bad("time-scale", "must be at least 1, got %v", o.TimeScale)
	case o.Redis != "":
		if l := time.Duration(float64(o.Lease) / o.TimeScale); l < minRealLease {
			bad("time-scale", "%v leaves the lease (-lease %s) %s of real time, under the %s a lease needs to survive a "+
				"loaded machine (the run would die mid-way with \"lease lost\"); the largest safe -time-scale is %s, or raise -lease",
				o.TimeScale, units.ShortDuration(o.Lease), l.Round(time.Microsecond), minRealLease, maxTimeScale(o.Lease))
		}
		if _, err := redisOptions(o.Redis); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.svg != "" {
		if fi, err := os.Stat(filepath.Dir(cfg.svg)); err != nil || !fi.IsDir() {
			bad("svg", "directory of %q does not exist", cfg.svg)
		}
	}
	return errors.Join(errs...)
}

// plan returns the traffic to replay: the trace, or the model's. Reading
// a trace counts its bytes on prog.
func (cfg *config) plan(ctx context.Context, stdin io.Reader, prog *progress) (*traffic.Plan, error) {
	keys := cfg.opts.Engine == engineReal
	if cfg.trace == "" {
		return cfg.work.Plan(keys), nil
	}
	f := cfg.format
	f.KeepKeys = keys
	f.Progress = &prog.Done
	name, r := "stdin", stdin
	if cfg.trace != "-" {
		file, err := os.Open(cfg.trace)
		if err != nil {
			return nil, fmt.Errorf("-trace: %w", err)
		}
		defer file.Close()
		name, r = cfg.trace, file
		f.SizeHint = sizeHint(file)
		var size int64
		if fi, err := file.Stat(); err == nil {
			size = fi.Size()
		}
		prog.phase("reading "+filepath.Base(cfg.trace), "bytes", size)
	} else {
		prog.phase("reading stdin", "bytes", 0)
	}
	p, err := parseTrace(ctx, r, f)
	if err != nil {
		return nil, fmt.Errorf("-trace %s: %w", name, err)
	}
	if keys && p.Dur != nil {
		for i, d := range p.Dur {
			if d >= cfg.opts.Lease {
				return nil, fmt.Errorf("-trace %s: request %d (key %q) runs fn for %s: -engine real replays on a virtual clock, "+
					"where idem renews no lease, so each fn must be shorter than the lease (-lease %s); use -engine fast",
					name, i+1, p.Keys[p.Op[i]], units.ShortDuration(d), units.ShortDuration(cfg.opts.Lease))
			}
		}
	}
	return p, nil
}

// parseDuration parses a Go duration, with d for days added: 7d, 1d12h,
// 1.5d.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseFloat(days, 64)
	if err != nil || n < 0 || n > 100*365 {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	d := time.Duration(n * float64(24*time.Hour))
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || r < 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		d += r
	}
	return d, nil
}

// parsePolicies parses a comma-separated list of retentions, and returns
// them sorted, without repeats.
func parsePolicies(s string) ([]time.Duration, error) {
	var ps []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		d, err := parseDuration(f)
		switch {
		case err != nil:
			return nil, err
		case d < time.Millisecond || d%time.Millisecond != 0:
			return nil, fmt.Errorf("retention %q: must be a whole number of milliseconds, at least 1ms", strings.TrimSpace(f))
		}
		ps = append(ps, d)
	}
	if len(ps) == 0 {
		return nil, errors.New("no retentions given")
	}
	slices.Sort(ps)
	return slices.Compact(ps), nil
}

// durationValue is a flag.Value for a duration that also takes days.
type durationValue struct{ d *time.Duration }

// String formats the duration as the help shows it.
func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return units.ShortDuration(*v.d)
}

// Set parses a duration, days allowed.
func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// policiesValue is a flag.Value for -policies.
type policiesValue struct{ ps *[]time.Duration }

// String formats the retentions as the help shows them.
func (v policiesValue) String() string {
	if v.ps == nil {
		return ""
	}
	var s []string
	for _, p := range *v.ps {
		s = append(s, units.ShortDuration(p))
	}
	return strings.Join(s, ",")
}

// Set parses a comma-separated list of retentions.
func (v policiesValue) Set(s string) error {
	ps, err := parsePolicies(s)
	if err != nil {
		return err
	}
	*v.ps = ps
	return nil
}
