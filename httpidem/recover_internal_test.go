package httpidem

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// A stored request comes back from its encoding as it was.
func TestRequestRoundTrip(t *testing.T) {
	for _, q := range []request{
		{},
		{fp: "0123456789abcdef", method: "POST", url: "/a?b=c", host: "h", contentType: "application/json", key: "k", scope: "s",
			header: http.Header{"X-A": {"1", "2"}, "X-B": {""}}, body: []byte(`{"x":1}`)},
		{method: "PUT", body: []byte(strings.Repeat("y", 70000))},
	} {
		b, err := q.MarshalMsgpack()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != q.size() {
			t.Errorf("encoding of %d bytes, size says %d", len(b), q.size())
		}
		var got request
		if err := got.UnmarshalMsgpack(b); err != nil {
			t.Fatal(err)
		}
		if got.fp != q.fp || got.method != q.method || got.url != q.url || got.host != q.host || got.contentType != q.contentType ||
			got.key != q.key || got.scope != q.scope || string(got.body) != string(q.body) || len(got.header) != len(q.header) {
			t.Errorf("got %+v, want %+v", got, q)
		}
		for k, vs := range q.header {
			if strings.Join(got.header[k], ",") != strings.Join(vs, ",") {
				t.Errorf("header %s: got %q, want %q", k, got.header[k], vs)
			}
		}
	}
	var q request
	for _, bad := range [][]byte{nil, {0xc4}, {0xc4, 1, 'h'}, {0xc4, 2, 'q', 9}, {0xc4, 3, 'q', 1, 5}} {
		if err := q.UnmarshalMsgpack(bad); !errors.Is(err, idem.ErrCorrupt) {
			t.Errorf("%q: got %v, want ErrCorrupt", bad, err)
		}
	}
}

// The operation run without a live request (a recovery) rebuilds the
// stored request, with only the named headers, its key and its scope
// (ScopeFrom), runs the handler on it, and stores its response: the
// status check and the retry of its principal get it, another principal's
// check does not.
func TestRecoveredRequestRedispatched(t *testing.T) {
	b := idemtest.Miniredis(t)
	keys := b.Idem(t, idem.WithLogger(nil))
	var runs atomic.Int64
	seen := make(chan *http.Request, 1)
	var seenBody, seenScope string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l, _ := r.Context().Value(liveKey{}).(*live); l != nil {
			t.Errorf("the handler's context carries the request the middleware serves")
		}
		if runs.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		body, _ := io.ReadAll(r.Body)
		seenBody = string(body)
		seenScope, _ = ScopeFrom(r.Context())
		seen <- r
		w.Header().Set("Location", "/debits/1")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "recovered")
	})
	scope := WithScope(func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "", errors.New("who?")
	})
	opts := []Option{scope, WithRecovery("debit", "X-Tenant"), WithLogger(nil)}
	m := New(keys, opts...)(h).(*middleware)
	status := StatusHandler(keys, opts...)

	newReq := func(method, target, body string, hdr ...string) *http.Request {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(HeaderIdempotencyKey, "k-1")
		for i := 0; i < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	const body = `{"amount":12}`
	first := newReq("POST", "/debits?x=1", body, "X-User", "alice", "X-Tenant", "t7", "Authorization", "Bearer s")
	w := httptest.NewRecorder()
	m.ServeHTTP(w, first)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: got %d, want 503", w.Code)
	}

	// What Recover does: run the operation from its stored input, with no
	// caller's request.
	fp, err := DefaultFingerprint(newReq("POST", "/debits?x=1", body), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	q := m.request(newReq("POST", "/debits?x=1", body, "X-Tenant", "t7", "Authorization", "Bearer s"), fp, "alice", []byte(body))
	enc, _ := q.MarshalMsgpack()
	var stored request
	if err := stored.UnmarshalMsgpack(enc); err != nil {
		t.Fatal(err)
	}
	if _, err := m.op.Do(context.Background(), ScopedKey("alice", "k-1"), stored); err != nil {
		t.Fatalf("recovery: %v", err)
	}
	r := <-seen
	if r.Method != "POST" || r.URL.RequestURI() != "/debits?x=1" || seenBody != body {
		t.Errorf("recovered request: %s %s %q", r.Method, r.URL.RequestURI(), seenBody)
	}
	if r.Header.Get("X-Tenant") != "t7" || r.Header.Get(HeaderIdempotencyKey) != "k-1" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("recovered request's headers: %v", r.Header)
	}
	if r.Header.Get("Authorization") != "" {
		t.Errorf("recovered request carries Authorization, which WithRecovery does not name")
	}
	if seenScope != "alice" {
		t.Errorf("ScopeFrom: got %q, want alice", seenScope)
	}

	check := func(user string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		status.ServeHTTP(w, newReq("GET", "/status", "", "X-User", user))
		return w
	}
	if got := check("alice"); got.Code != http.StatusCreated || got.Body.String() != "recovered" || got.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("alice's status check: got %d %q", got.Code, got.Body.String())
	}
	if got := check("bob"); got.Code != http.StatusNotFound {
		t.Errorf("bob's status check: got %d %q, want 404", got.Code, got.Body.String())
	}
	w = httptest.NewRecorder()
	m.ServeHTTP(w, newReq("POST", "/debits?x=1", body, "X-User", "alice"))
	if w.Code != http.StatusCreated || w.Body.String() != "recovered" || w.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("alice's retry: got %d %q", w.Code, w.Body.String())
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
}

// A recovered request whose handler panics is a transient failure of the
// attempt: the key is released, the process goes on.
func TestRecoveredRequestPanics(t *testing.T) {
	b := idemtest.Miniredis(t)
	keys := b.Idem(t, idem.WithLogger(nil))
	m := New(keys, WithRecovery("debit"), WithLogger(nil))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	})).(*middleware)
	_, err := m.op.Do(context.Background(), ScopedKey("", "k-2"), request{method: "POST", url: "/x", key: "k-2"})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("got %v, want the panic as an error", err)
	}
	st, err := keys.Status(context.Background(), ScopedKey("", "k-2"))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != idem.StateReleased {
		t.Errorf("got state %v, want released", st.State)
	}
}
