package httpidem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// A status check answers each state of a key's operation: the stored
// response (replayed), in progress, not finished, unknown; another
// principal's key is unknown; no key, a bad key, another method are
// refused; the handler never runs for a check.
func TestStatusHandler(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t, idem.WithLogger(nil))
		var c counter
		release := make(chan struct{})
		inner := c.debit()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Header.Get("X-Mode") {
			case "slow":
				<-release
			case "fail":
				w.WriteHeader(http.StatusServiceUnavailable) // transient: the key is released
				return
			case "unsettled":
				// A provider call whose outcome no check settles: parked.
				_, err := idem.StepChecked(r.Context(), "charge",
					func(context.Context) (string, error) { return "", idem.Ambiguous(errors.New("timeout")) },
					func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil },
					idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
				if err != nil {
					w.WriteHeader(http.StatusAccepted) // swallowed: the operation stays parked all the same
					return
				}
			}
			inner.ServeHTTP(w, r)
		})
		scope := httpidem.WithScope(func(r *http.Request) (string, error) {
			u := r.Header.Get("X-User")
			if u == "" {
				return "", httpidem.Unauthenticated("Basic", errors.New("who are you?"))
			}
			return u, nil
		})
		mux := http.NewServeMux()
		mux.Handle("/debits", httpidem.New(keys, scope, httpidem.WithRetryAfter(2*time.Second))(h))
		mux.Handle("/status", httpidem.StatusHandler(keys, scope, httpidem.WithRetryAfter(2*time.Second)))
		srv := serve(t, mux)
		hc := httpClient(t)
		alice := http.Header{"X-User": {"alice"}}
		check := func(key string, hdr http.Header) answer {
			return send(t, hc, srv.URL, req{method: http.MethodGet, path: "/status", key: key, header: hdr})
		}

		first := send(t, hc, srv.URL, req{key: "done-1", body: `{"amount":100}`, header: alice})
		if first.status != http.StatusCreated {
			t.Fatalf("POST: %d %s", first.status, first.body)
		}
		a := check("done-1", alice)
		if a.status != http.StatusCreated || !a.replayed() || a.body != first.body {
			t.Errorf("check of a done key: %d %q replayed=%v; want the stored response, replayed", a.status, a.body, a.replayed())
		}
		wantProblem(t, check("done-1", http.Header{"X-User": {"mallory"}}), http.StatusNotFound, httpidem.ProblemKeyUnknown)
		wantProblem(t, check("never-sent", alice), http.StatusNotFound, httpidem.ProblemKeyUnknown)
		wantProblem(t, check("done-1", nil), http.StatusUnauthorized, httpidem.ProblemScope)

		slow := make(chan answer, 1)
		go func() {
			slow <- send(t, httpClient(t), srv.URL, req{key: "slow-1", body: `{}`, header: http.Header{"X-User": {"alice"}, "X-Mode": {"slow"}}})
		}()
		deadline := time.Now().Add(20 * time.Second)
		for {
			st, err := keys.Status(context.Background(), httpidem.ScopedKey("alice", "slow-1"))
			if err == nil && st.State == idem.StateInProgress {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the slow request never started: %+v, %v", st, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		a = check("slow-1", alice)
		wantProblem(t, a, http.StatusConflict, httpidem.ProblemInProgress)
		if got := a.header.Get("Retry-After"); got != "2" {
			t.Errorf("in progress: Retry-After %q, want 2", got)
		}
		close(release)
		if s := recv(t, slow); s.status != http.StatusCreated {
			t.Fatalf("slow POST: %d %s", s.status, s.body)
		}
		if a := check("slow-1", alice); a.status != http.StatusCreated || !a.replayed() {
			t.Errorf("check after the slow request finished: %d, replayed %v", a.status, a.replayed())
		}

		if f := send(t, hc, srv.URL, req{key: "fail-1", body: `{}`, header: http.Header{"X-User": {"alice"}, "X-Mode": {"fail"}}}); f.status != http.StatusServiceUnavailable {
			t.Fatalf("failing POST: %d", f.status)
		}
		wantProblem(t, check("fail-1", alice), http.StatusConflict, httpidem.ProblemNotFinished)

		if p := send(t, hc, srv.URL, req{key: "parked-1", body: `{}`, header: http.Header{"X-User": {"alice"}, "X-Mode": {"unsettled"}}}); p.status != http.StatusConflict {
			t.Fatalf("unsettled POST: %d %s; want 409 (outcome unknown)", p.status, p.body)
		}
		wantProblem(t, check("parked-1", alice), http.StatusConflict, httpidem.ProblemOutcomeUnknown)

		runs := c.runs()
		wantProblem(t, send(t, hc, srv.URL, req{method: http.MethodGet, path: "/status", noKey: true, header: alice}), http.StatusBadRequest, httpidem.ProblemKeyMissing)
		wantProblem(t, check("bad key", alice), http.StatusBadRequest, httpidem.ProblemKeyInvalid)
		a = send(t, hc, srv.URL, req{method: http.MethodPost, path: "/status", key: "done-1", header: alice})
		wantProblem(t, a, http.StatusMethodNotAllowed, httpidem.ProblemBadRequest)
		if got := a.header.Get("Allow"); got != http.MethodGet {
			t.Errorf("405 without Allow: GET (%q)", got)
		}
		if c.runs() != runs {
			t.Errorf("status checks ran the handler %d times", c.runs()-runs)
		}
		if !strings.Contains(first.body, "100") {
			t.Errorf("first response %q lacks the amount", first.body)
		}
	})
}
