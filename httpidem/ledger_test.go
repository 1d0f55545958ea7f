package httpidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// bank is an idem.Ledger kept in memory, standing in for the service's
// database: the accounts' balances and the ledger's rows, which a
// transaction (bankTx) changes together, or not at all.
type bank struct {
	mu      sync.Mutex
	rows    map[string]idem.Entry
	balance map[string]int64
	debits  int // movements applied
}

func newBank() *bank {
	return &bank{rows: map[string]idem.Entry{}, balance: map[string]int64{"A": 1000}}
}

func (b *bank) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.rows[key]
	return e, ok, nil
}

func (b *bank) MaxKeyLen() int { return 0 }

// state returns the balance of account A and the number of movements.
func (b *bank) state() (int64, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.balance["A"], b.debits
}

// bankTx is one transaction of a bank: its debits are applied by its
// commit, with the ledger's row, only when the key has no row yet (the
// database's unique key); otherwise it rolls back and returns the row.
type bankTx struct {
	b      *bank
	debits []int64
}

func (tx *bankTx) debit(amount int64) { tx.debits = append(tx.debits, amount) }

func (tx *bankTx) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	b := tx.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.rows[e.Key]; ok {
		tx.debits = nil
		return old, true, nil
	}
	for _, d := range tx.debits {
		b.balance["A"] -= d
		b.debits++
	}
	b.rows[e.Key] = e
	return idem.Entry{}, false, nil
}

func (tx *bankTx) Rollback(context.Context) error { tx.debits = nil; return nil }

// debitHandler is a debit API on the bank: it debits the amount of the
// request in a transaction, answers 201 with a receipt that names its run,
// and commits the response (httpidem.Recorded) in the transaction. before,
// when set, runs between the response and the commit; commitErr, when set,
// gets the commit's error.
type debitHandler struct {
	bank      *bank
	runs      counter
	before    func(run int64)
	commitErr func(error)
}

func (h *debitHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.runs.n.Add(1)
	var q struct{ Amount int64 }
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tx := &bankTx{b: h.bank}
	tx.debit(q.Amount)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/debits/"+itoa(n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"receipt":%d,"amount":%d}`, n, q.Amount)
	b, err := httpidem.Recorded(w)
	if err != nil {
		panic(err) // the tests' handler is always behind the middleware
	}
	if h.before != nil {
		h.before(n)
	}
	err = idem.Commit(r.Context(), tx, b)
	if h.commitErr != nil {
		h.commitErr(err)
	}
	// Whatever the commit says, return: on ErrRecorded the middleware
	// answers with the recorded response.
}

// sameResponse fails the test unless got is want, replayed, byte for byte
// but for Date and Idempotent-Replayed.
func sameResponse(t *testing.T, what string, got, want answer) {
	t.Helper()
	if !got.replayed() {
		t.Errorf("%s: not marked %s: true", what, httpidem.HeaderReplayed)
	}
	strip := func(h http.Header) string {
		h = h.Clone()
		h.Del("Date")
		h.Del(httpidem.HeaderReplayed)
		return fmt.Sprint(h)
	}
	if got.status != want.status || got.body != want.body || strip(got.header) != strip(want.header) {
		t.Errorf("%s: %d %v %s\nwant the recorded %d %v %s", what, got.status, strip(got.header), got.body, want.status, strip(want.header), want.body)
	}
}

// A debit handler that commits its response through the ledger debits
// once: a retry after Redis lost everything (FLUSHALL) runs the handler,
// whose commit meets the ledger's row and rolls back, and gets the
// committed response as a replay; so do 20 concurrent duplicates, from
// four service instances, before and after another FLUSHALL.
func TestLedgerDebitExactlyOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := newBank()
		h := &debitHandler{bank: bk}
		var srvs []string
		for range 4 {
			c := b.Idem(t, idem.WithLedger(bk))
			srvs = append(srvs, serve(t, httpidem.New(c)(h)).URL)
		}
		hc := httpClient(t)
		q := req{key: "debit-1", body: `{"Amount":100}`}

		first := send(t, hc, srvs[0], q)
		if first.status != http.StatusCreated || first.replayed() || first.body != `{"receipt":1,"amount":100}` {
			t.Fatalf("first: %d replayed %v %s", first.status, first.replayed(), first.body)
		}
		sameResponse(t, "retry", send(t, hc, srvs[1], q), first)

		redisClient(t, b).FlushAll(context.Background())
		sameResponse(t, "retry after FLUSHALL", send(t, hc, srvs[2], q), first)
		if runs := h.runs.runs(); runs != 2 {
			t.Errorf("handler ran %d times; want 2 (once more after FLUSHALL, rolled back)", runs)
		}
		sameResponse(t, "retry after the ledger's replay", send(t, hc, srvs[3], q), first)
		if runs := h.runs.runs(); runs != 2 {
			t.Errorf("handler ran %d times; want 2 (the record is finished from the ledger)", runs)
		}

		for round := range 2 {
			redisClient(t, b).FlushAll(context.Background())
			answers := make([]answer, 20)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() { answers[i] = send(t, hc, srvs[i%len(srvs)], q) })
			}
			wg.Wait()
			for i, a := range answers {
				sameResponse(t, fmt.Sprintf("round %d, duplicate %d", round, i), a, first)
			}
		}
		if bal, n := bk.state(); bal != 900 || n != 1 {
			t.Fatalf("balance %d after %d movements; want 900 after 1", bal, n)
		}
	})
}

