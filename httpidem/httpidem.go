// Package httpidem is net/http middleware that makes requests with an
// Idempotency-Key header safe to retry: the handler runs at most once per
// key, and every retry gets the first response again, byte for byte.
//
// A client that times out cannot know whether its request ran. It sends one
// key per logical operation (the IETF Idempotency-Key header, as Stripe
// and others use it) and retries with the same key:
//
//	keys := idem.New(rdb)
//	mux.Handle("POST /debits", httpidem.New(keys)(debitHandler))
//
// The first request with a key claims it (idem.Client.Do) and runs the
// handler, whose status, headers and body are stored in Redis for the
// Client's retention (idem.WithRetention). Every later request with the key
// gets that response, with the header Idempotent-Replayed: true, and the
// handler does not run. Duplicates that arrive while the handler runs wait
// for its response (idem.WithWait), in any number of processes that share
// the Redis.
//
// # Responses
//
//	situation                                     status  body and headers
//	--------------------------------------------  ------  -----------------------------------------
//	method not in WithMethods, or no key header   -       passed to the handler untouched
//	  (and not WithRequired)
//	first request with the key                    any     the handler's response
//	retry after a 2xx, 3xx or 4xx response        same    the stored response, Idempotent-Replayed: true
//	retry after a 5xx response                    any     the handler runs again (5xx is not stored)
//	key reused with another request               422     problem+json, ProblemKeyReused
//	retry after the retention, response gone      410     problem+json, ProblemLateRetry
//	  (only its tombstone: idem.WithTombstones)
//	first request still running after the wait    409     problem+json, ProblemInProgress, Retry-After
//	  (the Client's idem.WithWait, 10s by default),
//	  or this request's context ended first
//	key empty, too long, not visible ASCII,       400     problem+json, ProblemKeyInvalid
//	  or sent twice
//	key missing under WithRequired                400     problem+json, ProblemKeyMissing
//	body over WithMaxBody                         413     problem+json, ProblemBodyTooLarge
//	body unreadable, JSON nested over 10000       400     problem+json, ProblemBadRequest
//	  levels, or WithFingerprint failed
//	WithScope failed                              401     problem+json, ProblemScope (or the error's StatusCode());
//	                                                      WWW-Authenticate from Unauthenticated
//	retry after a response too large to store     500     problem+json, ProblemNotStored
//	the handler ran, its response not recorded    500     problem+json, ProblemNotRecorded
//	operation parked (idem.ErrParked)             409     problem+json, ProblemParked
//	outcome unknown (idem.ErrUnknownOutcome:      409     problem+json, ProblemOutcomeUnknown
//	  a checked step parked, even if the handler
//	  answered otherwise)
//	stored record unreadable                      500     problem+json, ProblemServerError
//	Redis unreachable, Client closed, the record  503     problem+json, ProblemUnavailable, Retry-After
//	  expired while waiting (idem.ErrExpired),
//	  or another transient failure
//
// StatusHandler answers status checks: a GET with the key tells a client
// what became of its request (the stored response, in progress, not
// finished, parked, unknown), within its own scope.
//
// Problem bodies follow RFC 9457 (application/problem+json): a type URI, a
// title, the status and a detail. The handler is never run without a
// claim, and a response is never replayed to a request it was not stored
// for: with Redis down the answer is 503, not a guess.
//
// # Late retries: 410
//
// With idem.WithTombstones, a key outlives its stored response as a
// tombstone; a retry that comes after the retention, when only the
// tombstone is left, gets 410 Gone (ProblemLateRetry) and the handler does
// not run again. The Idempotency-Key draft has no status for this, so the
// choice is ours: 410 says that what the key named is gone for good, and
// that asking again will not bring it back, as RFC 9110 defines it. Not
// 422, which the draft gives a key reused with another request, a client's
// bug to fix: a late retry is the same request, only late, and a distinct
// status lets clients and dashboards tell the two apart without reading
// the body. Not 409 or a 5xx, which say that a retry may succeed: it
// cannot. A client that gets 410 should treat the operation as done and
// look up its result elsewhere (a GET of the resource). 410 is cacheable by
// default; the answer carries Cache-Control: no-store, as every problem
// answer does. With another request under the key, a late retry gets 422
// like any reuse.
//
// # What is stored and replayed
//
// The status, the headers the handler set by the time it wrote the status
// (all but the hop-by-hop ones, Date, Content-Length and trailers), and the
// body. Without WithScope, the per-user headers (Set-Cookie,
// Authentication-Info, Proxy-Authentication-Info) reach the first request's
// client only and are not stored, unless WithKeepHeaders names them. Headers that outer middleware set on the response stay; the
// handler's replace those of the same name. Content-Length is set from the
// body. Responses with a 5xx status are not stored: the key is released,
// and a retry runs the handler again (as idem.Attempt number 2: the handler
// can read idem.AttemptFrom(r.Context()) to reconcile first). A handler
// that panics releases the key too, and the panic goes on to the server.
// Informational (1xx) responses are dropped, and so are hop-by-hop
// headers, from the first response as from its replays.
//
// Whatever status the handler writes is its outcome, and 2xx to 4xx are
// stored: a handler that gives up early (its context ended after
// WithHandlerTimeout, or idem's lease was lost) should answer with a 5xx,
// so that a retry runs it again. A handler that writes nothing
// answers 200 with an empty body, as under net/http, and that is stored.
//
// # Exactly-once through the ledger
//
// Redis cannot join the handler's database transaction: with Redis alone,
// a response stored after the business change committed can be lost (a
// crash between the two, a Redis restart without persistence), and a
// retry then runs the handler again. With a ledger in the handler's own
// database (idem.WithLedger on the middleware's Client), the handler
// commits its response with its business change: it writes the response,
// then commits Recorded(w), the response in the form the middleware
// stores, in its transaction, and returns:
//
//	b, err := httpidem.Recorded(w)
//	if err != nil { ... }
//	err = idemsql.Commit(r.Context(), tx, b) // or idempgx.Commit
//
// The database's unique key on the idempotency key decides: when the
// commit finds the key recorded already (another live owner committed
// first, or Redis lost the record and this is a retry), the transaction
// rolls back, business change and all, and the middleware answers with the
// recorded response, byte for byte, with Idempotent-Replayed: true, not
// with what this handler wrote (idem.LedgerDecided tells it which). A
// takeover after a crash finds the committed response before the handler
// runs.
//
// # Buffering, Flusher and Hijacker
//
// The response is buffered, up to WithMaxResponse, so that it can be stored
// before it is sent. Flush does nothing while the response is buffered. A
// response that outgrows the buffer is sent on to the client as it is
// written (Flush then works) and is not stored: the handler has run, so the
// key is finished as a failure (the log says so) and a retry gets 500
// ProblemNotStored, never a truncated copy and never a second run. A 5xx
// response that outgrows the buffer releases the key as usual.
// WithMaxResponse follows the Client's idem.WithMaxResultSize (both 1 MiB
// by default), and New refuses one above it, which the Client would
// refuse after the handler ran. Hijack is not supported behind the middleware (it returns an error
// wrapping http.ErrNotSupported): what a hijacked connection carries cannot
// be stored.
//
// # Keys and scopes
//
// A key is 1 to WithMaxKeyLen visible ASCII characters (0x21 to 0x7E), or
// a structured-field string ("..." with \" and \\ escapes and spaces
// inside), as the IETF draft writes it; "abc" and abc are one key. The key
// is namespaced by the principal that WithScope returns, so one user's key
// can never replay another user's response: the key given to
// idem.Client.Do (and seen in idem.Attempt.Key) is the scope's length in
// decimal, ':', the scope and the key (ScopedKey), so no two (scope, key)
// pairs share one; idemctl -scope PRINCIPAL reads its record. The Client's
// idem.WithMaxKeyLen must leave room for the scope and its length: New
// checks WithMaxKeyLen against it, and a key that does not fit with its
// scope gets 400. Without WithScope, keys are global: anyone who sends a
// key with the same request gets its response; New logs that once. A
// scope function that finds no credentials answers 401 with a challenge
// (WWW-Authenticate) by returning Unauthenticated.
//
// # Waiting, and 409
//
// A request whose key's first request is still running waits for its
// outcome, woken the moment it is stored, for as long as the Client's
// idem.WithWait allows (10 seconds by default) and the request's context
// lasts; then it gets 409 ProblemInProgress with Retry-After
// (WithRetryAfter). A client that retries sooner than the handler takes
// sees 409s, never a second run. To answer sooner, give the middleware a
// Client of its own with a shorter wait, idem.New(rdb,
// idem.WithWait(2*time.Second)), or bound the request (a server's
// WriteTimeout ends its context); WithWait(0) answers 409 at once.
//
// # Logs
//
// The middleware logs what it notices on its own (Redis unreachable,
// responses not recorded or too large to store, unreadable records) to
// slog.Default(), as the Client does, or to WithLogger's logger. Records
// name keys by their digest (idem.Client.LogAttrs), never the key itself,
// unless the Client was made with idem.WithRawEventKeys(true).
//
// # The handler's request
//
// The handler sees the whole body (the middleware reads it to fingerprint
// it, then gives the handler a reader of the same bytes). Its request's
// context carries the request's values and the idem.Attempt
// (idem.AttemptFrom), and ends after WithHandlerTimeout (1 minute by
// default) or when idem's lease on the key is lost, not when the client
// goes away: the work outlives its caller. A client that times out gets
// nothing (its request's context ended: the middleware answers 409
// ProblemInProgress to whoever still listens), the handler goes on, its
// response is stored, and the client's retry waits for it or replays it.
// Once the request's context ended the handler writes only into the
// middleware's buffer (a response streamed past WithMaxResponse is dropped,
// its writes fail), never to the connection. A panic reaches the server
// while the request lasts; after, it is logged and the key released.
// Server.Shutdown does not wait for handlers whose requests have ended;
// allow WithHandlerTimeout after it before the process exits.
//
// # Recovery without a retry
//
// A handler that dies with its process, panics or answers 5xx leaves its
// key unfinished, and only a retry runs it again. With WithRecovery(name,
// headers...), the request runs as an operation registered on the Client
// (idem.Register), whose stored input is the request (its method, target,
// host, Content-Type, body, key and scope, and of its headers only those
// named): when no caller comes back, the Client's Recover loop
// (idem.Client.Recover, after idem.WithRecoverAfter) rebuilds the request
// in any process where the middleware is mounted, runs the handler on it,
// and stores its response, which the retry and StatusHandler get. A
// recovered request has none of the original's context values: the
// handler finds its principal with ScopeFrom.
//
// # Outbound requests
//
// NewTransport is the other side: an http.RoundTripper for calls to
// providers. Inside an idem call it sends the current idem.Step's key
// (idem.StepKey) as the Idempotency-Key, the same on every attempt;
// outside one it retries ambiguous failures with one key per request.
package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
)

