// Package otelidem records what an idem.Client does as OpenTelemetry
// metrics and traces.
//
// It is an idem.Observer (and idem.CallStarter): give it to the Client with
// idem.WithObserver.
//
//	obs, err := otelidem.New() // the global meter and tracer providers
//	if err != nil { ... }
//	keys := idem.New(rdb, idem.WithObserver(obs), idem.WithEventKeySecret(secret))
//
// Metrics (names as OpenTelemetry has them; the Prometheus exporter turns
// dots into underscores and adds _total and units, as in
// idem_calls_total). The counters' series exist from New on, at zero (one
// per outcome for idem.calls), so that alerts on increase() and rate()
// see a process's first lease loss; create the Observer once the
// MeterProvider is set up. README.md beside this file has the alert rules
// and a dashboard, checked by a test against Prometheus's own engine.
//
//	idem.calls           counter    calls, by idem.outcome (executed, replayed, conflict,
//	                                lease_lost, released, failed, not_recorded, in_progress, error,
//	                                late_retry, ledger_replayed, parked)
//	idem.call.duration   histogram  seconds a call took, by idem.outcome
//	idem.wait.duration   histogram  seconds a call waited for another owner (calls that waited)
//	idem.owned.duration  histogram  seconds a call owned the key: fn's run time plus recording
//	idem.takeovers       counter    claims of a key from an earlier attempt (attempt > 1)
//	idem.lease_losses    counter    calls whose fn ran but lost its lease
//	idem.replay.age      histogram  seconds from an outcome's recording to a replay of it:
//	                                how late retries come (see below)
//	idem.late_retries    counter    calls refused as late retries (idem.ErrLateRetry):
//	                                the outcome's retention had ended, its tombstone was left
//	idem.reconciliations counter    reconciliations of checked steps (idem.StepChecked), by
//	                                idem.check (applied, not_applied, unknown: parked)
//	idem.parked          counter    calls that parked their operation (idem.ErrUnknownOutcome)
//
// An outcome that the ledger decided (idem.WithLedger), not Redis, is
// counted as ledger_replayed, not replayed: a takeover found the dead
// owner's commit, or Redis lost the record and the ledger still held the
// outcome. A steady rate of them says that Redis loses records (restarts
// without persistence, failovers without WAIT) or that owners die
// between their commit and the Redis completion; the ledger made those
// calls safe. Their idem.replay.age is the ledger row's age.
//
// Traces: a span "idem.Do" per call, started before the claim, so that
// what fn does nests under it, and ended with the attributes idem.outcome,
// idem.attempt and idem.key.digest (the keyed digest of idem.Event.Key,
// never the key itself), with events for a wait (idem.waited), a
// takeover (idem.took_over) and a reconciliation (idem.reconciled, with
// idem.step and idem.check). A call whose Do returned an error has the
// status Error, described by its outcome only: idem's error messages quote
// keys.
//
// # Is the retention long enough?
//
// idem.replay.age shows how long after an operation's outcome was
// recorded its retries come; compare its high quantiles with the Client's
// retention (idem.WithRetention). In Prometheus, the age within which
// 99.99% of replays came, over a week:
//
//	histogram_quantile(0.9999, sum by (le) (rate(idem_replay_age_seconds_bucket[7d])))
//
// A retry later than the retention finds no record and runs fn again,
// which no metric can see; with idem.WithTombstones it is refused instead,
// and counted in idem.late_retries: any increase means the retention was
// outrun (increase(idem_late_retries_total[1h]) > 0). Replays are timed
// when the call read the record from Redis: one that shared a concurrent
// call's outcome, or woke to the owner's notification, records no age.
// The buckets (WithAgeBuckets) run from a second to 30 days by default.
// Like every counter, idem.late_retries is at zero from New on;
// idem.replay.age has no series until the first replay (OpenTelemetry
// exports no empty histogram). README.md has the alert and the queries;
// docs/retention.md in the repository tells how to read them.
package otelidem

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idem-go/idem/otelidem"

// Attribute keys.
const (
	// AttrOutcome is the outcome of a call: idem.EventKind's String.
	AttrOutcome = attribute.Key("idem.outcome")
	// AttrAttempt is the attempt number (spans only).
	AttrAttempt = attribute.Key("idem.attempt")
	// AttrKeyDigest is the key's keyed digest, idem.Event.Key (spans only).
	AttrKeyDigest = attribute.Key("idem.key.digest")
	// AttrReplayAge is, for a replay, the age of its outcome in seconds,
	// idem.Event.Age (spans only; absent when unknown).
	AttrReplayAge = attribute.Key("idem.replay.age")
	// AttrCheck is how a checked step's reconciliation ended (see
	// idem.EventReconciled): "applied", "not_applied" or "unknown" (the
	// step was parked).
	AttrCheck = attribute.Key("idem.check")
	// AttrStep is a checked step's name, idem.Event.Step (span events
	// only).
	AttrStep = attribute.Key("idem.step")
)