// 20 concurrent duplicates of a fresh key: one debit, one receipt.
func TestLedgerConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := newBank()
		h := &debitHandler{bank: bk}
		var srvs []string
		for range 4 {
			c := b.Idem(t, idem.WithLedger(bk))
			srvs = append(srvs, serve(t, httpidem.New(c)(h)).URL)
		}
		hc := httpClient(t)
		q := req{key: "debit-2", body: `{"Amount":7}`}
		answers := make([]answer, 20)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = send(t, hc, srvs[i%len(srvs)], q) })
		}
		wg.Wait()
		originals := 0
		for i, a := range answers {
			if a.status != http.StatusCreated || a.body != `{"receipt":1,"amount":7}` {
				t.Errorf("duplicate %d: %d %s", i, a.status, a.body)
			}
			if !a.replayed() {
				originals++
			}
		}
		if originals != 1 {
			t.Errorf("%d answers not replayed; want 1", originals)
		}
		if bal, n := bk.state(); bal != 993 || n != 1 || h.runs.runs() != 1 {
			t.Fatalf("balance %d after %d movements, %d runs; want 993, 1, 1", bal, n, h.runs.runs())
		}
	})
}

// Two live owners: A's record is lost while its handler runs (before its
// commit), B runs and commits; A's commit then meets B's row, and A's
// client gets B's response, byte for byte, as a replay, not what A's
// handler wrote. One debit.
func TestLedgerTwoLiveOwners(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := newBank()
		started, proceed := make(chan struct{}), make(chan struct{})
		aErr := make(chan error, 2)
		h := &debitHandler{bank: bk,
			before: func(run int64) {
				if run == 1 {
					close(started)
					<-proceed
				}
			},
			commitErr: func(err error) {
				if err != nil {
					aErr <- err
				}
			},
		}
		srvA := serve(t, httpidem.New(b.Idem(t, idem.WithLedger(bk)))(h))
		srvB := serve(t, httpidem.New(b.Idem(t, idem.WithLedger(bk)))(h))
		hc := httpClient(t)
		q := req{key: "debit-3", body: `{"Amount":5}`}
		aDone := make(chan answer, 1)
		go func() { aDone <- send(t, hc, srvA.URL, q) }()
		recv(t, started)
		redisClient(t, b).Del(context.Background(), "idem:{"+httpidem.ScopedKey("", "debit-3")+"}") // A's record is lost
		fromB := send(t, hc, srvB.URL, q)
		if fromB.status != http.StatusCreated || fromB.replayed() || fromB.body != `{"receipt":2,"amount":5}` {
			t.Fatalf("B: %d replayed %v %s", fromB.status, fromB.replayed(), fromB.body)
		}
		close(proceed)
		fromA := recv(t, aDone)
		sameResponse(t, "A", fromA, fromB)
		if err := recv(t, aErr); !errors.Is(err, idem.ErrRecorded) {
			t.Errorf("A's commit: %v; want ErrRecorded", err)
		}
		if bal, n := bk.state(); bal != 995 || n != 1 {
			t.Fatalf("balance %d after %d movements; want 995 after 1", bal, n)
		}
	})
}

// Recorded returns the response so far in the stored form: the bytes that
// the middleware stores in Redis for it without a ledger.
func TestRecordedIsTheStoredForm(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		var got []byte
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Kept", "1")
			w.Header().Set("Set-Cookie", "s=1") // per-user: not stored without WithScope
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "queued")
			var err error
			if got, err = httpidem.Recorded(w); err != nil {
				t.Error(err)
			}
		})
		srv := serve(t, httpidem.New(b.Idem(t))(h))
		if a := send(t, httpClient(t), srv.URL, req{key: "k"}); a.status != http.StatusAccepted {
			t.Fatalf("status %d", a.status)
		}
		record, err := redisClient(t, b).Get(context.Background(), "idem:{0:k}").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 || !strings.HasSuffix(string(record), string(got)) {
			t.Fatalf("Recorded gave %q; the stored record is %q", got, record)
		}
		if strings.Contains(string(got), "Set-Cookie") || !strings.Contains(string(got), "X-Kept") {
			t.Fatalf("Recorded gave %q; want X-Kept and no Set-Cookie", got)
		}
	})
}