// Header names.
const (
	// HeaderIdempotencyKey is the request header that carries the key, unless
	// WithHeader names another.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
)

// An Option configures the middleware. Pass options to New.
type Option func(*config)

type config struct {
	header          string
	methods         map[string]bool
	required        bool
	scope           func(*http.Request) (string, error)
	fingerprint     func(*http.Request, []byte) (string, error)
	maxBody         int64
	maxKeyLen       int // 0 until set: then the Client's limit decides (see New)
	maxResponse     int // likewise
	retryAfter      time.Duration
	handlerTimeout  time.Duration
	logger          *slog.Logger
	keep            map[string]bool // per-user headers stored all the same (WithKeepHeaders)
	recovery        string          // the operation's name (WithRecovery); "" for none
	recoveryHeaders []string        // the request headers stored for recovery, canonical
	problems        []string
}

func (c *config) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// WithHeader sets the name of the request header that carries the key.
// The default is "Idempotency-Key" (HeaderIdempotencyKey).
func WithHeader(name string) Option {
	return func(c *config) {
		if name == "" || strings.ContainsAny(name, " :\r\n\t") {
			c.problem("WithHeader(%q): not a header name", name)
			return
		}
		c.header = http.CanonicalHeaderKey(name)
	}
}

// WithMethods sets the request methods the middleware handles; requests
// with other methods pass through untouched. Methods are case-sensitive, as
// in HTTP.
// The default is POST and PATCH.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			c.problem("WithMethods(): needs at least one method")
			return
		}
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			if m == "" {
				c.problem("WithMethods: empty method")
			}
			c.methods[m] = true
		}
	}
}

