package alerttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/storage"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// readme is the file whose rules users copy.
const readme = "../../README.md"

// scrapeEvery is the simulated scrape interval.
const scrapeEvery = 15 * time.Second

// A rule is a row of the README's alert table: its PromQL expression, and
// how long it must hold before the alert fires ("for 15m"; 0: at once).
type rule struct {
	signal, expr string
	hold         time.Duration
}

// scenario is the trouble an alert is for, in a process that starts at 0:
// trouble makes its events in the scrape interval that starts at, firing
// is when the alert must be firing, quiet a time before the trouble when
// it must not.
type scenario struct {
	trouble func(s *sim, at time.Duration)
	firing  time.Duration
	quiet   time.Duration
}

var start = 5 * time.Minute // when every scenario's trouble begins

var scenarios = map[string]scenario{
	// The first lease loss and the first unrecorded outcome of a process:
	// increase() sees them only if the series existed before, at zero.
	"lease lost":   {trouble: once(idem.EventLeaseLost), firing: 6 * time.Minute, quiet: 4 * time.Minute},
	"not recorded": {trouble: once(idem.EventNotRecorded), firing: 6 * time.Minute, quiet: 4 * time.Minute},
	"takeovers": {trouble: func(s *sim, at time.Duration) {
		if at >= start {
			s.observe(idem.Event{Kind: idem.EventTookOver, Attempt: 2})
		}
	}, firing: 25 * time.Minute, quiet: 4 * time.Minute},
	"conflict rate": {trouble: func(s *sim, at time.Duration) {
		if at >= start {
			s.observe(idem.Event{Kind: idem.EventConflict, Duration: time.Millisecond, Err: idem.ErrConflict})
		}
	}, firing: 8 * time.Minute, quiet: 4 * time.Minute},
	"wait p99": {trouble: func(s *sim, at time.Duration) {
		if at >= start {
			for range 10 {
				s.observe(idem.Event{Kind: idem.EventWaited, Wait: 8 * time.Second, Attempt: 1})
				s.observe(idem.Event{Kind: idem.EventReplayed, Duration: 8 * time.Second, Wait: 8 * time.Second})
			}
		}
	}, firing: 8 * time.Minute, quiet: 4 * time.Minute},
	// The first late retry of a process (idem.WithTombstones).
	"late retries": {trouble: once(idem.EventLateRetry), firing: 6 * time.Minute, quiet: 4 * time.Minute},
	// The first outcome of a process that the ledger decided: Redis had
	// lost the record, or never finished it.
	"ledger replays": {trouble: once(idem.EventLedgerReplayed), firing: 6 * time.Minute, quiet: 4 * time.Minute},
	"errors": {trouble: func(s *sim, at time.Duration) {
		if at >= start {
			s.observe(idem.Event{Kind: idem.EventError, Duration: time.Millisecond, Err: idem.ErrUnavailable})
		}
	}, firing: 6 * time.Minute, quiet: 4 * time.Minute},
}

// once makes one event of kind, at start.
func once(kind idem.EventKind) func(*sim, time.Duration) {
	return func(s *sim, at time.Duration) {
		if at == start {
			s.observe(idem.Event{Kind: kind, Attempt: 1, Duration: time.Second, Owned: time.Second, Err: errors.New("trouble")})
		}
	}
}

// TestAlertRules evaluates every alert rule of the README in a process
// with its trouble (it fires, the first time included) and in one without
// (it stays quiet), and the dashboard's queries on healthy traffic.
func TestAlertRules(t *testing.T) {
	rules, dashboard := readRules(t)
	if len(rules) < 7 {
		t.Fatalf("%s: %d alert rules found, want the seven of its table", readme, len(rules))
	}
	for _, r := range rules {
		t.Run(r.signal, func(t *testing.T) {
			sc, ok := scenarios[r.signal]
			if !ok {
				t.Fatalf("no scenario for the alert %q: add one to scenarios", r.signal)
			}
			troubled := newSim(t).run(30*time.Minute, sc.trouble)
			if v := troubled.eval(t, r.expr, sc.quiet); len(v) != 0 {
				t.Errorf("fired at %v, before the trouble began at %v: %v", sc.quiet, start, v)
			}
			for at := sc.firing - r.hold; at <= sc.firing; at += time.Minute {
				if v := troubled.eval(t, r.expr, at); len(v) == 0 {
					t.Errorf("%s is not true at %v (trouble since %v, the alert must fire at %v)", r.expr, at, start, sc.firing)
				}
			}
			healthy := newSim(t).run(30*time.Minute, nil)
			for at := time.Minute; at <= 30*time.Minute; at += time.Minute {
				if v := healthy.eval(t, r.expr, at); len(v) != 0 {
					t.Errorf("fired at %v on healthy traffic: %v", at, v)
				}
			}
		})
	}
	for s := range scenarios {
		if !slices.ContainsFunc(rules, func(r rule) bool { return r.signal == s }) {
			t.Errorf("scenario %q has no rule in %s", s, readme)
		}
	}
	healthy := newSim(t).run(30*time.Minute, scenarios["wait p99"].trouble)
	for _, q := range dashboard {
		if v := healthy.eval(t, q, 20*time.Minute); len(v) == 0 {
			t.Errorf("dashboard query %s returns nothing on traffic with calls, waits and replays", q)
		}
	}
}

