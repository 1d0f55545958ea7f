package httpidem_test

// NewTransport: step keys inside an idem call; outside one, a retrier that
// reuses one key per logical request.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// provider is a fake downstream server: it records each request's method,
// Idempotency-Key header and body, and answers with the next of its
// scripted answers (then 200).
type provider struct {
	t       testing.TB
	mu      sync.Mutex
	got     []seen
	answers []func(w http.ResponseWriter, r *http.Request)
}

type seen struct {
	method, key, body string
	at                time.Time
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.got = append(p.got, seen{r.Method, r.Header.Get("Idempotency-Key"), string(body), time.Now()})
	var answer func(http.ResponseWriter, *http.Request)
	if len(p.answers) > 0 {
		answer, p.answers = p.answers[0], p.answers[1:]
	}
	p.mu.Unlock()
	if answer != nil {
		answer(w, r)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

func (p *provider) requests() []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seen(nil), p.got...)
}

// startProvider serves p, with answers; its client goes through
// NewTransport with opts and short pauses.
func startProvider(t *testing.T, opts []httpidem.TransportOption, answers ...func(http.ResponseWriter, *http.Request)) (*provider, *httptest.Server, *http.Client) {
	t.Helper()
	p := &provider{t: t, answers: answers}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	opts = append([]httpidem.TransportOption{httpidem.WithBackoff(10*time.Millisecond, 50*time.Millisecond)}, opts...)
	return p, srv, &http.Client{Transport: httpidem.NewTransport(base, opts...)}
}

func status(code int, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, http.StatusText(code))
	}
}

// hangUp closes the connection without an answer: the outcome is unknown.
func hangUp(w http.ResponseWriter, r *http.Request) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		c.Close()
	}
}

func post(t *testing.T, hc *http.Client, ctx context.Context, url, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

var keyHeader = regexp.MustCompile(`^"idem-[a-z2-7]+"$`)

// Inside an idem call, a step's request carries the step's key: the same
// on every attempt, so a step that acted and failed before its checkpoint
// is sent again with the key the provider saw.
func TestTransportStampsStepKey(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		p, srv, hc := startProvider(t, nil)
		c := b.Idem(t)
		ctx := context.Background()
		var keys []string
		fn := func(ctx context.Context) (string, error) {
			a, _ := idem.AttemptFrom(ctx)
			return idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				keys = append(keys, idem.StepKey(ctx, "charge"))
				_, body, err := post(t, hc, ctx, srv.URL, "charge")
				if err != nil {
					return "", err
				}
				if a.Number == 1 {
					return "", errors.New("crashed before the checkpoint")
				}
				return body, nil
			})
		}
		if _, err := idem.Do(ctx, c, "debit-1", "", fn); err == nil {
			t.Fatal("attempt 1 succeeded")
		}
		if v, err := idem.Do(ctx, c, "debit-1", "", fn); err != nil || v != "ok" {
			t.Fatalf("attempt 2: %q, %v", v, err)
		}
		got := p.requests()
		if len(got) != 2 || len(keys) != 2 {
			t.Fatalf("the provider got %d requests, want 2", len(got))
		}
		for i, r := range got {
			if want := strconv.Quote(keys[i]); r.key != want || keys[i] != keys[0] || !keyHeader.MatchString(r.key) {
				t.Errorf("request %d: Idempotency-Key %s, want %s, the step's key on both attempts", i+1, r.key, want)
			}
		}
	})
}

