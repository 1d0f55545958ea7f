package httpidem_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// Limits set on both the middleware and the Client must agree: New panics
// on a middleware limit the Client would refuse, and the middleware's
// defaults follow the Client's.
func TestLimitsFitTheClient(t *testing.T) {
	t.Parallel()
	b := &backend{Addr: miniredis.RunT(t).Addr()}
	small := b.Idem(t, idem.WithMaxResultSize(1000), idem.WithMaxKeyLen(40))
	for name, tc := range map[string]struct {
		f    func()
		says []string
	}{
		"response over the Client's": {func() { httpidem.New(small, httpidem.WithMaxResponse(2000)) },
			[]string{"WithMaxResponse(2000)", "WithMaxResultSize(1000)"}},
		"key over the Client's": {func() { httpidem.New(small, httpidem.WithMaxKeyLen(39)) },
			[]string{"WithMaxKeyLen(39)", "WithMaxKeyLen(40)", "at most 38"}},
		"no room for a key": {func() { httpidem.New(b.Idem(t, idem.WithMaxKeyLen(2))) },
			[]string{"WithMaxKeyLen(2) leaves no room"}},
	} {
		func() {
			defer func() {
				p := fmt.Sprint(recover())
				for _, s := range tc.says {
					if !strings.Contains(p, s) {
						t.Errorf("%s: panic %q does not say %q", name, p, s)
					}
				}
			}()
			tc.f()
		}()
	}
	httpidem.New(small, httpidem.WithMaxResponse(1000), httpidem.WithMaxKeyLen(38)) // at the limits: fine

	// The defaults: the Client's key limit less the scope's prefix, and its
	// result limit.
	var c counter
	var logs syncBuffer
	srv := serve(t, httpidem.New(small, httpidem.WithLogger(slogTo(&logs)))(c.debit()))
	hc := httpClient(t)
	if a := send(t, hc, srv.URL, req{key: strings.Repeat("k", 38), body: `{"amount":1}`}); a.status != http.StatusCreated {
		t.Errorf("a key of 38 bytes: %d %s", a.status, a.body)
	}
	a := send(t, hc, srv.URL, req{key: strings.Repeat("k", 39), body: `{"amount":1}`})
	wantProblem(t, a, http.StatusBadRequest, httpidem.ProblemKeyInvalid)
	if !strings.Contains(a.body, "longer than 38 bytes") {
		t.Errorf("a key of 39 bytes: %s, want the middleware's own limit named", a.body)
	}
	big := serve(t, httpidem.New(small, httpidem.WithLogger(slogTo(&logs)))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("x", 1500)))
	})))
	if a := send(t, hc, big.URL, req{key: "big"}); a.status != http.StatusOK || len(a.body) != 1500 {
		t.Errorf("a 1500-byte response: %d, %d bytes", a.status, len(a.body))
	}
	if !strings.Contains(logs.String(), "larger than WithMaxResponse sent unbuffered") {
		t.Errorf("a response over the Client's limit was buffered, not streamed: %s", logs.String())
	}
}

// A scope function that returns Unauthenticated gets 401 with its
// challenge in WWW-Authenticate; any error with a WWWAuthenticate method
// does too.
func TestUnauthenticatedChallenge(t *testing.T) {
	t.Parallel()
	b := &backend{Addr: miniredis.RunT(t).Addr()}
	scope := func(r *http.Request) (string, error) {
		switch r.Header.Get("Authorization") {
		case "":
			return "", httpidem.Unauthenticated(`Bearer realm="debits"`, errors.New("no bearer token"))
		case "expired":
			return "", fmt.Errorf("token: %w", httpidem.Unauthenticated(`Bearer error="invalid_token"`, nil))
		}
		return "", errors.New("unknown token")
	}
	var c counter
	srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithScope(scope))(c.debit()))
	hc := httpClient(t)
	a := send(t, hc, srv.URL, req{key: "k", body: `{}`})
	wantProblem(t, a, http.StatusUnauthorized, httpidem.ProblemScope)
	if got := a.header.Get("WWW-Authenticate"); got != `Bearer realm="debits"` || !strings.Contains(a.body, "no bearer token") {
		t.Errorf("WWW-Authenticate %q, body %s", got, a.body)
	}
	a = send(t, hc, srv.URL, req{key: "k", body: `{}`, header: http.Header{"Authorization": {"expired"}}})
	wantProblem(t, a, http.StatusUnauthorized, httpidem.ProblemScope)
	if got := a.header.Get("WWW-Authenticate"); got != `Bearer error="invalid_token"` {
		t.Errorf("a wrapped Unauthenticated: WWW-Authenticate %q", got)
	}
	a = send(t, hc, srv.URL, req{key: "k", body: `{}`, header: http.Header{"Authorization": {"other"}}})
	wantProblem(t, a, http.StatusUnauthorized, httpidem.ProblemScope)
	if got := a.header.Get("WWW-Authenticate"); got != "" {
		t.Errorf("a plain error: WWW-Authenticate %q, want none", got)
	}
	if c.runs() != 0 {
		t.Errorf("the handler ran %d times", c.runs())
	}
}
