package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/redistest"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// A retry gets the first response again: the same status, headers and
// body, on the wire byte for byte but for Date and Idempotent-Replayed.
// (The handler sets Set-Cookie, which without WithScope is stored only
// when WithKeepHeaders names it: TestPerUserHeadersWithoutScope.)
func TestReplayByteForByte(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithKeepHeaders("Set-Cookie"))(c.debit()))
		hc := httpClient(t)
		q := req{key: "k-1", body: `{"account":"A","amount":100}`}

		first := send(t, hc, srv.URL, q)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: %d, replayed %v, want 201 not replayed; body %s", first.status, first.replayed(), first.body)
		}
		if want := `{"run":1,"attempt":1,"body":"{\"account\":\"A\",\"amount\":100}"}`; first.body != want {
			t.Errorf("first body %s, want %s (the handler sees the whole body)", first.body, want)
		}
		retry := send(t, hc, srv.URL, q)
		if !retry.replayed() {
			t.Errorf("retry not marked %s: true", httpidem.HeaderReplayed)
		}
		if retry.status != first.status || retry.body != first.body {
			t.Errorf("retry %d %s, want %d %s", retry.status, retry.body, first.status, first.body)
		}
		strip := func(h http.Header) http.Header {
			h = h.Clone()
			h.Del("Date")
			h.Del(httpidem.HeaderReplayed)
			return h
		}
		if got, want := strip(retry.header), strip(first.header); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("retry headers\n%v\nwant\n%v", got, want)
		}

		// The raw bytes, through a connection of our own.
		raw := func() string {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /debits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
				"Idempotency-Key: raw-1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(q.body), q.body)
			b, err := io.ReadAll(conn)
			if err != nil {
				t.Fatal(err)
			}
			var keep []string
			for _, line := range strings.SplitAfter(string(b), "\r\n") {
				if !strings.HasPrefix(line, "Date: ") && !strings.HasPrefix(line, httpidem.HeaderReplayed+": ") {
					keep = append(keep, line)
				}
			}
			return strings.Join(keep, "")
		}
		w1, w2 := raw(), raw()
		if w1 != w2 {
			t.Errorf("on the wire, the replay differs:\n%q\n%q", w1, w2)
		}
		if !strings.HasPrefix(w1, "HTTP/1.1 201 Created\r\n") || !strings.Contains(w1, "\r\nX-Multi: one\r\nX-Multi: two\r\n") {
			t.Errorf("unexpected response on the wire: %q", w1)
		}
		if got := c.runs(); got != 2 {
			t.Errorf("handler ran %d times for two keys, want 2", got)
		}
	})
}

// 30 duplicates at once, on separate connections to three service
// instances (each with its own idem.Client) that share the Redis: the
// handler runs once and every client gets its one response.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 30
		var c counter
		var arrived atomic.Int64
		all := make(chan struct{})
		var once sync.Once
		inner := c.debit()
		// The handler holds its response until every duplicate has reached
		// a server (or for 10s), so that they all overlap it.
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-all:
			case <-time.After(10 * time.Second):
			}
			inner.ServeHTTP(w, r)
		})
		count := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if arrived.Add(1) == n {
					once.Do(func() { close(all) })
				}
				h.ServeHTTP(w, r)
			})
		}
		var urls []string
		for range 3 {
			mw := httpidem.New(b.Idem(t, idem.WithWait(20*time.Second)))
			urls = append(urls, serve(t, count(mw(slow))).URL)
		}
		answers := make([]answer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hc := httpClient(t) // a connection of its own
				answers[i], errs[i] = trySend(hc, urls[i%3], req{key: "dup", body: `{"amount":5}`})
			}()
		}
		wg.Wait()
		replays := 0
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatalf("request %d: %v", i, errs[i])
			}
			if a.status != http.StatusCreated || a.body != answers[0].body {
				t.Errorf("request %d: %d %s, want 201 %s", i, a.status, a.body, answers[0].body)
			}
			if a.replayed() {
				replays++
			}
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if replays != n-1 {
			t.Errorf("%d replays, want %d (all but the first)", replays, n-1)
		}
	})
}

