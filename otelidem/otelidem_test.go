package otelidem_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup returns an idem.Client on a fresh miniredis whose events go to an
// otelidem.Observer, with a manual metric reader and a span recorder.
func setup(t *testing.T, opts ...idem.Option) (*idem.Client, *miniredis.Miniredis, *sdkmetric.ManualReader, *tracetest.SpanRecorder) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := idem.New(rdb, append([]idem.Option{idem.WithObserver(obs), idem.WithLogger(nil),
		idem.WithEventKeySecret([]byte("a secret of 16 bytes or more"))}, opts...)...)
	t.Cleanup(func() { _ = c.Close() })
	return c, mr, reader, spans
}

// collect reads every metric: sums by name and outcome ("" without one),
// and histogram counts by name.
func collect(t *testing.T, reader *sdkmetric.ManualReader) (sums map[string]int64, hists map[string]uint64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums, hists = map[string]int64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelidem.ScopeName {
			t.Fatalf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					o, ok := p.Attributes.Value(otelidem.AttrOutcome)
					if !ok {
						o, _ = p.Attributes.Value(otelidem.AttrCheck)
					}
					sums[m.Name+"/"+o.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					o, _ := p.Attributes.Value(otelidem.AttrOutcome)
					hists[m.Name+"/"+o.AsString()] += p.Count
				}
			default:
				t.Fatalf("metric %s of type %T", m.Name, m.Data)
			}
		}
	}
	return sums, hists
}

func attrs(kv []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range kv {
		m[a.Key] = a.Value
	}
	return m
}

func TestMetricsAndSpans(t *testing.T) {
	c, mr, reader, spans := setup(t)
	ctx := context.Background()
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }

	// executed, replayed twice, a conflict, a released error.
	var inFn bool
	if _, err := c.Do(ctx, "order-1", "a", func(ctx context.Context) ([]byte, error) {
		inFn = true
		return nil, nil
	}); err != nil || !inFn {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.Do(ctx, "order-1", "a", ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Do(ctx, "order-1", "b", ok); !errors.Is(err, idem.ErrConflict) {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := c.Do(ctx, "order-2", "", func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	// A takeover: attempt 1's owner is gone, its lease ended.
	const ttl = 24 * time.Hour
	mr.Set("idem:{order-3}", "1p\x00\x04gone1:"+strconv.FormatInt(ttl.Milliseconds(), 10))
	mr.SetTTL("idem:{order-3}", ttl)
	if _, err := c.Do(ctx, "order-3", "", ok); err != nil {
		t.Fatal(err)
	}

	sums, hists := collect(t, reader)
	// Every counter's series exists, at zero where nothing happened.
	wantSums := map[string]int64{"idem.takeovers/": 1, "idem.lease_losses/": 0, "idem.late_retries/": 0, "idem.parked/": 0, "idem.recoveries/": 0,
		"idem.reconciliations/applied": 0, "idem.reconciliations/not_applied": 0, "idem.reconciliations/unknown": 0}
	for k := idem.EventKind(1); k.Outcome() || k == idem.EventWaited || k == idem.EventTookOver; k++ {
		if k.Outcome() {
			wantSums["idem.calls/"+k.String()] = 0
		}
	}
	for k, v := range map[string]int64{"executed": 2, "replayed": 2, "conflict": 1, "released": 1} {
		wantSums["idem.calls/"+k] = v
	}
	for k, v := range wantSums {
		if sums[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, sums[k], v, sums)
		}
	}
	if len(sums) != len(wantSums) {
		t.Errorf("sums %v, want %v", sums, wantSums)
	}
	if hists["idem.call.duration/replayed"] != 2 || hists["idem.call.duration/executed"] != 2 || hists["idem.owned.duration/"] != 3 {
		t.Errorf("histograms %v", hists)
	}

	ended := spans.Ended()
	if len(ended) != 6 {
		t.Fatalf("%d spans, want one per call (6)", len(ended))
	}
	var outcomes []string
	for _, s := range ended {
		if s.Name() != "idem.Do" {
			t.Errorf("span %q", s.Name())
		}
		a := attrs(s.Attributes())
		outcomes = append(outcomes, a[otelidem.AttrOutcome].AsString())
		if d := a[otelidem.AttrKeyDigest].AsString(); len(d) != 32 {
			t.Errorf("span %v: key digest %q", outcomes, d)
		}
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); v == "order-1" || v == "order-2" || v == "order-3" {
				t.Errorf("span carries a raw key: %v", kv)
			}
		}
	}
	if got := fmtList(outcomes); got != "executed replayed replayed conflict released executed" {
		t.Fatalf("span outcomes %s", got)
	}
	if ended[3].Status().Code != codes.Error || ended[3].Status().Description != "conflict" || ended[0].Status().Code == codes.Error {
		t.Errorf("statuses: %v, %v", ended[0].Status(), ended[3].Status())
	}
	if a := attrs(ended[5].Attributes()); a[otelidem.AttrAttempt].AsInt64() != 2 || len(ended[5].Events()) != 1 || ended[5].Events()[0].Name != "idem.took_over" {
		t.Errorf("takeover span: %v, events %v", ended[5].Attributes(), ended[5].Events())
	}
}

