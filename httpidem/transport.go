// transport.go: NewTransport, the outbound side: requests to a provider
// carry an Idempotency-Key, the current step's inside an idem call, and
// outside one a key per logical request that its retries reuse.

package httpidem

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// ErrNoStep means a request that changes something (any method but GET,
// HEAD, OPTIONS and TRACE) was sent through the transport inside an idem
// call but outside any step, with no step named (WithStep) and no
// Idempotency-Key of its own: there is no stable key to send with it. It
// is not sent.
var ErrNoStep = errors.New("httpidem: request inside an idem call with no step to take its key from (use idem.Step or httpidem.WithStep)")

// A TransportOption configures NewTransport.
type TransportOption func(*transportConfig)

type transportConfig struct {
	attempts      int
	first, max    time.Duration
	maxRetryAfter time.Duration
	problems      []string
}

// WithAttempts sets how many times, at most, the transport sends a request
// outside an idem call: the first time and the retries. 1 turns retries
// off. The default is 3.
func WithAttempts(n int) TransportOption {
	return func(c *transportConfig) {
		if n < 1 {
			c.problems = append(c.problems, fmt.Sprintf("WithAttempts(%d): at least 1", n))
		}
		c.attempts = n
	}
}

// WithBackoff sets the pauses between retries outside an idem call: the
// n-th is drawn at random from [d/2, d] with d = first·2ⁿ⁻¹, at most max.
// A Retry-After in the response replaces it. The default is 100
// milliseconds and 2 seconds.
func WithBackoff(first, max time.Duration) TransportOption {
	return func(c *transportConfig) {
		if first <= 0 || max < first {
			c.problems = append(c.problems, fmt.Sprintf("WithBackoff(%v, %v): want 0 < first <= max", first, max))
		}
		c.first, c.max = first, max
	}
}

// WithMaxRetryAfter sets the longest Retry-After that the transport waits
// for before a retry; a response asking for a longer wait is returned to
// the caller as it is. The default is 10 seconds.
func WithMaxRetryAfter(d time.Duration) TransportOption {
	return func(c *transportConfig) {
		if d < 0 {
			c.problems = append(c.problems, fmt.Sprintf("WithMaxRetryAfter(%v): negative", d))
		}
		c.maxRetryAfter = d
	}
}

type stepNameKey struct{}

// WithStep returns a copy of ctx under which the transport stamps requests
// with the key of the step called name (idem.StepKey) instead of the
// current step's: for a request inside an idem call but outside idem.Step,
// or a second provider call in one step that needs a key of its own.
func WithStep(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, stepNameKey{}, name)
}

// NewTransport returns a RoundTripper that sends requests through base
// (http.DefaultTransport when nil) with an Idempotency-Key header, as an
// RFC 8941 string ("..."), unless the request has one already (a header
// that is empty, blank or "" is no key: it is replaced, or dropped where no
// key is sent):
//
//   - Inside an idem call (the request's context carries an idem.Attempt),
//     the key is idem.StepKey of the step named by WithStep, else of the
//     step the context belongs to (idem.StepFrom): the same on every
//     attempt of the operation, so the provider's own idempotency covers a
//     step that acted but crashed before its checkpoint. The request is
//     sent once, whatever its answer, and so is a request that carries
//     its own key: a step's transient error is retried by the next
//     attempt, whose lease and checkpoints cover it, not by the transport.
//     A request that changes something, with no step and no key of its
//     own, fails with ErrNoStep; GET, HEAD, OPTIONS and TRACE go without a
//     key.
//   - Outside one, it is a retrier, as providers' SDKs are: one new random
//     key per request (for methods but GET, HEAD, OPTIONS and TRACE), reused
//     on every retry. It retries when the outcome is unknown or the server
//     asks for it (a transport error other than the request's context
//     ending, 502, 503, 504, and 409 with Retry-After), never after another
//     answer, at most WithAttempts times, after WithBackoff's pauses or the
//     response's Retry-After (up to WithMaxRetryAfter). A request whose
//     body cannot be sent again (no GetBody) is not retried.
//
// NewTransport panics if an option is invalid.
func NewTransport(base http.RoundTripper, opts ...TransportOption) http.RoundTripper {
	cfg := transportConfig{attempts: 3, first: 100 * time.Millisecond, max: 2 * time.Second, maxRetryAfter: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("httpidem: invalid transport options: %s", strings.Join(cfg.problems, "; ")))
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base, cfg: cfg}
}