// The response is lost on the wire after the handler ran (the server
// closes the connection instead of answering): the client's retry gets the
// stored response, and the handler ran once.
func TestLostResponse(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		var lose atomic.Bool
		lose.Store(true)
		mw := httpidem.New(b.Idem(t))(c.debit())
		lossy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !lose.Swap(false) {
				mw.ServeHTTP(w, r)
				return
			}
			mw.ServeHTTP(httptest.NewRecorder(), r) // the handler runs; its response goes nowhere
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_ = conn.Close()
		})
		srv := serve(t, lossy)
		q := req{key: "lost-1", body: `{"amount":7}`}
		if a, err := trySend(httpClient(t), srv.URL, q); err == nil {
			t.Fatalf("first request got %d %s, want a transport error", a.status, a.body)
		}
		if got := c.runs(); got != 1 {
			t.Fatalf("after the lost response the handler ran %d times, want 1", got)
		}
		retry := send(t, httpClient(t), srv.URL, q)
		if retry.status != http.StatusCreated || !retry.replayed() {
			t.Errorf("retry: %d, replayed %v, want 201 replayed", retry.status, retry.replayed())
		}
		if want := `{"run":1,"attempt":1,"body":"{\"amount\":7}"}`; retry.body != want {
			t.Errorf("retry body %s, want the first run's %s", retry.body, want)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// wantProblem checks a problem+json answer.
func wantProblem(t *testing.T, a answer, status int, typ string) {
	t.Helper()
	if a.status != status {
		t.Errorf("status %d, want %d; body %s", a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	if a.replayed() {
		t.Errorf("a problem answer is marked replayed")
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.Detail == "" {
		t.Errorf("problem %+v, want type %s and status %d with a title and a detail", p, typ, status)
	}
}

// The key reused with another request gets 422, both while the first runs
// and after it is done, and the handler does not run for it.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		inner := c.debit()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			<-release
			inner.ServeHTTP(w, r)
		})
		srv := serve(t, httpidem.New(b.Idem(t))(h))
		hc := httpClient(t)
		first := make(chan answer, 1)
		go func() {
			a, _ := trySend(httpClient(t), srv.URL, req{key: "reuse", body: `{"amount":100}`})
			first <- a
		}()
		recv(t, started)
		for _, q := range []req{
			{key: "reuse", body: `{"amount":999}`},
			{key: "reuse", body: `{"amount":100}`, path: "/other"},
			{key: "reuse", body: `{"amount":100}`, method: http.MethodPatch},
			{key: "reuse", body: `{"amount":100}`, ctype: "text/plain"},
			{key: "reuse", body: `{"amount":100}`, path: "/debits?x=1"},
		} {
			wantProblem(t, send(t, hc, srv.URL, q), http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		}
		close(release)
		if a := recv(t, first); a.status != http.StatusCreated {
			t.Fatalf("first: %d %s", a.status, a.body)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "reuse", body: `{"amount":999}`}), http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// JSON bodies are compared canonically: member order and whitespace do not
// make a conflict; other media types are compared as bytes.
func TestJSONKeyOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t))(c.debit()))
		hc := httpClient(t)
		first := send(t, hc, srv.URL, req{key: "order", body: `{"account":"A","amount":100}`})
		for _, body := range []string{
			`{ "amount": 100, "account": "A" }`,
			"{\n\t\"amount\": 1e2,\n\t\"account\": \"\\u0041\"\n}",
		} {
			a := send(t, hc, srv.URL, req{key: "order", body: body, ctype: "application/json; charset=utf-8"})
			if a.status != http.StatusCreated || !a.replayed() || a.body != first.body {
				t.Errorf("%s: %d, replayed %v, %s; want the first response replayed", body, a.status, a.replayed(), a.body)
			}
		}
		send(t, hc, srv.URL, req{key: "text", body: `{"a":1,"b":2}`, ctype: "text/plain"})
		wantProblem(t, send(t, hc, srv.URL, req{key: "text", body: `{"b":2,"a":1}`, ctype: "text/plain"}),
			http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		if got := c.runs(); got != 2 {
			t.Errorf("handler ran %d times, want 2", got)
		}
	})
}

