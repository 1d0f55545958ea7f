package httpidem_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the tests with Redis down cause some.
	redis.SetLogger(quietLogger{})
	idemtest.SetParallel(4)
	// Every server, connection and idem.Client of a test must be gone when
	// it ends.
	goleak.VerifyTestMain(m)
}

// backend is one Redis the tests run against, as in every package's
// tests: miniredis, or a real redis-server started for the test.
type backend = idemtest.Backend

// eachBackend runs f against miniredis and against a real redis-server
// (idemtest.EachBackend).
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	idemtest.EachBackend(t, f)
}

// serve starts a real HTTP server with h, closed when the test ends. The
// server's own log (a handler's panic) is discarded.
func serve(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// httpClient returns a client with a transport of its own (its own
// connections), whose idle connections are closed when the test ends.
func httpClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// req describes a request of the tests.
type req struct {
	method, path, key, ctype, body string
	header                         http.Header // more headers
	noKey                          bool        // send no key header at all
}

// answer is what the client got.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get(httpidem.HeaderReplayed) == "true" }

// send sends q with c and returns the answer; a transport error fails the
// test.
func send(t testing.TB, c *http.Client, base string, q req) answer {
	t.Helper()
	a, err := trySend(c, base, q)
	if err != nil {
		t.Fatalf("%s %s: %v", q.method, q.path, err)
	}
	return a
}

func trySend(c *http.Client, base string, q req) (answer, error) {
	if q.method == "" {
		q.method = http.MethodPost
	}
	if q.path == "" {
		q.path = "/debits"
	}
	r, err := http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
	if err != nil {
		return answer{}, err
	}
	if q.ctype == "" {
		q.ctype = "application/json"
	}
	r.Header.Set("Content-Type", q.ctype)
	if !q.noKey {
		r.Header.Set(httpidem.HeaderIdempotencyKey, q.key)
	}
	for k, vs := range q.header {
		r.Header[k] = vs
	}
	resp, err := c.Do(r)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// counter is a handler's count of its runs.
type counter struct{ n atomic.Int64 }

func (c *counter) runs() int64 { return c.n.Load() }

// debit is the handler most tests wrap: it counts its runs and answers 201
// with headers of several kinds and a body that names the run, the attempt
// and the request body it saw.
func (c *counter) debit() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := c.n.Add(1)
		body, _ := io.ReadAll(r.Body)
		a, _ := idem.AttemptFrom(r.Context())
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/debits/"+itoa(n))
		h.Add("X-Multi", "one")
		h.Add("X-Multi", "two")
		h.Set("Set-Cookie", "seen=1; Path=/")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"run":`+itoa(n)+`,"attempt":`+itoa(a.Number)+`,"body":`+quote(body)+`}`)
	})
}

func itoa[T int | int64](n T) string { return strconv.FormatInt(int64(n), 10) }

// quote returns b as a JSON string (the tests' bodies are ASCII).
func quote(b []byte) string { return strconv.Quote(string(b)) }

// redisClient returns a go-redis client of the backend, for the tests' own
// commands, closed when the test ends.
func redisClient(t testing.TB, b *backend) *redis.Client {
	t.Helper()
	return b.Client(t)
}

// slogTo returns a logger that writes text lines to w.
func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// rawSend sends a request written by hand (for header values that Go's
// client refuses to send) on a connection of its own, and returns the
// status and the body.
func rawSend(t testing.TB, addr, key string) answer {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /debits HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", key)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// recv receives from ch, or fails the test after 30 seconds: a test that
// fails does not hang.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received in 30s")
		panic("unreachable")
	}
}