type transport struct {
	base http.RoundTripper
	cfg  transportConfig
}

// RoundTrip sends req with its key (see NewTransport).
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key := ""
	_, inside := idem.AttemptFrom(ctx)
	if !hasKey(req.Header) {
		if inside {
			key = stepKeyOf(ctx)
			if key == "" && !safeMethod(req.Method) {
				closeBody(req)
				return nil, fmt.Errorf("%w: %s %s", ErrNoStep, req.Method, req.URL.Redacted())
			}
			return t.base.RoundTrip(withKey(req, key))
		}
		if !safeMethod(req.Method) {
			key = newKey()
		}
	} else if inside {
		// Its own key, sent once: the operation's next attempt retries.
		return t.base.RoundTrip(req)
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	for n := 1; ; n++ {
		r := withKey(req, key)
		if n > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("httpidem: reading the request body again for a retry: %w", err)
			}
			r.Body = body
		}
		resp, err := t.base.RoundTrip(r)
		if n >= t.cfg.attempts || !replayable {
			return resp, err
		}
		wait, ok := t.retry(ctx, n, resp, err)
		if !ok {
			return resp, err
		}
		if resp != nil {
			// Drain a little, so that the connection can be reused.
			_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
			resp.Body.Close()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			if err == nil {
				err = fmt.Errorf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
			}
			return nil, fmt.Errorf("httpidem: waiting to retry after %v: %w", err, ctx.Err())
		case <-timer.C:
		}
	}
}

// retry says whether the outcome of the n-th try calls for another, and
// after how long.
func (t *transport) retry(ctx context.Context, n int, resp *http.Response, err error) (time.Duration, bool) {
	if err != nil {
		// Unknown outcome, unless the caller gave up.
		return t.backoff(n), ctx.Err() == nil
	}
	after, has := retryAfter(resp.Header.Get("Retry-After"))
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if !has {
			return t.backoff(n), true
		}
	case http.StatusConflict:
		// In progress: the server says when to come back.
		if !has {
			return 0, false
		}
	default:
		return 0, false
	}
	return after, after <= t.cfg.maxRetryAfter
}

// backoff is the pause after the n-th try.
func (t *transport) backoff(n int) time.Duration {
	d := t.cfg.max
	if n < 32 {
		d = min(t.cfg.first<<(n-1), t.cfg.max)
	}
	return d/2 + rand.N(d/2+1)
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP-date.
func retryAfter(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0), true
	}
	return 0, false
}

// stepKeyOf returns the key of the step named by WithStep, or of the step
// ctx belongs to, or "".
func stepKeyOf(ctx context.Context) string {
	name, ok := ctx.Value(stepNameKey{}).(string)
	if !ok {
		name, _ = idem.StepFrom(ctx)
	}
	return idem.StepKey(ctx, name)
}

// hasKey reports whether h carries an Idempotency-Key of its own: a value
// that is not empty, blank or the empty RFC 8941 string ("").
func hasKey(h http.Header) bool {
	for _, v := range h.Values(HeaderIdempotencyKey) {
		if v = strings.TrimSpace(v); v != "" && v != `""` {
			return true
		}
	}
	return false
}

// withKey returns a shallow copy of req with key as its Idempotency-Key
// (none when key is "": an empty header is dropped), which leaves req as it
// was.
func withKey(req *http.Request, key string) *http.Request {
	r := req.Clone(req.Context())
	if key != "" {
		r.Header.Set(HeaderIdempotencyKey, sfString(key))
	} else if !hasKey(r.Header) {
		r.Header.Del(HeaderIdempotencyKey)
	}
	return r
}

// sfString writes s as an RFC 8941 string: quoted, with \ and " escaped.
// Keys made here are letters, digits and '-' only.
func sfString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// safeMethod reports whether method changes nothing (RFC 9110), so that a
// request needs no key.
func safeMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// closeBody closes a request's body, as a RoundTripper must even when it
// does not send the request.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// newKey returns a random key for one logical request: "idem-" and 26
// characters of a-z and 2-7 (128 bits).
func newKey() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:]) // never fails (crypto/rand documents it)
	return "idem-" + keyEncoding.EncodeToString(b[:])
}

var keyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