// While the first request runs, a duplicate that waited the Client's
// WithWait gets 409 with Retry-After; once it is done, the response.
func TestInProgress(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		release := make(chan struct{})
		started := make(chan struct{}, 1)
		inner := c.debit()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started <- struct{}{}
			<-release
			inner.ServeHTTP(w, r)
		})
		// Two instances, so that the duplicate asks Redis (not only the
		// first request's flight in its process).
		srv1 := serve(t, httpidem.New(b.Idem(t))(h))
		srv2 := serve(t, httpidem.New(b.Idem(t, idem.WithWait(50*time.Millisecond)), httpidem.WithRetryAfter(2*time.Second))(h))
		first := make(chan answer, 1)
		go func() {
			a, _ := trySend(httpClient(t), srv1.URL, req{key: "busy", body: `{}`})
			first <- a
		}()
		recv(t, started)
		hc := httpClient(t)
		a := send(t, hc, srv2.URL, req{key: "busy", body: `{}`})
		wantProblem(t, a, http.StatusConflict, httpidem.ProblemInProgress)
		if got := a.header.Get("Retry-After"); got != "2" {
			t.Errorf("Retry-After %q, want 2 (WithRetryAfter(2s))", got)
		}
		close(release)
		f := recv(t, first)
		if f.status != http.StatusCreated {
			t.Fatalf("first: %d %s", f.status, f.body)
		}
		again := send(t, hc, srv2.URL, req{key: "busy", body: `{}`})
		if again.status != http.StatusCreated || !again.replayed() || again.body != f.body {
			t.Errorf("after: %d replayed %v %s, want the first response replayed", again.status, again.replayed(), again.body)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

func TestBadKeys(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		keys := b.Idem(t)
		srv := serve(t, httpidem.New(keys)(c.debit()))
		required := serve(t, httpidem.New(keys, httpidem.WithRequired())(c.debit()))
		hc := httpClient(t)
		for name, q := range map[string]req{
			"empty":               {key: ""},
			"too long":            {key: strings.Repeat("k", 256)},
			"space":               {key: "a b"},
			"non-ASCII":           {key: "clé"},
			"sent twice":          {key: "a", header: http.Header{httpidem.HeaderIdempotencyKey: {"b"}}},
			"empty quoted":        {key: `""`},
			"bad escape":          {key: `"a\b"`},
			"quote inside quotes": {key: `"a"b"`},
		} {
			if name == "sent twice" {
				q.header = http.Header{httpidem.HeaderIdempotencyKey: {"a", "b"}}
				q.noKey = true
			}
			wantProblem(t, send(t, hc, srv.URL, q), http.StatusBadRequest, httpidem.ProblemKeyInvalid)
		}
		// Values that Go's client refuses to send, but its server lets
		// through (it refuses control characters other than tab itself).
		for _, key := range []string{"a\tb", "caf\xe9", "\xff"} {
			wantProblem(t, rawSend(t, srv.Listener.Addr().String(), key), http.StatusBadRequest, httpidem.ProblemKeyInvalid)
		}
		if got := c.runs(); got != 0 {
			t.Errorf("handler ran %d times for bad keys, want 0", got)
		}
		// 255 bytes is the longest; a quoted key is the same key unquoted.
		long := strings.Repeat("k", 255)
		if a := send(t, hc, srv.URL, req{key: long}); a.status != http.StatusCreated {
			t.Errorf("255-byte key: %d %s", a.status, a.body)
		}
		send(t, hc, srv.URL, req{key: `q-1`})
		if a := send(t, hc, srv.URL, req{key: `"q-1"`}); !a.replayed() {
			t.Errorf(`"q-1" is not the key q-1: %d %s`, a.status, a.body)
		}
		if a := send(t, hc, srv.URL, req{key: `"with space \" \\"`}); a.status != http.StatusCreated {
			t.Errorf("quoted key with escapes: %d %s", a.status, a.body)
		}
		// No key: through untouched, unless required.
		runs := c.runs()
		for range 2 {
			if a := send(t, hc, srv.URL, req{noKey: true}); a.status != http.StatusCreated || a.replayed() {
				t.Errorf("no key: %d replayed %v", a.status, a.replayed())
			}
		}
		wantProblem(t, send(t, hc, required.URL, req{noKey: true}), http.StatusBadRequest, httpidem.ProblemKeyMissing)
		if got := c.runs() - runs; got != 2 {
			t.Errorf("handler ran %d times for two requests without a key (and one refused), want 2", got)
		}
	})
}