// WithRequired makes the key mandatory: a request with a handled method and
// no key gets 400 (ProblemKeyMissing).
// The default lets such requests pass through to the handler.
func WithRequired() Option {
	return func(c *config) { c.required = true }
}

// WithScope sets the function that names the principal a request acts for
// (a user or an API client, as authenticated), which namespaces its key: a
// key sent by one principal never replays another's response (ScopedKey
// gives the key stored). It runs after the key is read and before the body
// is. If it returns an error, the request gets 401 (ProblemScope), or the
// status the error gives through a method StatusCode() int (found with
// errors.As) when that is between 400 and 599, with the header
// WWW-Authenticate when the error gives a challenge through a method
// WWWAuthenticate() string (Unauthenticated makes such an error); the
// error's message is the problem's detail. An empty scope is allowed: it
// is the scope of requests without WithScope.
// The default scope is "" for every request.
func WithScope(scope func(*http.Request) (string, error)) Option {
	return func(c *config) {
		if scope == nil {
			c.problem("WithScope(nil)")
			return
		}
		c.scope = scope
	}
}

// WithFingerprint sets the function that fingerprints a request: a key
// reused with a request whose fingerprint differs gets 422. body is the
// whole request body. If it returns an error, the request gets 400
// (ProblemBadRequest), or the status of the error's StatusCode() method as
// for WithScope. An empty fingerprint is not checked.
// The default is DefaultFingerprint.
func WithFingerprint(fingerprint func(r *http.Request, body []byte) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.problem("WithFingerprint(nil)")
			return
		}
		c.fingerprint = fingerprint
	}
}

