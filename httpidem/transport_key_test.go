package httpidem_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// An Idempotency-Key header that is present but empty (or an empty RFC
// 8941 string) is no key: outside an idem call the transport stamps its
// own and retries under it; inside one, the step's key replaces it. The
// provider never sees an empty key.
func TestTransportEmptyKeyIsNoKey(t *testing.T) {
	t.Parallel()
	for _, empty := range []string{"", " ", `""`} {
		p, srv, hc := startProvider(t, nil, status(503))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", empty)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := p.requests()
		if len(got) != 2 || !keyHeader.MatchString(got[0].key) || got[1].key != got[0].key {
			t.Fatalf("header %q: the provider got %+v; want two tries under one stamped key", empty, got)
		}
	}
	eachBackend(t, func(t *testing.T, b *backend) {
		p, srv, hc := startProvider(t, nil)
		c := b.Idem(t)
		_, err := idem.Do(context.Background(), c, "k", "", func(ctx context.Context) (int, error) {
			return idem.Step(ctx, "charge", func(ctx context.Context) (int, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
				req.Header.Set("Idempotency-Key", "")
				resp, err := hc.Do(req)
				if err != nil {
					return 0, err
				}
				resp.Body.Close()
				if want := strconv.Quote(idem.StepKey(ctx, "charge")); p.requests()[0].key != want {
					t.Errorf("inside a step: key %q, want the step's %s", p.requests()[0].key, want)
				}
				return 0, nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// Inside an idem call every request is sent once, its own Idempotency-Key
// included: the next attempt of the operation is the retry.
func TestTransportOwnKeySentOnceInsideDo(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		p, srv, hc := startProvider(t, nil, status(503), status(503), status(503))
		c := b.Idem(t)
		_, err := idem.Do(context.Background(), c, "k", "", func(ctx context.Context) (int, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("own"))
			req.Header.Set("Idempotency-Key", "mine")
			resp, err := hc.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.requests(); len(got) != 1 || got[0].key != "mine" {
			t.Fatalf("the provider got %+v; want the request once, with its own key", got)
		}
	})
}