// unwrapping is a user's wrapper of the handler's writer, with Unwrap.
type unwrapping struct{ http.ResponseWriter }

func (u unwrapping) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// opaque wraps a writer without Unwrap.
type opaque struct{ http.ResponseWriter }

// Recorded finds the middleware's writer through wrappers with Unwrap, and
// says clearly when there is none: outside the middleware, a request it
// passes through, a wrapper without Unwrap; and it refuses a 5xx and a
// response too large to store.
func TestRecordedOutsideTheMiddleware(t *testing.T) {
	t.Parallel()
	if _, err := httpidem.Recorded(httptest.NewRecorder()); !errors.Is(err, httpidem.ErrNoMiddleware) {
		t.Fatalf("a plain writer: %v; want ErrNoMiddleware", err)
	}
	if _, err := httpidem.Recorded(nil); !errors.Is(err, httpidem.ErrNoMiddleware) {
		t.Fatalf("nil: %v; want ErrNoMiddleware", err)
	}
	eachBackend(t, func(t *testing.T, b *backend) {
		type result struct {
			n   int
			err error
		}
		results := make(chan result, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			status := http.StatusOK
			if s := r.URL.Query().Get("status"); s != "" {
				fmt.Sscan(s, &status)
			}
			w.WriteHeader(status)
			if r.URL.Query().Get("big") != "" {
				_, _ = w.Write(make([]byte, 2048))
			}
			var ww http.ResponseWriter = w
			switch r.URL.Query().Get("wrap") {
			case "unwrap":
				ww = unwrapping{unwrapping{w}}
			case "opaque":
				ww = opaque{w}
			}
			got, err := httpidem.Recorded(ww)
			results <- result{len(got), err}
		})
		srv := serve(t, httpidem.New(b.Idem(t), httpidem.WithMaxResponse(1024))(h))
		hc := httpClient(t)
		for _, tc := range []struct {
			q       req
			wantErr error // nil: no error
			other   bool  // an error, not ErrNoMiddleware
		}{
			{q: req{key: "a", path: "/?wrap=unwrap"}},
			{q: req{key: "b"}},
			{q: req{noKey: true}, wantErr: httpidem.ErrNoMiddleware},
			{q: req{method: http.MethodGet, key: "c"}, wantErr: httpidem.ErrNoMiddleware},
			{q: req{key: "d", path: "/?wrap=opaque"}, wantErr: httpidem.ErrNoMiddleware},
			{q: req{key: "e", path: "/?status=503"}, other: true},
			{q: req{key: "f", path: "/?big=1"}, wantErr: idem.ErrTooLarge},
		} {
			send(t, hc, srv.URL, tc.q)
			r := recv(t, results)
			switch {
			case tc.wantErr != nil && !errors.Is(r.err, tc.wantErr):
				t.Errorf("%+v: %v; want %v", tc.q, r.err, tc.wantErr)
			case tc.other && (r.err == nil || errors.Is(r.err, httpidem.ErrNoMiddleware)):
				t.Errorf("%+v: %v; want an error", tc.q, r.err)
			case tc.wantErr == nil && !tc.other && (r.err != nil || r.n == 0):
				t.Errorf("%+v: %d bytes, %v; want the response", tc.q, r.n, r.err)
			}
		}
	})
}

// A handler that writes on after committing its response gets what it
// committed, as every retry will; a commit that meets another request's
// row (other parameters, after Redis lost the record) answers 422.
func TestLedgerCommittedResponseStands(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := newBank()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			body, _ := io.ReadAll(r.Body)
			_, _ = w.Write(body)
			rb, err := httpidem.Recorded(w)
			if err != nil {
				t.Error(err)
				return
			}
			if err := idem.Commit(r.Context(), &bankTx{b: bk}, rb); err == nil {
				_, _ = io.WriteString(w, " and more")
			}
		})
		srv := serve(t, httpidem.New(b.Idem(t, idem.WithLedger(bk)), httpidem.WithLogger(nil))(h))
		hc := httpClient(t)
		first := send(t, hc, srv.URL, req{key: "k", body: "one"})
		if first.status != http.StatusOK || first.body != "one" || first.replayed() {
			t.Fatalf("first: %d %q replayed %v; want 200 %q, what was committed", first.status, first.body, first.replayed(), "one")
		}
		sameResponse(t, "retry", send(t, hc, srv.URL, req{key: "k", body: "one"}), first)
		redisClient(t, b).FlushAll(context.Background())
		if a := send(t, hc, srv.URL, req{key: "k", body: "two"}); a.status != http.StatusUnprocessableEntity {
			t.Fatalf("other parameters after FLUSHALL: %d %s; want 422", a.status, a.body)
		}
	})
}
