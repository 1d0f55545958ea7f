package httpidem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/idemtest"
)

// userScope scopes requests by their X-User header.
var userScope = httpidem.WithScope(func(r *http.Request) (string, error) {
	u := r.Header.Get("X-User")
	if u == "" {
		return "", httpidem.Unauthenticated("Basic", errors.New("who are you?"))
	}
	return u, nil
})

// A recoverable request's stored input holds its method, target, body,
// key and scope, and of its headers only those WithRecovery names: not
// Authorization, not cookies, not the scope's own header. It is kept while
// the operation is unfinished (the handler answered 503), and gone once a
// retry finished it.
func TestRecoveryStoresTheRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t, idem.WithLogger(nil))
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		mux := http.NewServeMux()
		mux.Handle("/debits", httpidem.New(keys, userScope, httpidem.WithRecovery("debit", "x-tenant"))(h))
		srv := serve(t, mux)
		hc := httpClient(t)
		q := req{path: "/debits?amount=12", key: "stored-1", body: `{"to":"bob-account"}`, header: http.Header{
			"X-User":        {"alice-principal"},
			"X-Tenant":      {"tenant-seven"},
			"Authorization": {"Bearer secret-token"},
			"Cookie":        {"session=cookie-value"},
		}}
		if got := send(t, hc, srv.URL, q); got.status != http.StatusServiceUnavailable {
			t.Fatalf("first: got %d, want 503", got.status)
		}
		inKey := "idem:{" + httpidem.ScopedKey("alice-principal", "stored-1") + "}:in"
		raw, ok := b.Do(t, "GET", inKey).(string)
		if !ok {
			t.Fatalf("%s: no stored input", inKey)
		}
		for _, want := range []string{"POST", "/debits?amount=12", `{"to":"bob-account"}`, "stored-1", "alice-principal", "X-Tenant", "tenant-seven", "application/json"} {
			if !strings.Contains(raw, want) {
				t.Errorf("stored input %q: %q missing", raw, want)
			}
		}
		for _, secret := range []string{"Authorization", "secret-token", "Cookie", "cookie-value", "X-User"} {
			if strings.Contains(raw, secret) {
				t.Errorf("stored input %q holds %q, which WithRecovery does not name", raw, secret)
			}
		}
		if got := send(t, hc, srv.URL, q); got.status != http.StatusCreated {
			t.Fatalf("retry: got %d, want 201", got.status)
		}
		if n := b.Do(t, "EXISTS", inKey).(int64); n != 0 {
			t.Errorf("stored input still there after the operation finished")
		}
	})
}

// Under WithRecovery, the key-reuse check is WithFingerprint's, as
// without it: the same JSON written otherwise replays, another body gets
// 422.
func TestRecoveryKeepsTheFingerprint(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t, idem.WithLogger(nil))
		var c counter
		srv := serve(t, httpidem.New(keys, httpidem.WithRecovery("debit"), httpidem.WithLogger(nil))(c.debit()))
		hc := httpClient(t)
		first := send(t, hc, srv.URL, req{key: "fp-1", body: `{"a":1,"b":2}`})
		if first.status != http.StatusCreated {
			t.Fatalf("first: got %d, want 201", first.status)
		}
		again := send(t, hc, srv.URL, req{key: "fp-1", body: "{ \"b\": 2, \"a\": 1.0 }"})
		if again.status != http.StatusCreated || !again.replayed() || again.body != first.body {
			t.Errorf("same JSON written otherwise: got %d %q (replayed %v), want the first response replayed", again.status, again.body, again.replayed())
		}
		if other := send(t, hc, srv.URL, req{key: "fp-1", body: `{"a":2}`}); other.status != http.StatusUnprocessableEntity {
			t.Errorf("another body: got %d, want 422", other.status)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// A request too large to store as an input runs, unrecoverable, and its
// response is stored and replayed as any other.
func TestRecoveryTooLargeRunsUnrecoverable(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t, idem.WithLogger(nil))
		var c counter
		srv := serve(t, httpidem.New(keys, httpidem.WithRecovery("debit"), httpidem.WithLogger(nil))(c.debit()))
		hc := httpClient(t)
		big := req{key: "big-1", ctype: "text/plain", body: strings.Repeat("x", idem.MaxInputSize+1)}
		first := send(t, hc, srv.URL, big)
		if first.status != http.StatusCreated {
			t.Fatalf("first: got %d, want 201", first.status)
		}
		if n := b.Do(t, "EXISTS", "idem:{"+httpidem.ScopedKey("", "big-1")+"}:in").(int64); n != 0 {
			t.Errorf("an input was stored for a request over idem.MaxInputSize")
		}
		again := send(t, hc, srv.URL, big)
		if !again.replayed() || again.body != first.body {
			t.Errorf("retry: got %d %q (replayed %v), want the first response replayed", again.status, again.body, again.replayed())
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// The operation's name is registered once per Client: a second handler
// wrapped with it panics, as idem.Register does; StatusHandler, given the
// same options, registers nothing.
func TestRecoveryRegistersOnce(t *testing.T) {
	keys := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	opts := []httpidem.Option{httpidem.WithRecovery("debit"), httpidem.WithLogger(nil)}
	mw := httpidem.New(keys, opts...)
	mw(http.NotFoundHandler())
	_ = httpidem.StatusHandler(keys, opts...)
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(p.(string), `"debit"`) {
			t.Errorf("second wrap: got panic %v, want one naming the operation", p)
		}
	}()
	mw(http.NotFoundHandler())
}

// WithRecovery refuses an empty name and bad header names.
func TestRecoveryOptionChecked(t *testing.T) {
	keys := idemtest.Miniredis(t).Idem(t, idem.WithLogger(nil))
	for _, o := range []httpidem.Option{httpidem.WithRecovery(""), httpidem.WithRecovery("x", "bad header")} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New accepted an invalid WithRecovery")
				}
			}()
			httpidem.New(keys, o, httpidem.WithLogger(nil))
		}()
	}
}

// A recoverable debit that commits its response through the ledger debits
// once, as without WithRecovery: a retry after Redis lost everything runs
// the handler, whose commit meets the row, and gets the committed response.
func TestRecoveryLedgerDebitOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := newBank()
		h := &debitHandler{bank: bk}
		var srvs []string
		for range 2 {
			c := b.Idem(t, idem.WithLedger(bk), idem.WithLogger(nil))
			srvs = append(srvs, serve(t, httpidem.New(c, httpidem.WithRecovery("debit"), httpidem.WithLogger(nil))(h)).URL)
		}
		hc := httpClient(t)
		q := req{key: "debit-r1", body: `{"Amount":100}`}
		first := send(t, hc, srvs[0], q)
		if first.status != http.StatusCreated || first.replayed() || first.body != `{"receipt":1,"amount":100}` {
			t.Fatalf("first: %d replayed %v %s", first.status, first.replayed(), first.body)
		}
		sameResponse(t, "retry", send(t, hc, srvs[1], q), first)
		redisClient(t, b).FlushAll(context.Background())
		sameResponse(t, "retry after FLUSHALL", send(t, hc, srvs[1], q), first)
		sameResponse(t, "retry after the ledger's replay", send(t, hc, srvs[0], q), first)
		if bal, n := bk.state(); bal != 900 || n != 1 {
			t.Fatalf("balance %d after %d movements; want 900 after 1", bal, n)
		}
	})
}