// Methods other than WithMethods' pass through, key or not.
func TestOtherMethodsPassThrough(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t))(c.debit()))
		putSrv := serve(t, httpidem.New(b.Idem(t), httpidem.WithMethods(http.MethodPut))(c.debit()))
		hc := httpClient(t)
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			for range 2 {
				if a := send(t, hc, srv.URL, req{method: m, key: "same"}); a.replayed() {
					t.Errorf("%s replayed", m)
				}
			}
		}
		if got := c.runs(); got != 6 {
			t.Errorf("handler ran %d times for 6 requests passed through, want 6", got)
		}
		send(t, hc, putSrv.URL, req{method: http.MethodPut, key: "put"})
		if a := send(t, hc, putSrv.URL, req{method: http.MethodPut, key: "put"}); !a.replayed() {
			t.Errorf("PUT under WithMethods(PUT) not replayed")
		}
		if a := send(t, hc, putSrv.URL, req{key: "post"}); a.replayed() {
			t.Errorf("POST under WithMethods(PUT) handled")
		}
	})
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithMaxBody(10))(c.debit()))
		hc := httpClient(t)
		wantProblem(t, send(t, hc, srv.URL, req{key: "big", body: "12345678901"}), http.StatusRequestEntityTooLarge, httpidem.ProblemBodyTooLarge)
		// Without a Content-Length (chunked), the limit still holds.
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/debits", io.MultiReader(strings.NewReader("123456"), strings.NewReader("78901")))
		r.Header.Set(httpidem.HeaderIdempotencyKey, "big-chunked")
		r.ContentLength = -1
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantProblem(t, answer{status: resp.StatusCode, header: resp.Header, body: string(body)}, http.StatusRequestEntityTooLarge, httpidem.ProblemBodyTooLarge)
		if got := c.runs(); got != 0 {
			t.Errorf("handler ran %d times for bodies over the limit, want 0", got)
		}
		if a := send(t, hc, srv.URL, req{key: "fits", body: "1234567890", ctype: "text/plain"}); a.status != http.StatusCreated {
			t.Errorf("10-byte body: %d %s", a.status, a.body)
		}
	})
}

// A 5xx response is sent but not stored: the key is released and the
// retry runs the handler again, as attempt 2.
func TestServerErrorNotStored(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var fails atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fails.Add(1) == 1 {
				w.Header().Set("Retry-After", "3")
				http.Error(w, "bank down", http.StatusServiceUnavailable)
				return
			}
			inner.ServeHTTP(w, r)
		})
		srv := serve(t, httpidem.New(b.Idem(t))(h))
		hc := httpClient(t)
		q := req{key: "5xx", body: `{"amount":1}`}
		a := send(t, hc, srv.URL, q)
		if a.status != http.StatusServiceUnavailable || a.body != "bank down\n" || a.replayed() || a.header.Get("Retry-After") != "3" {
			t.Errorf("first: %d %q replayed %v, want the handler's 503", a.status, a.body, a.replayed())
		}
		a = send(t, hc, srv.URL, q)
		if a.status != http.StatusCreated || a.replayed() {
			t.Errorf("second: %d replayed %v, want 201 from a new run", a.status, a.replayed())
		}
		if want := `{"run":1,"attempt":2,"body":"{\"amount\":1}"}`; a.body != want {
			t.Errorf("second body %s, want %s", a.body, want)
		}
		if a3 := send(t, hc, srv.URL, q); !a3.replayed() || a3.body != a.body {
			t.Errorf("third: %d replayed %v %s, want the 201 replayed", a3.status, a3.replayed(), a3.body)
		}
		if got := fails.Load(); got != 2 {
			t.Errorf("handler ran %d times, want 2", got)
		}
	})
}