// WithStep names the step whose key a request gets; a request that
// changes something, inside Do with no step, is refused; a GET goes
// without a key; a request's own key is kept.
func TestTransportInsideDo(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		p, srv, hc := startProvider(t, nil)
		c := b.Idem(t)
		_, err := idem.Do(context.Background(), c, "k", "", func(ctx context.Context) (int, error) {
			if _, _, err := post(t, hc, httpidem.WithStep(ctx, "refund"), srv.URL, "named"); err != nil {
				return 0, err
			}
			if want := strconv.Quote(idem.StepKey(ctx, "refund")); p.requests()[0].key != want {
				return 0, fmt.Errorf("WithStep: key %s, want %s", p.requests()[0].key, want)
			}
			// Inside a step, WithStep still wins.
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (int, error) {
				_, _, err := post(t, hc, httpidem.WithStep(ctx, "fee"), srv.URL, "fee")
				return 0, err
			})
			if err != nil {
				return 0, err
			}
			if want := strconv.Quote(idem.StepKey(ctx, "fee")); p.requests()[1].key != want {
				return 0, fmt.Errorf("WithStep in a step: key %s, want %s", p.requests()[1].key, want)
			}
			if _, _, err := post(t, hc, ctx, srv.URL, "no step"); !errors.Is(err, httpidem.ErrNoStep) {
				return 0, fmt.Errorf("POST with no step: %v, want ErrNoStep", err)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := hc.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("own"))
			req.Header.Set("Idempotency-Key", "mine")
			if resp, err = hc.Do(req); err != nil {
				return 0, err
			}
			resp.Body.Close()
			return 0, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got := p.requests()
		if len(got) != 4 {
			t.Fatalf("the provider got %d requests, want 4 (the POST with no step was not sent)", len(got))
		}
		if got[2].method != http.MethodGet || got[2].key != "" {
			t.Errorf("GET: %s with key %q, want no key", got[2].method, got[2].key)
		}
		if got[3].key != "mine" {
			t.Errorf("a request's own key: %q, want mine", got[3].key)
		}
	})
}

// Outside an idem call: ambiguous failures (a hang-up, 502, 503, 504) are
// retried with one key and the same body; the definite answer ends it.
func TestTransportRetriesWithOneKey(t *testing.T) {
	t.Parallel()
	p, srv, hc := startProvider(t, []httpidem.TransportOption{httpidem.WithAttempts(5)},
		hangUp, status(502), status(503), status(504))
	resp, body, err := post(t, hc, context.Background(), srv.URL, "charge 100")
	if err != nil || resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("got %v %q, %v; want 200 ok", resp, body, err)
	}
	got := p.requests()
	if len(got) != 5 {
		t.Fatalf("the provider got %d requests, want 5", len(got))
	}
	for i, r := range got {
		if r.key != got[0].key || !keyHeader.MatchString(r.key) || r.body != "charge 100" {
			t.Errorf("try %d: key %s, body %q; want key %s and the same body", i+1, r.key, r.body, got[0].key)
		}
	}
	// The next logical request gets a key of its own.
	if _, _, err := post(t, hc, context.Background(), srv.URL, "charge 200"); err != nil {
		t.Fatal(err)
	}
	if k := p.requests()[5].key; k == got[0].key {
		t.Fatalf("a new request reused the key %s", k)
	}
}

// A definite answer is never retried: 4xx (a 409 without Retry-After
// too), 500, 2xx.
func TestTransportDefiniteAnswersNotRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 404, 409, 422, 429, 500, 201} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			p, srv, hc := startProvider(t, nil, status(code), status(200))
			resp, _, err := post(t, hc, context.Background(), srv.URL, "x")
			if err != nil || resp.StatusCode != code {
				t.Fatalf("got %v, %v; want %d", resp, err, code)
			}
			if n := len(p.requests()); n != 1 {
				t.Fatalf("%d was sent %d times, want 1", code, n)
			}
		})
	}
}

// 409 with Retry-After (the provider runs the first request still) is
// retried after the time it asks for; one longer than WithMaxRetryAfter is
// returned as it is.
func TestTransportHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	p, srv, hc := startProvider(t, nil, status(409, "Retry-After", "1"))
	resp, _, err := post(t, hc, context.Background(), srv.URL, "x")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v, %v; want 200 after the retry", resp, err)
	}
	got := p.requests()
	if len(got) != 2 || got[1].key != got[0].key {
		t.Fatalf("requests %+v, want 2 with one key", got)
	}
	if gap := got[1].at.Sub(got[0].at); gap < 900*time.Millisecond {
		t.Fatalf("retried after %v, want after the Retry-After of 1s", gap)
	}

	p, srv, hc = startProvider(t, []httpidem.TransportOption{httpidem.WithMaxRetryAfter(time.Second)}, status(503, "Retry-After", "30"))
	resp, _, err = post(t, hc, context.Background(), srv.URL, "x")
	if err != nil || resp.StatusCode != 503 || len(p.requests()) != 1 {
		t.Fatalf("got %v, %v after %d requests; want the 503 at once", resp, err, len(p.requests()))
	}
}

