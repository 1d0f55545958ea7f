package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// slowBank is the newcomer's handler (issue 34): a debit, then a
// provider's charge that takes 200 ms, both counted; a handler whose
// context ends first gives up before the charge and answers 503.
type slowBank struct{ debits, charges atomic.Int64 }

func (b *slowBank) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.debits.Add(1)
		select {
		case <-time.After(200 * time.Millisecond): // the provider's charge
			b.charges.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("charged"))
		case <-r.Context().Done():
			http.Error(w, "gave up", http.StatusServiceUnavailable)
		}
	})
}

// The newcomer's case through real HTTP: the client's timeout (150 ms) is
// shorter than the handler (200 ms), and it retries with one key every
// 50 ms. The handler goes on after the client left, its response is
// stored, and a retry gets it: one debit, one charge.
func TestHandlerOutlivesTheClient(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be *backend) {
		var bk slowBank
		srv := serve(t, httpidem.New(be.Idem(t), httpidem.WithLogger(nil))(bk.handler()))
		hc := httpClient(t)
		hc.Timeout = 150 * time.Millisecond
		successes, first := 0, -1
		for i := range 10 {
			a, err := trySend(hc, srv.URL, req{key: "order-1", body: `{"amount":100}`})
			switch {
			case err == nil && a.status == http.StatusCreated && a.body == "charged":
				successes++
				if first < 0 {
					first = i
				}
			case err == nil:
				t.Logf("retry %d: %d %s", i, a.status, a.body)
			case !errors.Is(err, context.DeadlineExceeded):
				t.Logf("retry %d: %v", i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The handler of the last retry may still wait for the first
		// one's outcome; none of them charges.
		if successes == 0 || bk.debits.Load() != 1 || bk.charges.Load() != 1 {
			t.Fatalf("%d successes in 10 retries, %d debits, %d charges; want a success, one debit and one charge",
				successes, bk.debits.Load(), bk.charges.Load())
		}
		t.Logf("first success at retry %d", first)
	})
}

// A handler that streams its response (over WithMaxResponse) after its
// client has gone writes nothing to the connection (the race detector
// would see it): its writes fail, and the key is finished as not stored,
// as for any streamed response. WithHandlerTimeout bounds a handler that
// waits for its context.
func TestDetachedHandlerBounds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be *backend) {
		writes := make(chan error, 1)
		timedOut := make(chan error, 1)
		// The client leaves once its handler has started (leave), not on
		// a timer: with a 100ms client timeout, a loaded machine (load
		// 21) let the client go before the request reached a handler,
		// which then never ran.
		started, left := make(chan struct{}, 4), make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			if r.URL.Path == "/wait" {
				<-r.Context().Done()
				timedOut <- context.Cause(r.Context())
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			<-left
			w.WriteHeader(http.StatusOK)
			_, err := w.Write(make([]byte, 4096))
			writes <- err
		})
		c := be.Idem(t)
		srv := serve(t, httpidem.New(c, httpidem.WithLogger(nil), httpidem.WithMaxResponse(1024),
			httpidem.WithHandlerTimeout(time.Second))(h))
		hc := httpClient(t)
		leave := func(path, key string) error {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set(httpidem.HeaderIdempotencyKey, key)
			sent := make(chan error, 1)
			go func() {
				resp, err := hc.Do(r)
				if err == nil {
					_ = resp.Body.Close()
				}
				sent <- err
			}()
			recv(t, started)
			cancel()
			return recv(t, sent)
		}
		if err := leave("/debits", "big"); err == nil {
			t.Fatal("the client got an answer before it left")
		}
		// The server notices the closed connection in its own time: the
		// handler writes 300ms after the client left, as it wrote 200ms
		// after the client's timeout before.
		time.Sleep(300 * time.Millisecond)
		close(left)
		if err := recv(t, writes); err == nil {
			t.Fatal("a detached handler's streamed write succeeded after its client had gone")
		}
		hc.Timeout = 10 * time.Second
		if a := send(t, hc, srv.URL, req{key: "big"}); a.status != http.StatusInternalServerError || !strings.Contains(a.body, "ProblemNotStored") {
			t.Fatalf("retry: %d %s; want 500 ProblemNotStored", a.status, a.body)
		}

		start := time.Now()
		if err := leave("/wait", "wait"); err == nil {
			t.Fatal("the client got an answer before it left")
		}
		if err := recv(t, timedOut); !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "WithHandlerTimeout") {
			t.Fatalf("the handler's context ended with %v; want WithHandlerTimeout's", err)
		}
		if d := time.Since(start); d < time.Second {
			t.Fatalf("the handler's context ended after %v; want WithHandlerTimeout's 1s, not the client's 100ms", d)
		}
		// The 503 releases the key; wait for it, so that nothing runs on.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			st, err := c.Status(context.Background(), httpidem.ScopedKey("", "wait"))
			if err == nil && st.State == idem.StateReleased {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the timed-out handler's key: %+v, %v; want released", st, err)
			}
		}
	})
}

// WithHandlerTimeout must be positive.
func TestHandlerTimeoutInvalid(t *testing.T) {
	t.Parallel()
	c := (&backend{Addr: "127.0.0.1:1"}).Idem(t)
	for _, d := range []time.Duration{0, -time.Second} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "WithHandlerTimeout") {
					t.Errorf("WithHandlerTimeout(%v): New panicked with %v; want a panic naming it", d, p)
				}
			}()
			httpidem.New(c, httpidem.WithHandlerTimeout(d))
		}()
	}
}