// fn's spans nest under the call's.
func TestFnSpanNests(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c := idem.New(rdb, idem.WithObserver(obs), idem.WithLogger(nil))
	defer c.Close()
	ctx, parent := tp.Tracer("test").Start(context.Background(), "handler")
	_, err = c.Do(ctx, "k", "", func(ctx context.Context) ([]byte, error) {
		_, s := tp.Tracer("test").Start(ctx, "bank.Debit")
		s.End()
		return nil, nil
	})
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = s
	}
	if byName["bank.Debit"].Parent().SpanID() != byName["idem.Do"].SpanContext().SpanID() ||
		byName["idem.Do"].Parent().SpanID() != byName["handler"].SpanContext().SpanID() {
		t.Fatalf("spans do not nest handler > idem.Do > bank.Debit: %v", byName)
	}
}

// Every outcome, and the steps, reach the right instruments (events given
// to Observe directly: the idem module's tests provoke each kind for real).
func TestEveryKind(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var n int64
	for k := idem.EventKind(1); k.Outcome() || k == idem.EventWaited || k == idem.EventTookOver; k++ {
		n++
		obs.Observe(ctx, idem.Event{Kind: k, Attempt: 2, Duration: time.Second, Wait: time.Millisecond, Owned: time.Millisecond})
	}
	sums, hists := collect(t, reader)
	for k := idem.EventKind(1); k.Outcome(); k++ {
		if sums["idem.calls/"+k.String()] != 1 || hists["idem.call.duration/"+k.String()] != 1 {
			t.Errorf("%v: calls %d, durations %d", k, sums["idem.calls/"+k.String()], hists["idem.call.duration/"+k.String()])
		}
	}
	if sums["idem.takeovers/"] != 1 || sums["idem.lease_losses/"] != 1 || hists["idem.wait.duration/"] != 1 || hists["idem.owned.duration/"] != 6 {
		t.Errorf("sums %v, histograms %v", sums, hists)
	}
	if n != 14 {
		t.Errorf("%d kinds", n)
	}
	if sums["idem.parked/"] != 1 {
		t.Errorf("parked %d, want 1 (all: %v)", sums["idem.parked/"], sums)
	}
	for _, c := range []idem.Check{idem.CheckApplied, idem.CheckNotApplied, idem.CheckUnknown, idem.CheckNotApplied} {
		obs.Observe(ctx, idem.Event{Kind: idem.EventReconciled, Step: "charge", Check: c, Attempt: 2, Duration: time.Second})
	}
	sums, _ = collect(t, reader)
	for k, v := range map[string]int64{"applied": 1, "not_applied": 2, "unknown": 1} {
		if got := sums["idem.reconciliations/"+k]; got != v {
			t.Errorf("reconciliations %s: %d, want %d (all: %v)", k, got, v, sums)
		}
	}
	if sums["idem.calls/"+idem.EventReconciled.String()] != 0 || sums["idem.parked/"] != 1 {
		t.Errorf("a reconciliation counted as a call or a parked operation: %v", sums)
	}
	obs.Observe(ctx, idem.Event{Kind: idem.EventRecovered, Attempt: 3})
	sums, _ = collect(t, reader)
	if sums["idem.recoveries/"] != 1 || sums["idem.calls/"+idem.EventRecovered.String()] != 0 {
		t.Errorf("a recovery: %v", sums)
	}
}

func fmtList(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out
}

// A checked step's reconciliations are counted by result, and an
// operation it parks among the parked ones, with a span event naming the
// step.
func TestReconciledAndParked(t *testing.T) {
	c, _, reader, spans := setup(t)
	ctx := context.Background()
	lost := func(context.Context) (string, error) { return "", idem.Ambiguous(errors.New("read timeout")) }
	applied := func(context.Context) (string, idem.Check, error) { return "ch_1", idem.CheckApplied, nil }
	silent := func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil }
	step := func(check func(context.Context) (string, idem.Check, error)) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			v, err := idem.StepChecked(ctx, "charge", lost, check,
				idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
			return []byte(v), err
		}
	}
	if _, err := c.Do(ctx, "order-1", "", step(applied)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, "order-2", "", step(silent)); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("Do: %v, want ErrUnknownOutcome", err)
	}
	sums, _ := collect(t, reader)
	for k, v := range map[string]int64{"idem.reconciliations/applied": 1, "idem.reconciliations/not_applied": 0,
		"idem.reconciliations/unknown": 1, "idem.parked/": 1, "idem.calls/parked": 1, "idem.calls/executed": 1} {
		if sums[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, sums[k], v, sums)
		}
	}
	ended := spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans, want 2", len(ended))
	}
	for i, want := range []string{"applied", "unknown"} {
		ev := ended[i].Events()
		if len(ev) != 1 || ev[0].Name != "idem.reconciled" {
			t.Fatalf("span %d events %v, want one idem.reconciled", i, ev)
		}
		a := attrs(ev[0].Attributes)
		if a[otelidem.AttrStep].AsString() != "charge" || a[otelidem.AttrCheck].AsString() != want {
			t.Errorf("span %d: reconciled event %v, want step charge, check %s", i, ev[0].Attributes, want)
		}
	}
}