// A body that cannot be read again (no GetBody) is sent once.
func TestTransportBodyNotReplayable(t *testing.T) {
	t.Parallel()
	p, srv, hc := startProvider(t, nil, status(503), status(200))
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("once")))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || len(p.requests()) != 1 {
		t.Fatalf("got %d after %d requests; want the 503, sent once", resp.StatusCode, len(p.requests()))
	}
	if !keyHeader.MatchString(p.requests()[0].key) {
		t.Fatalf("key %q", p.requests()[0].key)
	}
}

// Attempts are bounded; a GET is retried too, without a key; the caller's
// own key is kept on every retry; a context that ends stops the retries.
func TestTransportBounds(t *testing.T) {
	t.Parallel()
	p, srv, hc := startProvider(t, nil, status(503), status(503), status(503), status(503))
	resp, _, err := post(t, hc, context.Background(), srv.URL, "x")
	if err != nil || resp.StatusCode != 503 || len(p.requests()) != 3 {
		t.Fatalf("got %v, %v after %d requests; want the third 503", resp, err, len(p.requests()))
	}

	p, srv, hc = startProvider(t, nil, status(504))
	resp, err = hc.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := p.requests(); resp.StatusCode != 200 || len(got) != 2 || got[0].key != "" || got[1].key != "" {
		t.Fatalf("GET: %d after %+v; want 200 after a retry, with no key", resp.StatusCode, got)
	}

	p, srv, hc = startProvider(t, nil, status(502))
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"caller-key"`)
	if resp, err = hc.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := p.requests(); len(got) != 2 || got[0].key != `"caller-key"` || got[1].key != `"caller-key"` {
		t.Fatalf("the caller's key: %+v", got)
	}

	_, srv, _ = startProvider(t, nil, status(503, "Retry-After", "5"))
	hc = &http.Client{Transport: httpidem.NewTransport(nil)}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, _, err = post(t, hc, ctx, srv.URL, "x")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 4*time.Second {
		t.Fatalf("got %v after %v; want the context's deadline, before the Retry-After", err, time.Since(t0))
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

func TestTransportOptionsPanic(t *testing.T) {
	t.Parallel()
	for name, opt := range map[string]httpidem.TransportOption{
		"attempts": httpidem.WithAttempts(0),
		"backoff":  httpidem.WithBackoff(time.Second, time.Millisecond),
		"retry":    httpidem.WithMaxRetryAfter(-1),
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			httpidem.NewTransport(nil, opt)
		}()
	}
}

// WithBareKey(true) sends the same keys as bare tokens, on retries and
// inside a step alike; the default is the draft's quoted string.
func TestTransportBareKey(t *testing.T) {
	t.Parallel()
	bare := regexp.MustCompile(`^idem-[a-z2-7]+$`)
	p, srv, hc := startProvider(t, []httpidem.TransportOption{httpidem.WithAttempts(2), httpidem.WithBareKey(true)}, status(503))
	if _, _, err := post(t, hc, context.Background(), srv.URL, "charge 100"); err != nil {
		t.Fatal(err)
	}
	got := p.requests()
	if len(got) != 2 || !bare.MatchString(got[0].key) || got[1].key != got[0].key {
		t.Fatalf("requests %+v; want two with one bare key", got)
	}
	q, srv2, hc2 := startProvider(t, nil)
	if _, _, err := post(t, hc2, context.Background(), srv2.URL, "charge 100"); err != nil {
		t.Fatal(err)
	}
	if k := q.requests()[0].key; !keyHeader.MatchString(k) || bare.MatchString(k) {
		t.Fatalf("the default key %s; want the quoted form", k)
	}
}
