package httpidem_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// The handler ran past its lease, unrenewed, and another instance took
// the key over and answered: this request's response was not recorded
// (Do returns ErrLeaseLost), so it answers 500 ProblemNotRecorded, never
// the handler's response as if it were the key's outcome.
func TestLeaseLostWhileTheHandlerRuns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		if b.MR == nil {
			t.Skip("needs miniredis's clock: on a real server the owner's renewals keep its lease")
		}
		const lease = 10 * time.Second
		var first, second counter
		started, release := make(chan struct{}), make(chan struct{})
		inner := first.debit()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			inner.ServeHTTP(w, r)
		})
		srv1 := serve(t, httpidem.New(b.Idem(t, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond), idem.WithLogger(nil)),
			httpidem.WithLogger(nil))(h))
		srv2 := serve(t, httpidem.New(b.Idem(t, idem.WithLease(lease), idem.WithLogger(nil)), httpidem.WithLogger(nil))(second.debit()))
		hc := httpClient(t)
		got := make(chan answer, 1)
		go func() {
			a, err := trySend(hc, srv1.URL, req{key: "ll", body: `{}`})
			if err != nil {
				t.Error(err)
			}
			got <- a
		}()
		<-started
		b.Advance(t, lease+time.Second) // the first instance's lease ends unrenewed
		if a := send(t, hc, srv2.URL, req{key: "ll", body: `{}`}); a.status != http.StatusCreated {
			t.Fatalf("the takeover: %d %s", a.status, a.body)
		}
		close(release)
		wantProblem(t, <-got, http.StatusInternalServerError, httpidem.ProblemNotRecorded)
		if first.runs() != 1 || second.runs() != 1 {
			t.Fatalf("runs %d and %d; want 1 and 1", first.runs(), second.runs())
		}
	})
}