// readRules reads the PromQL of the README's alert table (rows whose
// second cell holds an expression on idem_ metrics) and of its dashboard.
func readRules(t *testing.T) (rules []rule, dashboard []string) {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	section := ""
	code := regexp.MustCompile("`([^`]+)`")
	hold := regexp.MustCompile(`^\s*for (\w+)`)
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = h
			continue
		}
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := splitRow(line)
		if len(cells) < 2 {
			continue
		}
		switch section {
		case "What to alert on":
			m := code.FindStringSubmatchIndex(cells[1])
			if m == nil || !strings.Contains(cells[1], "idem_") {
				continue // the header, or a rule that is not PromQL (readiness)
			}
			r := rule{signal: cells[0], expr: cells[1][m[2]:m[3]]}
			if h := hold.FindStringSubmatch(cells[1][m[1]:]); h != nil {
				if r.hold, err = time.ParseDuration(h[1]); err != nil {
					t.Fatalf("%s: rule %q: for %q: %v", readme, r.signal, h[1], err)
				}
			}
			rules = append(rules, r)
		case "A dashboard":
			for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
				if strings.Contains(m[1], "idem_") {
					dashboard = append(dashboard, m[1])
				}
			}
		}
	}
	return rules, dashboard
}

// splitRow splits a Markdown table row into its cells, with \| as a pipe.
func splitRow(line string) []string {
	line = strings.Trim(strings.TrimSpace(line), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// sim is one process that exports otelidem's metrics, scraped every
// scrapeEvery of simulated time from 0.
type sim struct {
	t      *testing.T
	obs    *otelidem.Observer
	reg    *prometheus.Registry
	series map[string][]string // by series: its value at each scrape, "_" where it did not exist
	n      int                 // scrapes so far
	engine *promql.Engine
	store  storage.Queryable
}

func newSim(t *testing.T) *sim {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	return &sim{t: t, obs: obs, reg: reg, series: map[string][]string{}}
}

func (s *sim) observe(e idem.Event) { s.obs.Observe(context.Background(), e) }

// run makes healthy traffic in every scrape interval up to until, and
// trouble's events, scraping at the end of each; it returns s.
func (s *sim) run(until time.Duration, trouble func(*sim, time.Duration)) *sim {
	for at := time.Duration(0); at <= until; at += scrapeEvery {
		s.scrape() // the sample at time at, before its interval's events
		for range 20 {
			s.observe(idem.Event{Kind: idem.EventExecuted, Attempt: 1, Duration: 5 * time.Millisecond, Owned: 4 * time.Millisecond})
		}
		for range 5 {
			// Replays read from Redis carry their outcome's age.
			s.observe(idem.Event{Kind: idem.EventReplayed, Duration: time.Millisecond, Age: 90 * time.Second})
		}
		if trouble != nil {
			trouble(s, at)
		}
	}
	return s
}

// scrape records the registry's samples as the next scrape.
func (s *sim) scrape() {
	fams, err := s.reg.Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	seen := map[string]bool{}
	add := func(name string, labels []*dto.LabelPair, extra map[string]string, v float64) {
		key := seriesKey(name, labels, extra)
		vals, ok := s.series[key]
		if !ok {
			for range s.n {
				vals = append(vals, "_")
			}
		}
		s.series[key] = append(vals, strconv.FormatFloat(v, 'g', -1, 64))
		seen[key] = true
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(f.GetName(), m.GetLabel(), nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(f.GetName(), m.GetLabel(), nil, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(f.GetName()+"_bucket", m.GetLabel(), map[string]string{"le": strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)}, float64(b.GetCumulativeCount()))
				}
				add(f.GetName()+"_bucket", m.GetLabel(), map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				add(f.GetName()+"_sum", m.GetLabel(), nil, h.GetSampleSum())
				add(f.GetName()+"_count", m.GetLabel(), nil, float64(h.GetSampleCount()))
			default:
				s.t.Fatalf("metric %s of type %v", f.GetName(), f.GetType())
			}
		}
	}
	for key, vals := range s.series {
		if !seen[key] {
			s.series[key] = append(vals, "_")
		}
	}
	s.n++
}

// seriesKey writes a series as PromQL's test language does: name{labels}.
func seriesKey(name string, labels []*dto.LabelPair, extra map[string]string) string {
	var parts []string
	for _, l := range labels {
		parts = append(parts, l.GetName()+"="+strconv.Quote(l.GetValue()))
	}
	for k, v := range extra {
		parts = append(parts, k+"="+strconv.Quote(v))
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// eval evaluates expr at simulated time at, on every scrape so far, and
// returns the samples of its result (none: the alert is quiet).
func (s *sim) eval(t *testing.T, expr string, at time.Duration) promql.Vector {
	t.Helper()
	if s.store == nil {
		var b strings.Builder
		fmt.Fprintf(&b, "load %s\n", scrapeEvery)
		keys := make([]string, 0, len(s.series))
		for k := range s.series {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s %s\n", k, strings.Join(s.series[k], " "))
		}
		opts := promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute}
		s.store = promqltest.LoadedStorage(t, b.String()) // closed when t ends
		s.engine = promql.NewEngine(opts)
		t.Cleanup(func() { _ = s.engine.Close() })
	}
	q, err := s.engine.NewInstantQuery(context.Background(), s.store, nil, expr, time.Unix(0, 0).Add(at))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s at %v: %v", expr, at, res.Err)
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v
	case promql.Scalar:
		return promql.Vector{promql.Sample{F: v.V}}
	}
	t.Fatalf("%s: a %T, not a vector", expr, res.Value)
	return nil
}