// WithMaxBody sets the largest request body, in bytes, that the middleware
// reads (and holds in memory) to fingerprint it; a larger body gets 413
// (ProblemBodyTooLarge). It must not be negative.
// The default is 1 MiB.
func WithMaxBody(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.problem("WithMaxBody(%d): must not be negative", n)
			return
		}
		c.maxBody = n
	}
}

// WithMaxKeyLen sets the longest key, in bytes (after the quotes of a
// structured-field string are removed); a longer one gets 400. It must be
// between 1 and 65536, and leave room in the Client's idem.WithMaxKeyLen
// for the scope's length prefix ("0:" without a scope): New panics
// otherwise. A key that fits but is too long with its scope gets 400 too.
// The default is 255, or the Client's limit less 2 when that is smaller.
func WithMaxKeyLen(n int) Option {
	return func(c *config) {
		if n < 1 || n > 1<<16 {
			c.problem("WithMaxKeyLen(%d): must be between 1 and 65536", n)
			return
		}
		c.maxKeyLen = n
	}
}

// WithMaxResponse sets the largest response, in bytes of its stored form
// (the body, the headers and a few bytes more), that is buffered and
// stored; a larger one is sent as it is written and not stored (see the
// package documentation). It must be positive and at most the Client's
// idem.WithMaxResultSize, which would refuse a larger one after the
// handler ran: New panics otherwise.
// The default is 1 MiB, or the Client's limit when that is smaller.
func WithMaxResponse(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.problem("WithMaxResponse(%d): must be positive", n)
			return
		}
		c.maxResponse = n
	}
}

