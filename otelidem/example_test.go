package otelidem_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/otelidem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Idem's metrics, scraped by Prometheus through OpenTelemetry's Prometheus
// exporter: a service serves /metrics, and the counters by outcome and the
// histograms appear as idem_calls_total, idem_call_duration_seconds and
// so on. Every outcome's counter is there from the start, at zero.
func Example_prometheus() {
	// The exporter is a metric reader that registers with a Prometheus
	// registry (the default one with no WithRegisterer).
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}

	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithObserver(obs), idem.WithLogger(nil))
	defer keys.Close()

	ctx := context.Background()
	for _, fp := range []string{"amount=100", "amount=100", "amount=100", "amount=999"} {
		_, _ = keys.Do(ctx, "order-1", fp, func(context.Context) ([]byte, error) { return []byte("receipt"), nil })
	}

	// The service's /metrics, as Prometheus scrapes it.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	printSeries(resp.Body, regexp.MustCompile(`^(idem_calls_total|idem_call_duration_seconds_count)\{`))
	// Output:
	// idem_call_duration_seconds_count{idem_outcome="conflict"} 1
	// idem_call_duration_seconds_count{idem_outcome="executed"} 1
	// idem_call_duration_seconds_count{idem_outcome="replayed"} 2
	// idem_calls_total{idem_outcome="conflict"} 1
	// idem_calls_total{idem_outcome="error"} 0
	// idem_calls_total{idem_outcome="executed"} 1
	// idem_calls_total{idem_outcome="failed"} 0
	// idem_calls_total{idem_outcome="in_progress"} 0
	// idem_calls_total{idem_outcome="late_retry"} 0
	// idem_calls_total{idem_outcome="lease_lost"} 0
	// idem_calls_total{idem_outcome="ledger_replayed"} 0
	// idem_calls_total{idem_outcome="not_recorded"} 0
	// idem_calls_total{idem_outcome="parked"} 0
	// idem_calls_total{idem_outcome="released"} 0
	// idem_calls_total{idem_outcome="replayed"} 2
}

// printSeries prints the lines of a Prometheus text exposition that match
// re, without labels Prometheus or the exporter add on their own.
func printSeries(r io.Reader, re *regexp.Regexp) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := sc.Text(); re.MatchString(line) && !strings.HasPrefix(line, "#") {
			fmt.Println(line)
		}
	}
}

// The series that tell whether the retention is long enough, as
// Prometheus scrapes them: the age of replayed outcomes, and the late
// retries refused over a tombstone (idem.WithTombstones). A retry came 90
// minutes after its outcome (retention 2h), another after the retention.
func Example_retention() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	obs, err := otelidem.New(otelidem.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	now := time.Now()
	wait := func(d time.Duration) { // miniredis's clock, for the example
		now = now.Add(d)
		mr.SetTime(now)
		mr.FastForward(d)
	}
	wait(0)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithObserver(obs), idem.WithLogger(nil),
		idem.WithRetention(2*time.Hour), idem.WithTombstones(7*24*time.Hour))
	defer keys.Close()

	ctx := context.Background()
	debit := func(context.Context) ([]byte, error) { return []byte("receipt"), nil }
	_, _ = keys.Do(ctx, "order-1", "amount=100", debit)
	wait(90 * time.Minute)
	_, _ = keys.Do(ctx, "order-1", "amount=100", debit) // replayed, 90 minutes old
	wait(3 * time.Hour)
	_, err = keys.Do(ctx, "order-1", "amount=100", debit) // after the retention
	fmt.Println(errors.Is(err, idem.ErrLateRetry))

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	printSeries(resp.Body, regexp.MustCompile(`^(idem_late_retries_total|idem_replay_age_seconds_(sum|count)|idem_replay_age_seconds_bucket\{le="(3600|7200)"\})`))
	// Output:
	// true
	// idem_late_retries_total 1
	// idem_replay_age_seconds_bucket{le="3600"} 0
	// idem_replay_age_seconds_bucket{le="7200"} 1
	// idem_replay_age_seconds_sum 5400
	// idem_replay_age_seconds_count 1
}
