package httpidem_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// A retry after the retention, with tombstones, gets 410 ProblemLateRetry,
// and the handler does not run again; the same key with another request
// gets 422 as before (docs/faults.md row 42).
func TestLateRetry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		retention := time.Second
		keys := b.Idem(t, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithLease(500*time.Millisecond), idem.WithRetention(retention), idem.WithTombstones(time.Hour))
		srv := serve(t, httpidem.New(keys)(c.debit()))
		hc := httpClient(t)
		q := req{key: "late", body: `{"amount":100}`}
		if a := send(t, hc, srv.URL, q); a.status != http.StatusCreated {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
		b.Advance(t, retention+200*time.Millisecond) // miniredis: at once; a real server: waited for
		a := send(t, hc, srv.URL, q)
		wantProblem(t, a, http.StatusGone, httpidem.ProblemLateRetry)
		if cc := a.header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("Cache-Control %q, want no-store (410 is cacheable by default)", cc)
		}
		if !strings.Contains(a.body, "no longer kept") {
			t.Errorf("detail does not say the response is gone: %s", a.body)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "late", body: `{"amount":999}`}), http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		// A key never used still runs.
		if a := send(t, hc, srv.URL, req{key: "fresh", body: `{"amount":100}`}); a.status != http.StatusCreated {
			t.Errorf("a new key: %d %s", a.status, a.body)
		}
	})
}