// WithRetryAfter sets the Retry-After hint of 409 and 503 answers: a guess
// at when a retry may find the first request finished, not its lease's
// end. It must be a positive whole number of seconds, as in every door
// (door.CheckRetryAfter).
// The default is 1 second.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if err := door.CheckRetryAfter(d); err != nil {
			c.problem("%v", err)
			return
		}
		c.retryAfter = d
	}
}

// WithHandlerTimeout bounds the handler's run: its request's context keeps
// the request's values but not its cancellation, so that a client that
// times out or goes away does not cancel the handler, whose response is
// stored for the retry; the handler's context ends d after it started (or
// when idem's lease is lost). d must be positive.
// The default is 1 minute.
func WithHandlerTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.problem("WithHandlerTimeout(%v): must be positive", d)
			return
		}
		c.handlerTimeout = d
	}
}

// WithLogger sets the logger for what the middleware notices on its own:
// responses too large to store, responses not recorded, Redis failures,
// unreadable records, and, from New, that keys are global without
// WithScope. Records name keys by their digest, as the Client's do
// (idem.Client.LogAttrs). A nil logger discards.
// The default is slog.Default(), as it is when a message is logged, as for
// the Client.
func WithLogger(l *slog.Logger) Option {
	// Resolved here, not in the closure: one Option may be shared by
	// many New calls at once, and must not write what they read.
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return func(c *config) { c.logger = l }
}

// WithKeepHeaders names per-user response headers that are stored and
// replayed even without WithScope. Without WithScope a key is global: its
// replay goes to anyone who sends the key with the same request, so the
// headers that belong to the first request's user (Set-Cookie,
// Authentication-Info, Proxy-Authentication-Info) reach that user's
// response only and are not stored. Names are case-insensitive.
// The default keeps none of them without WithScope; with WithScope every
// header is stored.
func WithKeepHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			if n == "" || strings.ContainsAny(n, " :\r\n\t") {
				c.problem("WithKeepHeaders(%q): not a header name", n)
				continue
			}
			if c.keep == nil {
				c.keep = map[string]bool{}
			}
			c.keep[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// New returns middleware that runs the handler it wraps at most once per
// idempotency key, with c, and replays its response to retries (see the
// package documentation). It fits net/http, chi and gorilla/mux (Use).
// New panics if c is nil or an option is invalid, as those are programming
// errors.
func New(c *idem.Client, opts ...Option) func(http.Handler) http.Handler {
	cfg := config{
		header:         HeaderIdempotencyKey,
		methods:        map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		fingerprint:    DefaultFingerprint,
		maxBody:        1 << 20,
		retryAfter:     time.Second,
		handlerTimeout: time.Minute,
		logger:         door.Logger(),
	}
	if c == nil {
		cfg.problem("nil *idem.Client")
	}
	for _, o := range opts {
		o(&cfg)
	}
	if c != nil {
		cfg.fitLimits(c)
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("httpidem: invalid options: %s", strings.Join(cfg.problems, "; ")))
	}
	var private map[string]bool // per-user headers not stored
	if cfg.scope == nil {
		for _, h := range perUserHeaders {
			if !cfg.keep[h] {
				if private == nil {
					private = map[string]bool{}
				}
				private[h] = true
			}
		}
		cfg.logger.Info("httpidem: no WithScope: idempotency keys are global, so a key's response is replayed to anyone who sends the key with the same request; per-user headers are not stored",
			"not_stored", strings.Join(slices.Sorted(maps.Keys(private)), ","))
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httpidem: nil handler")
		}
		m := &middleware{c: c, cfg: cfg, next: next, private: private}
		if cfg.recovery != "" {
			m.register()
		}
		return m
	}
}