// checkLabels are the values of AttrCheck, by idem.Check.
var checkLabels = map[idem.Check]string{
	idem.CheckApplied:    "applied",
	idem.CheckNotApplied: "not_applied",
	idem.CheckUnknown:    "unknown",
}

// Observer records the events of idem Clients as metrics and spans. It is
// safe for concurrent use; one Observer may serve many Clients.
type Observer struct {
	tracer      trace.Tracer
	calls       metric.Int64Counter
	duration    metric.Float64Histogram
	wait        metric.Float64Histogram
	owned       metric.Float64Histogram
	takeovers   metric.Int64Counter
	leaseLosses metric.Int64Counter
	age         metric.Float64Histogram
	lateRetries metric.Int64Counter
	reconciled  metric.Int64Counter
	parked      metric.Int64Counter
	recovered   metric.Int64Counter
	// byCheck holds the metric option of each reconciliation result.
	byCheck map[idem.Check]metric.MeasurementOption
	// byOutcome holds the metric option of each outcome's attribute,
	// made once: an event then costs no allocation of its own for it.
	byOutcome map[idem.EventKind]metric.MeasurementOption
}

var (
	_ idem.Observer    = (*Observer)(nil)
	_ idem.CallStarter = (*Observer)(nil)
)

// An Option configures an Observer.
type Option func(*config)

type config struct {
	mp         metric.MeterProvider
	tp         trace.TracerProvider
	ageBuckets []float64 // seconds
	problems   []string
}

// WithMeterProvider sets where metrics go.
// The default is otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets where spans go.
// The default is otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithAgeBuckets sets the upper bounds of idem.replay.age's buckets, in
// increasing order, all positive. Put bounds near the retention
// (idem.WithRetention) and below it, where the question is.
// The default is 1s, 10s, 1m, 5m, 15m, 30m, 1h, 2h, 3h, 6h, 12h, 24h, 2d,
// 3d, 7d, 14d and 30d.
func WithAgeBuckets(bounds ...time.Duration) Option {
	return func(c *config) {
		c.ageBuckets = nil
		for i, b := range bounds {
			if b <= 0 || i > 0 && b <= bounds[i-1] {
				c.problems = append(c.problems, fmt.Sprintf("WithAgeBuckets: bounds must be positive and increasing, got %v", bounds))
				return
			}
			c.ageBuckets = append(c.ageBuckets, b.Seconds())
		}
		if len(bounds) == 0 {
			c.problems = append(c.problems, "WithAgeBuckets: no bounds")
		}
	}
}

// durationBuckets are the histograms' bucket bounds, in seconds: from a
// replay's millisecond to a long fn's minutes.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// ageBuckets are idem.replay.age's default bucket bounds, in seconds: from
// a client's quick retry to a month-old redelivery.
var ageBuckets = []float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400, 3 * 86400, 7 * 86400, 14 * 86400, 30 * 86400}

// New returns an Observer that records with the providers of opts. It
// fails if an option is invalid or an instrument cannot be created.
func New(opts ...Option) (*Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider(), ageBuckets: ageBuckets}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.problems) > 0 {
		return nil, fmt.Errorf("otelidem: %s", strings.Join(cfg.problems, "; "))
	}
	m := cfg.mp.Meter(ScopeName)
	o := &Observer{tracer: cfg.tp.Tracer(ScopeName), byOutcome: map[idem.EventKind]metric.MeasurementOption{},
		byCheck: map[idem.Check]metric.MeasurementOption{}}
	var err error
	newHist := func(name, desc string) metric.Float64Histogram {
		var h metric.Float64Histogram
		if err == nil {
			h, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
				metric.WithExplicitBucketBoundaries(durationBuckets...))
		}
		return h
	}
	newCounter := func(name, unit, desc string) metric.Int64Counter {
		var c metric.Int64Counter
		if err == nil {
			c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		}
		return c
	}
	o.calls = newCounter("idem.calls", "{call}", "Calls of idem's Do, by outcome.")
	o.takeovers = newCounter("idem.takeovers", "{claim}", "Claims of a key from an earlier attempt (attempt above 1): an owner failed or its lease ended.")
	o.leaseLosses = newCounter("idem.lease_losses", "{call}", "Calls whose fn ran but lost its lease: the outcome was not stored.")
	o.duration = newHist("idem.call.duration", "Duration of calls of idem's Do, by outcome.")
	o.wait = newHist("idem.wait.duration", "Time calls waited for another owner of their key.")
	o.owned = newHist("idem.owned.duration", "Time calls owned their key: fn's run time plus recording its outcome.")
	o.lateRetries = newCounter("idem.late_retries", "{call}",
		"Calls refused as late retries (ErrLateRetry): the outcome's retention had ended and its tombstone was left; fn did not run.")
	o.reconciled = newCounter("idem.reconciliations", "{reconciliation}",
		"Reconciliations of checked steps (StepChecked), by how they ended: applied, not_applied (act ran again), unknown (parked).")
	o.parked = newCounter("idem.parked", "{call}",
		"Calls that ended with the operation parked: a checked step (ErrUnknownOutcome) waits for an operator's Resolve, or a recovery after WithMaxRecoveries (ErrParked) for Retry.")
	o.recovered = newCounter("idem.recoveries", "{operation}",
		"Operations that a Recover loop finished after their caller left them unfinished (EventRecovered).")
	if err == nil {
		o.age, err = m.Float64Histogram("idem.replay.age", metric.WithUnit("s"),
			metric.WithDescription("Time from the recording of an outcome to a replay of it: compare with the retention."),
			metric.WithExplicitBucketBoundaries(cfg.ageBuckets...))
	}
	if err != nil {
		return nil, err
	}
	for k := idem.EventKind(1); k.Outcome() || k == idem.EventWaited || k == idem.EventTookOver; k++ {
		o.byOutcome[k] = metric.WithAttributeSet(attribute.NewSet(AttrOutcome.String(k.String())))
	}
	// Every counter's series exists from the start, at zero: an alert on
	// increase() or rate() sees the first event of a process as an
	// increase, not as a series that appears with its value already 1.
	ctx := context.Background()
	for k, by := range o.byOutcome {
		if k.Outcome() {
			o.calls.Add(ctx, 0, by)
		}
	}
	o.takeovers.Add(ctx, 0)
	o.leaseLosses.Add(ctx, 0)
	o.lateRetries.Add(ctx, 0)
	o.parked.Add(ctx, 0)
	o.recovered.Add(ctx, 0)
	for c, l := range checkLabels {
		o.byCheck[c] = metric.WithAttributeSet(attribute.NewSet(AttrCheck.String(l)))
		o.reconciled.Add(ctx, 0, o.byCheck[c])
	}
	return o, nil
}

