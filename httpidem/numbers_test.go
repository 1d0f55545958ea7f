package httpidem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem/httpidem"
)

// The same key with an amount that differs only beyond 2^53 is another
// request: 422, not a replay of the first; JSON nested too deep is 400.
func TestKeyReusedWithLargeNumbers(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t))(c.debit()))
		hc := httpClient(t)
		if a := send(t, hc, srv.URL, req{key: "big", body: `{"amount":9007199254740993}`}); a.status != http.StatusCreated {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "big", body: `{"amount":9007199254740992}`}),
			http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		if a := send(t, hc, srv.URL, req{key: "big", body: `{"amount":9007199254740993.0}`}); !a.replayed() {
			t.Errorf("the same amount spelled otherwise: %d %s, want a replay", a.status, a.body)
		}
		deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
		wantProblem(t, send(t, hc, srv.URL, req{key: "deep", body: deep}), http.StatusBadRequest, httpidem.ProblemBadRequest)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}