// fitLimits sets the key and response limits not given from the Client's,
// and checks those given against them (door.FitKeyLen, door.FitResponse):
// a limit set twice must agree, or the first key or response between the
// two would fail after it was accepted.
func (cfg *config) fitLimits(c *idem.Client) {
	var err error
	if cfg.maxKeyLen, err = door.FitKeyLen(c, cfg.maxKeyLen, ""); err != nil {
		cfg.problem("%v", err)
	}
	if cfg.maxResponse, err = door.FitResponse(c, cfg.maxResponse); err != nil {
		cfg.problem("%v", err)
	}
}

type middleware struct {
	c       *idem.Client
	cfg     config
	next    http.Handler
	private map[string]bool           // canonical names of the headers not stored; nil: none
	op      *idem.Op[request, []byte] // the registered operation (WithRecovery); nil without
}

// perUserHeaders are the response headers that belong to the user who
// sent the first request with a key (see WithKeepHeaders).
var perUserHeaders = []string{"Set-Cookie", "Authentication-Info", "Proxy-Authentication-Info"}

// ServeHTTP reads the key, the scope and the body, and runs the handler
// under idem.Client.Do, or answers from the stored response.
func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !m.cfg.methods[r.Method] {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(m.cfg.header)
	if len(values) == 0 {
		if m.cfg.required {
			m.fail(w, ProblemKeyMissing, http.StatusBadRequest, "the request has no "+m.cfg.header+" header, which this endpoint requires")
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	key, scope, ok := m.scopedKey(w, r, values)
	if !ok {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope))
	body, err := readBody(r, m.cfg.maxBody)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			m.fail(w, ProblemBodyTooLarge, http.StatusRequestEntityTooLarge, err.Error())
		} else {
			m.fail(w, ProblemBadRequest, http.StatusBadRequest, err.Error())
		}
		return
	}
	fp, err := m.cfg.fingerprint(r, body)
	if err != nil {
		m.fail(w, ProblemBadRequest, statusOf(err, http.StatusBadRequest), err.Error())
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = io.NopCloser(bytes.NewReader(body)) // the handler reads it again
		r.ContentLength = int64(len(body))
	}

	// l.rec is set when fn runs: this request's handler ran, so its
	// response is the original, not a replay, unless the handler's ledger
	// commit found another's outcome recorded (the ledger decided, not
	// mine): Do returns that one, to be answered as any replay.
	g := new(gate)
	l := &live{w: w, g: g, r: r}
	o, ok := m.detach(r, key, func(ctx context.Context) ([]byte, error) {
		return m.run(ctx, key, fp, scope, body, l)
	})
	if !ok {
		// The client went away, or the request's context ended otherwise:
		// the handler runs on, and its response goes to the retry.
		if !g.close() {
			m.retryAfter(w)
			m.fail(w, ProblemInProgress, http.StatusConflict,
				"this request is still being processed after its context ended; retry with the same "+m.cfg.header+" for its response")
		}
		return
	}
	g.close()
	res, err := o.Res, o.Err
	rec, decided, mine := l.rec, l.decided, l.mine
	switch {
	case rec != nil && decided && mine && err == nil:
		m.answerCommitted(w, r, key, rec, res)
		return
	case rec != nil && (!decided || mine || rec.streamed):
		m.answerOwner(w, r, key, rec, err)
		return
	}
	if err != nil {
		m.answerError(w, r, key, err)
		return
	}
	resp, err := decodeResponse(res)
	if err != nil {
		m.log(r, key, slog.LevelError, "httpidem: stored response unreadable", err)
		m.fail(w, ProblemServerError, http.StatusInternalServerError, "the stored response to this key cannot be read")
		return
	}
	resp.write(w, true)
}

