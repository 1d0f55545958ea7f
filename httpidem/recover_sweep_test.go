package httpidem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// recovering runs keys.Recover until the test ends.
func recovering(t *testing.T, keys *idem.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = keys.Recover(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// checkUntil sends status checks of rec-1 until one answers want (and its
// body holds has), or fails the test after 30 seconds.
func checkUntil(t *testing.T, hc *http.Client, base string, hdr http.Header, want int, has string) answer {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := send(t, hc, base, req{method: http.MethodGet, path: "/status", key: "rec-1", header: hdr})
		if a.status == want && strings.Contains(a.body, has) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("status check: %d %s after 30s, want %d with %q", a.status, a.body, want, has)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A request whose handler fails the first time (a panic, or a 503), and
// whose client never comes back, is finished by the Client's Recover loop:
// it re-dispatches the stored request through the same handler, with its
// scope (ScopeFrom) and only the named headers; the status check and the
// retry of its principal get the stored response, another principal's
// check does not, and the handler ran twice in all.
func TestRecoverRedispatches(t *testing.T) {
	for _, failure := range []string{"panic", "503"} {
		t.Run(failure, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *backend) {
				keys := b.Idem(t, idem.WithRecoverAfter(100*time.Millisecond), idem.WithLogger(nil))
				var runs atomic.Int64
				type seen struct{ scope, tenant, auth, body string }
				saw := make(chan seen, 1)
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						if failure == "panic" {
							panic("the first run fails")
						}
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					body, _ := io.ReadAll(r.Body)
					scope, _ := httpidem.ScopeFrom(r.Context())
					saw <- seen{scope, r.Header.Get("X-Tenant"), r.Header.Get("Authorization"), string(body)}
					w.Header().Set("Location", "/debits/1")
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, `{"debited":12}`)
				})
				opts := []httpidem.Option{userScope, httpidem.WithRecovery("debit", "X-Tenant"), httpidem.WithLogger(nil)}
				mux := http.NewServeMux()
				mux.Handle("/debits", httpidem.New(keys, opts...)(h))
				mux.Handle("/status", httpidem.StatusHandler(keys, opts...))
				srv := serve(t, mux)
				hc := httpClient(t)
				alice := http.Header{"X-User": {"alice"}, "X-Tenant": {"t7"}, "Authorization": {"Bearer s"}}
				q := req{key: "rec-1", body: `{"amount":12}`, header: alice}
				if a, err := trySend(hc, srv.URL, q); err == nil && a.status != http.StatusServiceUnavailable {
					t.Fatalf("first: got %d, want 503 or a broken connection", a.status)
				}

				recovering(t, keys)
				got := checkUntil(t, hc, srv.URL, http.Header{"X-User": {"alice"}}, http.StatusCreated, "")
				if !got.replayed() || got.body != `{"debited":12}` || got.header.Get("Location") != "/debits/1" {
					t.Errorf("status check: %d %v %s", got.status, got.header, got.body)
				}
				s := recv(t, saw)
				if s.scope != "alice" || s.tenant != "t7" || s.auth != "" || s.body != `{"amount":12}` {
					t.Errorf("the recovered request: %+v; want scope alice, X-Tenant t7, no Authorization, the body", s)
				}
				if bob := send(t, hc, srv.URL, req{method: http.MethodGet, path: "/status", key: "rec-1", header: http.Header{"X-User": {"bob"}}}); bob.status != http.StatusNotFound {
					t.Errorf("bob's status check: got %d, want 404", bob.status)
				}
				retry := send(t, hc, srv.URL, q)
				if retry.status != http.StatusCreated || !retry.replayed() || retry.body != `{"debited":12}` {
					t.Errorf("alice's retry: %d %s", retry.status, retry.body)
				}
				if n := runs.Load(); n != 2 {
					t.Errorf("handler ran %d times, want 2", n)
				}
			})
		})
	}
}

// A request whose handler fails every time is parked after
// WithMaxRecoveries recoveries: its status check says parked
// (ProblemParked), a retry gets 409 without running the handler, and
// once the handler works again, Client.Retry has Recover finish it.
func TestRecoverParksThenRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t, idem.WithRecoverAfter(50*time.Millisecond), idem.WithMaxRecoveries(2), idem.WithLogger(nil))
		var runs atomic.Int64
		var healthy atomic.Bool
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if !healthy.Load() {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		opts := []httpidem.Option{userScope, httpidem.WithRecovery("debit"), httpidem.WithLogger(nil)}
		mux := http.NewServeMux()
		mux.Handle("/debits", httpidem.New(keys, opts...)(h))
		mux.Handle("/status", httpidem.StatusHandler(keys, opts...))
		srv := serve(t, mux)
		hc := httpClient(t)
		alice := http.Header{"X-User": {"alice"}}
		q := req{key: "rec-1", body: `{}`, header: alice}
		if a := send(t, hc, srv.URL, q); a.status != http.StatusBadGateway {
			t.Fatalf("first: got %d, want 502", a.status)
		}
		recovering(t, keys)
		checkUntil(t, hc, srv.URL, alice, http.StatusConflict, "ProblemParked")
		n := runs.Load()
		if n != 3 {
			t.Errorf("handler ran %d times before it was parked, want 3 (the request and 2 recoveries)", n)
		}
		if a := send(t, hc, srv.URL, q); a.status != http.StatusConflict || !strings.Contains(a.body, "ProblemParked") {
			t.Errorf("retry of the parked request: %d %s", a.status, a.body)
		}
		if runs.Load() != n {
			t.Errorf("a retry of the parked request ran the handler")
		}
		healthy.Store(true)
		if err := keys.Retry(context.Background(), httpidem.ScopedKey("alice", "rec-1")); err != nil {
			t.Fatal(err)
		}
		checkUntil(t, hc, srv.URL, alice, http.StatusCreated, "")
		if n := runs.Load(); n != 4 {
			t.Errorf("handler ran %d times in all, want 4", n)
		}
	})
}