type spanKey struct{}

// StartCall starts the span of a call; idem calls it before the claim.
func (o *Observer) StartCall(ctx context.Context) context.Context {
	ctx, span := o.tracer.Start(ctx, "idem.Do", trace.WithSpanKind(trace.SpanKindInternal))
	return context.WithValue(ctx, spanKey{}, span)
}

// Observe records one event; idem calls it when a call ends.
func (o *Observer) Observe(ctx context.Context, e idem.Event) {
	span, _ := ctx.Value(spanKey{}).(trace.Span)
	switch {
	case e.Kind == idem.EventWaited:
		o.wait.Record(ctx, e.Wait.Seconds())
		if span != nil {
			span.AddEvent("idem.waited", trace.WithAttributes(
				attribute.Float64("idem.wait.seconds", e.Wait.Seconds()), AttrAttempt.Int64(e.Attempt)))
		}
		return
	case e.Kind == idem.EventTookOver:
		o.takeovers.Add(ctx, 1)
		if span != nil {
			span.AddEvent("idem.took_over", trace.WithAttributes(AttrAttempt.Int64(e.Attempt)))
		}
		return
	case e.Kind == idem.EventReconciled:
		by, ok := o.byCheck[e.Check]
		if !ok {
			by = metric.WithAttributes(AttrCheck.String(e.Check.String()))
		}
		o.reconciled.Add(ctx, 1, by)
		if span != nil {
			span.AddEvent("idem.reconciled", trace.WithAttributes(
				AttrStep.String(e.Step), AttrCheck.String(checkLabels[e.Check])))
		}
		return
	case e.Kind == idem.EventRecovered:
		o.recovered.Add(ctx, 1)
		return
	case !e.Kind.Outcome():
		return
	}
	by, ok := o.byOutcome[e.Kind]
	if !ok {
		by = metric.WithAttributes(AttrOutcome.String(e.Kind.String()))
	}
	o.calls.Add(ctx, 1, by)
	o.duration.Record(ctx, e.Duration.Seconds(), by)
	if e.Kind.Ran() {
		o.owned.Record(ctx, e.Owned.Seconds())
	}
	switch {
	case e.Kind == idem.EventLeaseLost:
		o.leaseLosses.Add(ctx, 1)
	case e.Kind == idem.EventLateRetry:
		o.lateRetries.Add(ctx, 1)
	case e.Kind == idem.EventParked:
		o.parked.Add(ctx, 1)
	case (e.Kind == idem.EventReplayed || e.Kind == idem.EventLedgerReplayed) && e.Age > 0:
		o.age.Record(ctx, e.Age.Seconds())
	}
	if span == nil {
		return
	}
	span.SetAttributes(AttrOutcome.String(e.Kind.String()), AttrAttempt.Int64(e.Attempt), AttrKeyDigest.String(e.Key))
	if e.Age > 0 {
		span.SetAttributes(AttrReplayAge.Float64(e.Age.Seconds()))
	}
	if e.Err != nil {
		span.SetStatus(codes.Error, e.Kind.String())
	}
	span.End()
}
