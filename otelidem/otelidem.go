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
//	                                lease_lost, released, failed, not_recorded, in_progress, error)
//	idem.call.duration   histogram  seconds a call took, by idem.outcome
//	idem.wait.duration   histogram  seconds a call waited for another owner (calls that waited)
//	idem.owned.duration  histogram  seconds a call owned the key: fn's run time plus recording
//	idem.takeovers       counter    claims of a key from an earlier attempt (attempt > 1)
//	idem.lease_losses    counter    calls whose fn ran but lost its lease
//
// Traces: a span "idem.Do" per call, started before the claim, so that
// what fn does nests under it, and ended with the attributes idem.outcome,
// idem.attempt and idem.key.digest (the keyed digest of idem.Event.Key,
// never the key itself), with events for a wait (idem.waited) and a
// takeover (idem.took_over). A call whose Do returned an error has the
// status Error, described by its outcome only: idem's error messages quote
// keys.
package otelidem

import (
	"context"

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
)

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
	mp metric.MeterProvider
	tp trace.TracerProvider
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

// durationBuckets are the histograms' bucket bounds, in seconds: from a
// replay's millisecond to a long fn's minutes.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// New returns an Observer that records with the providers of opts. It
// fails only if an instrument cannot be created.
func New(opts ...Option) (*Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		o(&cfg)
	}
	m := cfg.mp.Meter(ScopeName)
	o := &Observer{tracer: cfg.tp.Tracer(ScopeName), byOutcome: map[idem.EventKind]metric.MeasurementOption{}}
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
	if e.Kind == idem.EventLeaseLost {
		o.leaseLosses.Add(ctx, 1)
	}
	if span == nil {
		return
	}
	span.SetAttributes(AttrOutcome.String(e.Kind.String()), AttrAttempt.Int64(e.Attempt), AttrKeyDigest.String(e.Key))
	if e.Err != nil {
		span.SetStatus(codes.Error, e.Kind.String())
	}
	span.End()
}