// A handler's panic releases the key and reaches the server (which drops
// the connection); the retry runs the handler again, as attempt 2.
func TestPanic(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var calls atomic.Int64
		var recovered atomic.Value
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				panic("boom")
			}
			inner.ServeHTTP(w, r)
		})
		mw := httpidem.New(b.Idem(t))(h)
		// Sees the panic on its way to the server, and lets it go on.
		watch := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if p := recover(); p != nil {
					recovered.Store(p)
					panic(p)
				}
			}()
			mw.ServeHTTP(w, r)
		})
		srv := serve(t, watch)
		q := req{key: "panic", body: `{}`}
		if a, err := trySend(httpClient(t), srv.URL, q); err == nil {
			t.Fatalf("first: %d %s, want the connection dropped", a.status, a.body)
		}
		if p := recovered.Load(); p != "boom" {
			t.Errorf("the panic reached the server as %v, want boom", p)
		}
		a := send(t, httpClient(t), srv.URL, q)
		if want := `{"run":1,"attempt":2,"body":"{}"}`; a.status != http.StatusCreated || a.body != want || a.replayed() {
			t.Errorf("retry: %d %s replayed %v, want 201 %s from a new run", a.status, a.body, a.replayed(), want)
		}
	})
}

// statusErr is a scope error that gives its own status.
type statusErr struct{ status int }

func (e statusErr) Error() string   { return "forbidden here" }
func (e statusErr) StatusCode() int { return e.status }

// One user's key never replays another user's response.
func TestScope(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		scope := func(r *http.Request) (string, error) {
			switch u := r.Header.Get("X-User"); u {
			case "":
				return "", errors.New("no user")
			case "mallory":
				return "", fmt.Errorf("user %s: %w", u, statusErr{http.StatusForbidden})
			default:
				return u, nil
			}
		}
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithScope(scope))(c.debit()))
		hc := httpClient(t)
		as := func(user, body string) answer {
			return send(t, hc, srv.URL, req{key: "k", body: body, header: http.Header{"X-User": {user}}})
		}
		alice := as("alice", `{"amount":1}`)
		bob := as("bob", `{"amount":2}`)
		if bob.status != http.StatusCreated || bob.replayed() || bob.body == alice.body {
			t.Errorf("bob with alice's key: %d replayed %v %s; want his own run", bob.status, bob.replayed(), bob.body)
		}
		if a := as("alice", `{"amount":1}`); !a.replayed() || a.body != alice.body {
			t.Errorf("alice's retry: replayed %v %s, want %s", a.replayed(), a.body, alice.body)
		}
		// Scopes "ab" + key "c" and "a" + key "bc" are apart.
		abc := send(t, hc, srv.URL, req{key: "c", header: http.Header{"X-User": {"ab"}}})
		if a := send(t, hc, srv.URL, req{key: "bc", header: http.Header{"X-User": {"a"}}}); a.replayed() || a.body == abc.body {
			t.Errorf("scope a, key bc replayed scope ab, key c: %s", a.body)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "k", body: `{}`}), http.StatusUnauthorized, httpidem.ProblemScope)
		wantProblem(t, as("mallory", `{}`), http.StatusForbidden, httpidem.ProblemScope)
		if got := c.runs(); got != 4 {
			t.Errorf("handler ran %d times, want 4", got)
		}
	})
}

