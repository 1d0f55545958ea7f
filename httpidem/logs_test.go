package httpidem_test

import (
	"context"
	"github.com/idem-go/idem/internal/redistest"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// What the middleware logs names the key by its digest (the Client's, as
// in its events), never the key itself: a stored response that cannot be
// read, and Redis unreachable, whose error quotes the key.
func TestLogsNeverNameTheKey(t *testing.T) {
	t.Parallel()
	const key = "secret-order-77"
	eachBackend(t, func(t *testing.T, b *backend) {
		var logs syncBuffer
		keys := b.Idem(t)
		srv := serve(t, httpidem.New(keys, httpidem.WithLogger(slogTo(&logs)))(http.NotFoundHandler()))
		ctx := context.Background()
		if _, err := keys.Do(ctx, "0:"+key, "", func(context.Context) ([]byte, error) { return []byte("not a response"), nil }); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, send(t, httpClient(t), srv.URL, req{key: key}), http.StatusInternalServerError, httpidem.ProblemServerError)
		if got := logs.String(); !strings.Contains(got, "stored response unreadable") || !strings.Contains(got, "key_digest=") || strings.Contains(got, key) {
			t.Errorf("log %q: want the unreadable response with the key's digest, not the key", got)
		}
	})

	down := &backend{Name: "closed port", Addr: redistest.RefusedAddr(t)}
	var logs syncBuffer
	srv := serve(t, httpidem.New(down.Idem(t), httpidem.WithLogger(slogTo(&logs)))(http.NotFoundHandler()))
	wantProblem(t, send(t, httpClient(t), srv.URL, req{key: key, body: `{}`}), http.StatusServiceUnavailable, httpidem.ProblemUnavailable)
	if got := logs.String(); !strings.Contains(got, "cannot reach") || !strings.Contains(got, "key_digest=") || strings.Contains(got, key) {
		t.Errorf("log %q: want Redis unreachable with the key's digest, not the key", got)
	}
}

// Without WithLogger, the middleware logs to slog.Default(), as the
// Client does: a Redis outage is visible without configuration. Not
// parallel: it sets slog's default, which other tests would log to.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	var logs syncBuffer
	old := slog.Default()
	slog.SetDefault(slogTo(&logs))
	t.Cleanup(func() { slog.SetDefault(old) })

	down := &backend{Name: "closed port", Addr: redistest.RefusedAddr(t)}
	srv := serve(t, httpidem.New(down.Idem(t, idem.WithLogger(slog.New(slog.DiscardHandler))))(http.NotFoundHandler()))
	wantProblem(t, send(t, httpClient(t), srv.URL, req{key: "k-1", body: `{}`}), http.StatusServiceUnavailable, httpidem.ProblemUnavailable)
	if got := logs.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "cannot reach the idempotency store") {
		t.Errorf("slog.Default got %q; want the outage at ERROR", got)
	}
}