// answerOwner sends the response of the handler that ran in this request,
// unless its outcome could not be recorded.
func (m *middleware) answerOwner(w http.ResponseWriter, r *http.Request, key string, rec *recorder, err error) {
	var se *statusError
	switch {
	case rec.streamed:
		// Already sent as it was written.
		switch {
		case errors.As(err, &se):
		case errors.Is(err, errNotStored) && !errors.Is(err, idem.ErrNotRecorded) && !errors.Is(err, idem.ErrLeaseLost):
			m.log(r, key, slog.LevelWarn, "httpidem: response larger than WithMaxResponse sent unbuffered and not stored; retries with its key get 500",
				nil, slog.Int("limit", m.cfg.maxResponse))
		case err != nil:
			m.log(r, key, slog.LevelError, "httpidem: the outcome of a response sent unbuffered was not recorded", err)
		}
	case err == nil, errors.As(err, &se):
		rec.response().write(w, false)
	case errors.Is(err, idem.ErrTooLarge):
		m.log(r, key, slog.LevelWarn, "httpidem: response not stored: larger than the Client's WithMaxResultSize; retries get 500", err)
		rec.response().write(w, false)
	case errors.Is(err, idem.ErrParked):
		// A checked step of the handler is parked: nothing is stored,
		// whatever it answered, and every retry gets this answer until an
		// operator resolves the step.
		m.answerError(w, r, key, err)
	default:
		m.log(r, key, slog.LevelError, "httpidem: the handler ran but its response was not recorded", err)
		m.fail(w, ProblemNotRecorded, http.StatusInternalServerError,
			"the request was processed, but its response could not be recorded; a retry may run it again")
	}
}

// answerCommitted sends the response that the handler committed through
// the ledger (res, Recorded's bytes), as its own, not a replay: the
// handler's response itself, with its per-user headers, when it is what
// was committed; else (the handler wrote on after Recorded) what was
// committed, as every retry will get it.
func (m *middleware) answerCommitted(w http.ResponseWriter, r *http.Request, key string, rec *recorder, res []byte) {
	if rec.streamed || bytes.Equal(res, rec.stored()) {
		m.answerOwner(w, r, key, rec, nil)
		return
	}
	resp, err := decodeResponse(res)
	if err != nil {
		m.log(r, key, slog.LevelError, "httpidem: the handler committed a value that is not httpidem.Recorded's; retries get 500", err)
		rec.response().write(w, false)
		return
	}
	m.log(r, key, slog.LevelWarn, "httpidem: the handler wrote to its response after committing it (httpidem.Recorded); it gets what was committed", nil)
	resp.write(w, false)
}

// scopedKey reads the key from the key header's values and the scope of
// r's principal, and returns the key under which idem stores them, and the
// scope; when either is wrong, it answers r and returns ok false.
func (m *middleware) scopedKey(w http.ResponseWriter, r *http.Request, values []string) (key, scope string, ok bool) {
	key, err := parseKey(values, m.cfg.maxKeyLen)
	if err != nil {
		m.fail(w, ProblemKeyInvalid, http.StatusBadRequest, "the "+m.cfg.header+" header "+err.Error())
		return "", "", false
	}
	if m.cfg.scope != nil {
		if scope, err = m.cfg.scope(r); err != nil {
			var ch interface{ WWWAuthenticate() string }
			if errors.As(err, &ch) && ch.WWWAuthenticate() != "" {
				w.Header().Set("WWW-Authenticate", ch.WWWAuthenticate())
			}
			m.fail(w, ProblemScope, statusOf(err, http.StatusUnauthorized), err.Error())
			return "", "", false
		}
	}
	return ScopedKey(scope, key), scope, true
}

// answerError answers a request whose handler did not run here: the
// door.Answer of its error, mapped to a problem type and status.
func (m *middleware) answerError(w http.ResponseWriter, r *http.Request, key string, err error) {
	a := door.AnswerOf(err, m.cfg.header)
	if a.Log != "" && r.Context().Err() == nil {
		m.log(r, key, slog.LevelError, "httpidem: "+a.Log, err)
	}
	typ, status := problemOf(a.Reason)
	if a.Reason.Retryable() {
		m.retryAfter(w)
	}
	m.fail(w, typ, status, a.Detail)
}