// A response larger than WithMaxResponse reaches the client whole, as it is
// written (Flush works), and is not stored: the retry gets 500, and the
// handler does not run again. A large 5xx releases the key.
func TestLargeResponse(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int64
		chunk := bytes.Repeat([]byte("0123456789"), 100)
		flushed := make(chan error, 100)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			status := http.StatusOK
			if r.URL.Query().Get("fail") != "" {
				status = http.StatusBadGateway
			}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(status)
			for range 5 {
				_, _ = w.Write(chunk)
				flushed <- http.NewResponseController(w).Flush()
			}
		})
		var logs syncBuffer
		mw := httpidem.New(b.Idem(t), httpidem.WithMaxResponse(2500), httpidem.WithLogger(slogTo(&logs)))
		srv := serve(t, mw(h))
		hc := httpClient(t)
		a := send(t, hc, srv.URL, req{key: "large", ctype: "text/plain"})
		if a.status != http.StatusOK || a.body != strings.Repeat(string(chunk), 5) || a.replayed() {
			t.Errorf("first: %d, %d bytes, replayed %v; want 200 with all 5000 bytes", a.status, len(a.body), a.replayed())
		}
		for range 5 {
			select {
			case err := <-flushed:
				if err != nil {
					t.Errorf("Flush: %v", err)
				}
			default:
				t.Fatal("the handler flushed fewer than 5 times")
			}
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "large", ctype: "text/plain"}), http.StatusInternalServerError, httpidem.ProblemNotStored)
		if got := runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if !strings.Contains(logs.String(), "not stored") {
			t.Errorf("no log line says the response was not stored; log: %s", logs.String())
		}
		for range 2 {
			a := send(t, hc, srv.URL, req{key: "large-5xx", path: "/debits?fail=1", ctype: "text/plain"})
			if a.status != http.StatusBadGateway || len(a.body) != 5000 {
				t.Errorf("large 502: %d, %d bytes", a.status, len(a.body))
			}
		}
		if got := runs.Load(); got != 3 {
			t.Errorf("handler ran %d times, want 3 (a large 5xx is not stored)", got)
		}
	})
}

// Hijack is refused behind the middleware.
func TestHijackRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var got error
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _, got = http.NewResponseController(w).Hijack()
			w.WriteHeader(http.StatusAccepted)
		})
		srv := serve(t, httpidem.New(b.Idem(t))(h))
		if a := send(t, httpClient(t), srv.URL, req{key: "hj"}); a.status != http.StatusAccepted {
			t.Errorf("status %d, want 202", a.status)
		}
		if !errors.Is(got, http.ErrNotSupported) {
			t.Errorf("Hijack: %v, want an error wrapping http.ErrNotSupported", got)
		}
	})
}

// Statuses without a body, headers the handler set late, informational
// responses and outer middleware's headers.
func TestResponseDetails(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			w.Header().Set("X-Run", itoa(n))
			w.Header().Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
			w.Header().Set(httpidem.HeaderReplayed, "true") // the handler cannot fake it
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusNoContent)
			w.Header().Set("X-Late", "ignored") // after the status: not sent, not stored
			if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
				t.Errorf("Write after 204: %v, want http.ErrBodyNotAllowed", err)
			}
		})
		outer := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
				w.Header().Set("X-Run", "outer")
				next.ServeHTTP(w, r)
			})
		}
		srv := serve(t, outer(httpidem.New(b.Idem(t))(h)))
		hc := httpClient(t)
		for i, want := range []bool{false, true} {
			a := send(t, hc, srv.URL, req{key: "204", header: http.Header{"X-Request-Id": {itoa(i)}}})
			if a.status != http.StatusNoContent || a.body != "" || a.replayed() != want {
				t.Errorf("request %d: %d %q replayed %v, want 204, empty, replayed %v", i, a.status, a.body, a.replayed(), want)
			}
			if a.header.Get("X-Run") != "1" || a.header.Get("X-Late") != "" || a.header.Get("X-Request-Id") != itoa(i) {
				t.Errorf("request %d: headers %v", i, a.header)
			}
			if a.header.Get("Date") == "Mon, 02 Jan 2006 15:04:05 GMT" {
				t.Errorf("request %d: the handler's Date was sent; the server sets its own", i)
			}
		}
	})
}

