package otelidem_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// ageHistogram returns idem.replay.age's one data point, or false.
func ageHistogram(t *testing.T, reader *sdkmetric.ManualReader) (metricdata.HistogramDataPoint[float64], bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "idem.replay.age" {
				if m.Unit != "s" || len(h.DataPoints) != 1 {
					t.Fatalf("idem.replay.age: unit %q, %d points", m.Unit, len(h.DataPoints))
				}
				return h.DataPoints[0], true
			}
		}
	}
	return metricdata.HistogramDataPoint[float64]{}, false
}

// A replay records how old its outcome was; a late retry, refused over
// a tombstone, counts in idem.late_retries, which exists at zero before.
func TestReplayAgeAndLateRetries(t *testing.T) {
	retention := 2 * time.Hour
	c, mr, reader, spans := setup(t, idem.WithRetention(retention), idem.WithTombstones(24*time.Hour))
	ctx := context.Background()
	now := time.Now()
	mr.SetTime(now)
	advance := func(d time.Duration) {
		now = now.Add(d)
		mr.SetTime(now)
		mr.FastForward(d)
	}
	sums, _ := collect(t, reader)
	if n, ok := sums["idem.late_retries/"]; !ok || n != 0 {
		t.Fatalf("before any call, idem.late_retries = %d (present %v); want a series at 0", n, ok)
	}
	if _, ok := ageHistogram(t, reader); ok {
		t.Fatal("idem.replay.age has a point before any replay")
	}

	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	if _, err := c.Do(ctx, "order-1", "a", ok); err != nil {
		t.Fatal(err)
	}
	advance(90 * time.Minute)
	if _, err := c.Do(ctx, "order-1", "a", ok); err != nil {
		t.Fatal(err)
	}
	p, found := ageHistogram(t, reader)
	if !found || p.Count != 1 || math.Abs(p.Sum-5400) > 1 {
		t.Fatalf("idem.replay.age: count %d, sum %v; want one replay 5400s old", p.Count, p.Sum)
	}
	// 5400s falls in the bucket (3600, 7200].
	i := slices.Index(p.Bounds, 7200)
	if i < 1 || p.Bounds[i-1] != 3600 || p.BucketCounts[i] != 1 {
		t.Errorf("bounds %v, counts %v; want the replay in (3600, 7200]", p.Bounds, p.BucketCounts)
	}
	replay := spans.Ended()[1]
	if a := attrs(replay.Attributes()); math.Abs(a[otelidem.AttrReplayAge].AsFloat64()-5400) > 1 {
		t.Errorf("replay span: %s = %v, want 5400", otelidem.AttrReplayAge, a[otelidem.AttrReplayAge])
	}

	advance(retention)
	if _, err := c.Do(ctx, "order-1", "a", ok); !errors.Is(err, idem.ErrLateRetry) {
		t.Fatalf("after the retention: %v; want ErrLateRetry", err)
	}
	sums, _ = collect(t, reader)
	if sums["idem.late_retries/"] != 1 || sums["idem.calls/late_retry"] != 1 {
		t.Errorf("idem.late_retries = %d, idem.calls{late_retry} = %d; want 1 and 1", sums["idem.late_retries/"], sums["idem.calls/late_retry"])
	}
	if p, _ := ageHistogram(t, reader); p.Count != 1 {
		t.Errorf("idem.replay.age counts %d, want 1: a late retry replays nothing", p.Count)
	}
}

func TestWithAgeBuckets(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithAgeBuckets(time.Hour, 20*time.Hour, 24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(context.Background(), idem.Event{Kind: idem.EventReplayed, Age: 22 * time.Hour})
	p, _ := ageHistogram(t, reader)
	if !slices.Equal(p.Bounds, []float64{3600, 72000, 86400}) || !slices.Equal(p.BucketCounts, []uint64{0, 0, 1, 0}) {
		t.Errorf("bounds %v, counts %v", p.Bounds, p.BucketCounts)
	}
	for _, bad := range [][]time.Duration{nil, {0}, {time.Hour, time.Hour}, {2 * time.Hour, time.Hour}, {-time.Second}} {
		if _, err := otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithAgeBuckets(bad...)); err == nil {
			t.Errorf("WithAgeBuckets(%v): no error", bad)
		}
	}
}