// log logs what happened to the request with the (scoped) key, and err:
// the key by its digest, and err with the key in its message replaced by
// the digest, unless the Client was given idem.WithRawEventKeys(true).
func (m *middleware) log(r *http.Request, key string, level slog.Level, msg string, err error, attrs ...slog.Attr) {
	ctx := r.Context()
	if !m.cfg.logger.Enabled(ctx, level) {
		return
	}
	all := append([]slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path)}, attrs...)
	m.cfg.logger.LogAttrs(ctx, level, msg, append(all, m.c.LogAttrs(key, err)...)...)
}

func (m *middleware) retryAfter(w http.ResponseWriter) {
	secs := (m.cfg.retryAfter + time.Second - 1) / time.Second
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
}

// statusOf returns the status that err gives through a StatusCode method,
// if it is a 4xx or 5xx, or else def.
func statusOf(err error, def int) int {
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) {
		if s := sc.StatusCode(); s >= 400 && s <= 599 {
			return s
		}
	}
	return def
}

// Unauthenticated returns an error for a WithScope function to return
// when a request carries no valid credentials: the request gets 401
// (ProblemScope) with the header WWW-Authenticate set to challenge (such
// as `Bearer realm="api"`), as RFC 9110 asks of a 401, and err's message
// as the problem's detail. err may be nil.
func Unauthenticated(challenge string, err error) error {
	if err == nil {
		err = errors.New("the request has no valid credentials")
	}
	return &authError{challenge: challenge, err: err}
}

// authError is the error Unauthenticated returns.
type authError struct {
	challenge string
	err       error
}

func (e *authError) Error() string           { return e.err.Error() }
func (e *authError) Unwrap() error           { return e.err }
func (e *authError) StatusCode() int         { return http.StatusUnauthorized }
func (e *authError) WWWAuthenticate() string { return e.challenge }

// ScopedKey returns the key under which the middleware stores the request
// of principal scope (what WithScope returned; "" without WithScope) with
// the Idempotency-Key key: the key its idem.Client sees (idem.Attempt.Key),
// to pass to idem.Client.Status and Forget, as idemctl -scope does. It is
// the scope's length in decimal, ':', the scope and the key: the length
// says where the scope ends, so no two (scope, key) pairs share one.
func ScopedKey(scope, key string) string { return door.Key(scope, key) }

// parseKey checks the key header's values and returns the key.
func parseKey(values []string, maxLen int) (string, error) {
	if len(values) > 1 {
		return "", errors.New("is sent more than once")
	}
	v := values[0]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		// A structured-field string (RFC 8941): printable ASCII and spaces,
		// with \" and \\ escaped.
		var b strings.Builder
		for i := 1; i < len(v)-1; i++ {
			c := v[i]
			switch {
			case c == '\\':
				i++
				if i == len(v)-1 || (v[i] != '"' && v[i] != '\\') {
					return "", errors.New("has an invalid escape in its quoted string")
				}
				b.WriteByte(v[i])
			case c == '"' || c < 0x20 || c > 0x7E:
				return "", errors.New("has a character that is not printable ASCII in its quoted string")
			default:
				b.WriteByte(c)
			}
		}
		v = b.String()
	} else {
		return door.CheckKey(values, maxLen)
	}
	switch {
	case v == "":
		return "", errors.New("is empty")
	case len(v) > maxLen:
		return "", fmt.Errorf("is longer than %d bytes", maxLen)
	}
	return v, nil
}

var errBodyTooLarge = errors.New("the request body is larger than this endpoint accepts")

// readBody reads the whole request body, at most max bytes.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > max {
		return nil, errBodyTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errBodyTooLarge
		}
		return nil, fmt.Errorf("the request body could not be read: %v", err)
	}
	if int64(len(body)) > max {
		return nil, errBodyTooLarge
	}
	return body, nil
}