// With Redis unreachable, the handler does not run: 503 with Retry-After.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	b := &backend{Name: "closed port", Addr: redistest.RefusedAddr(t)}
	var c counter
	srv := serve(t, httpidem.New(b.Idem(t))(c.debit()))
	a := send(t, httpClient(t), srv.URL, req{key: "down", body: `{}`})
	wantProblem(t, a, http.StatusServiceUnavailable, httpidem.ProblemUnavailable)
	if a.header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q, want 1", a.header.Get("Retry-After"))
	}
	if got := c.runs(); got != 0 {
		t.Errorf("handler ran %d times without Redis, want 0", got)
	}
}

// A record that is not one idem wrote, or an idem record whose result is
// not a stored response: 500, and the handler does not run.
func TestCorruptRecords(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		keys := b.Idem(t)
		srv := serve(t, httpidem.New(keys)(c.debit()))
		hc := httpClient(t)
		rdb := redisClient(t, b)
		ctx := context.Background()
		// The record of key "garbage" with no scope ("0:" before the key).
		if err := rdb.Set(ctx, "idem:{0:garbage}", "not a record", 0).Err(); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "garbage"}), http.StatusInternalServerError, httpidem.ProblemServerError)
		// A result that Client.Do stored, but not in the middleware's format.
		if _, err := keys.Do(ctx, "0:foreign", "", func(context.Context) ([]byte, error) { return []byte("hello"), nil }); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "foreign"}), http.StatusInternalServerError, httpidem.ProblemServerError)
		if got := c.runs(); got != 0 {
			t.Errorf("handler ran %d times on corrupt records, want 0", got)
		}
	})
}

// The handler ran, but Redis went away before its response was recorded:
// 500 ProblemNotRecorded, never the handler's response as if it were safe.
func TestNotRecorded(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var down func()
		if b.MR != nil {
			down = b.MR.Close
		} else {
			rdb := redisClient(t, b)
			down = func() { // every later write fails: Redis is out of memory
				_ = rdb.ConfigSet(context.Background(), "maxmemory", "1").Err()
			}
		}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			down()
			inner.ServeHTTP(w, r)
		})
		var logs syncBuffer
		srv := serve(t, httpidem.New(b.Idem(t, idem.WithStoreTimeout(300*time.Millisecond)), httpidem.WithLogger(slogTo(&logs)))(h))
		a := send(t, httpClient(t), srv.URL, req{key: "nr", body: `{}`})
		wantProblem(t, a, http.StatusInternalServerError, httpidem.ProblemNotRecorded)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if !strings.Contains(logs.String(), "not recorded") {
			t.Errorf("log does not say the response was not recorded: %s", logs.String())
		}
	})
}

// A handler behind the middleware reads the attempt from its context, and
// its context ends when the client goes away.
func TestAttemptInContext(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		got := make(chan idem.Attempt, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a, _ := idem.AttemptFrom(r.Context())
			got <- a
		})
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithScope(func(*http.Request) (string, error) { return "u1", nil }))(h))
		send(t, httpClient(t), srv.URL, req{key: "ctx"})
		if a := recv(t, got); a.Number != 1 || a.Key != "2:u1ctx" {
			t.Errorf("attempt %+v, want number 1 and key 2:u1ctx", a)
		}
	})
}

// The body the fingerprint and the handler see, through a form request.
func TestFingerprintOption(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		var seen atomic.Value
		fp := func(r *http.Request, body []byte) (string, error) {
			seen.Store(string(body))
			if r.Header.Get("X-Reject") != "" {
				return "", errors.New("rejected by the fingerprint")
			}
			// Only the account counts.
			v, _ := url.ParseQuery(string(body))
			return v.Get("account"), nil
		}
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithFingerprint(fp))(c.debit()))
		hc := httpClient(t)
		form := "application/x-www-form-urlencoded"
		first := send(t, hc, srv.URL, req{key: "f", ctype: form, body: "account=A&note=1"})
		if seen.Load() != "account=A&note=1" || !strings.Contains(first.body, `account=A&note=1`) {
			t.Errorf("fingerprint saw %v, handler answered %s", seen.Load(), first.body)
		}
		if a := send(t, hc, srv.URL, req{key: "f", ctype: form, body: "account=A&note=2"}); !a.replayed() {
			t.Errorf("same account, other note: %d, want a replay", a.status)
		}
		wantProblem(t, send(t, hc, srv.URL, req{key: "f", ctype: form, body: "account=B"}), http.StatusUnprocessableEntity, httpidem.ProblemKeyReused)
		wantProblem(t, send(t, hc, srv.URL, req{key: "g", header: http.Header{"X-Reject": {"1"}}}), http.StatusBadRequest, httpidem.ProblemBadRequest)
	})
}

// The stored-response path does not depend on the server: ServeHTTP with
// a recorder works the same, for handlers that test with httptest.
func TestWithRecorder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		h := httpidem.New(b.Idem(t))(c.debit())
		var bodies []string
		for range 2 {
			r := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{"x":1}`))
			r.Header.Set(httpidem.HeaderIdempotencyKey, "rec")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			res := w.Result()
			bodies = append(bodies, w.Body.String())
			if res.StatusCode != http.StatusCreated || res.Header.Get("Content-Length") != itoa(w.Body.Len()) {
				t.Errorf("%d, Content-Length %q for %d bytes", res.StatusCode, res.Header.Get("Content-Length"), w.Body.Len())
			}
		}
		if bodies[0] != bodies[1] || c.runs() != 1 {
			t.Errorf("bodies %q, %d runs; want one run replayed", bodies, c.runs())
		}
	})
}

// Invalid options are programming errors.
func TestNewPanics(t *testing.T) {
	t.Parallel()
	mr := &backend{Addr: "127.0.0.1:1"}
	keys := mr.Idem(t)
	for name, f := range map[string]func(){
		"nil client":       func() { httpidem.New(nil) },
		"no methods":       func() { httpidem.New(keys, httpidem.WithMethods()) },
		"bad header":       func() { httpidem.New(keys, httpidem.WithHeader("a b")) },
		"negative body":    func() { httpidem.New(keys, httpidem.WithMaxBody(-1)) },
		"key length 0":     func() { httpidem.New(keys, httpidem.WithMaxKeyLen(0)) },
		"response 0":       func() { httpidem.New(keys, httpidem.WithMaxResponse(0)) },
		"retry after 0":    func() { httpidem.New(keys, httpidem.WithRetryAfter(0)) },
		"retry after 1.5s": func() { httpidem.New(keys, httpidem.WithRetryAfter(1500*time.Millisecond)) },
		"nil scope":        func() { httpidem.New(keys, httpidem.WithScope(nil)) },
		"nil fp":           func() { httpidem.New(keys, httpidem.WithFingerprint(nil)) },
		"nil handler":      func() { httpidem.New(keys)(nil) },
		"empty method":     func() { httpidem.New(keys, httpidem.WithMethods("")) },
		"header w/colon":   func() { httpidem.New(keys, httpidem.WithHeader("X:Y")) },
	} {
		func() {
			defer func() {
				p := recover()
				if p == nil {
					t.Errorf("%s: no panic", name)
				} else if s := fmt.Sprint(p); !strings.HasPrefix(s, "httpidem: ") {
					t.Errorf("%s: panic %q without the package prefix", name, s)
				}
			}()
			f()
		}()
	}
}

// WithHeader reads the key from another header.
func TestWithHeader(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithHeader("x-request-key"))(c.debit()))
		hc := httpClient(t)
		for range 2 {
			send(t, hc, srv.URL, req{noKey: true, header: http.Header{"X-Request-Key": {"hk"}}})
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// syncBuffer is a bytes.Buffer for a logger that handlers write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
