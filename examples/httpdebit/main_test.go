package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The server, its connections, the idem.Client and the Redis
	// connections must all be gone when run returns.
	goleak.VerifyTestMain(m)
}

// start runs the service as main does, on a free port, until the test
// ends, and returns its base URL.
func start(t *testing.T, cfg config) string {
	t.Helper()
	cfg.addr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	var stderr strings.Builder
	go func() { done <- run(ctx, cfg, io.Discard, &syncWriter{w: &stderr}, func(a string) { addr <- a }) }()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return base
}

// client returns an HTTP client whose idle connections are closed when the
// test ends.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type reply struct {
	status   int
	replayed bool
	body     string
}

func post(t *testing.T, c *http.Client, base, user, key, body string) reply {
	t.Helper()
	r, err := tryPost(c, base, user, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryPost(c *http.Client, base, user, key, body string) (reply, error) {
	r, err := http.NewRequest(http.MethodPost, base+"/debits", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	r.Header.Set("Content-Type", "application/json")
	if user != "" {
		r.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "" {
		r.Header.Set(httpidem.HeaderIdempotencyKey, key)
	}
	resp, err := c.Do(r)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{resp.StatusCode, resp.Header.Get(httpidem.HeaderReplayed) == "true", string(b)}, nil
}

type account struct {
	Balance int64   `json:"balance"`
	Debits  []debit `json:"debits"`
}

func getAccount(t *testing.T, c *http.Client, base, id string) account {
	t.Helper()
	resp, err := c.Get(base + "/accounts/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a account
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

// The README's curl session: a debit, its retry, a conflicting retry; the
// account is debited once.
func TestSession(t *testing.T) {
	each(t, func(t *testing.T, cfg config) {
		base := start(t, cfg)
		c := client(t)
		first := post(t, c, base, "alice", "debit-1", `{"account":"A","amount":2500}`)
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("first: %+v", first)
		}
		want := `{"id":"d-1","account":"A","amount":2500,"balance":97500,"attempt":1}` + "\n"
		if first.body != want {
			t.Errorf("first body %q, want %q", first.body, want)
		}
		retry := post(t, c, base, "alice", "debit-1", `{"amount": 2500, "account": "A"}`)
		if retry.status != http.StatusCreated || !retry.replayed || retry.body != first.body {
			t.Errorf("retry: %+v, want the first answer replayed", retry)
		}
		conflict := post(t, c, base, "alice", "debit-1", `{"account":"A","amount":9900}`)
		if conflict.status != http.StatusUnprocessableEntity || !strings.Contains(conflict.body, httpidem.ProblemKeyReused) {
			t.Errorf("conflicting retry: %+v, want 422 %s", conflict, httpidem.ProblemKeyReused)
		}
		if a := getAccount(t, c, base, "A"); a.Balance != 97500 || len(a.Debits) != 1 {
			t.Errorf("account A: %+v, want one debit and 97500 left", a)
		}
	})
}

// Concurrent duplicates, while the bank is slow: one debit.
func TestDuplicatesWhileSlow(t *testing.T) {
	each(t, func(t *testing.T, cfg config) {
		cfg.delay = 100 * time.Millisecond
		base := start(t, cfg)
		var wg sync.WaitGroup
		replies := make([]reply, 10)
		errs := make([]error, len(replies))
		for i := range replies {
			c := client(t) // a connection of its own
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i], errs[i] = tryPost(c, base, "alice", "slow-1", `{"account":"B","amount":100}`)
			}()
		}
		wg.Wait()
		replayed := 0
		for i, r := range replies {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if r.status != http.StatusCreated || r.body != replies[0].body {
				t.Errorf("reply %+v, want 201 %s", r, replies[0].body)
			}
			if r.replayed {
				replayed++
			}
		}
		if replayed != len(replies)-1 {
			t.Errorf("%d replayed, want %d", replayed, len(replies)-1)
		}
		if a := getAccount(t, client(t), base, "B"); len(a.Debits) != 1 {
			t.Errorf("account B: %d debits, want 1", len(a.Debits))
		}
	})
}

// A refusal (402) is an answer too: replayed, not retried.
func TestRefusalReplayed(t *testing.T) {
	each(t, func(t *testing.T, cfg config) {
		base := start(t, cfg)
		c := client(t)
		r1 := post(t, c, base, "alice", "big-1", `{"account":"C","amount":100001}`)
		r2 := post(t, c, base, "alice", "big-1", `{"account":"C","amount":100001}`)
		if r1.status != http.StatusPaymentRequired || r1.replayed || !r2.replayed || r2.body != r1.body {
			t.Errorf("refusal %+v, retry %+v; want 402 replayed", r1, r2)
		}
	})
}

// Keys are scoped by the caller; requests without a caller or a key are
// refused.
func TestScopesAndRefusals(t *testing.T) {
	each(t, func(t *testing.T, cfg config) {
		base := start(t, cfg)
		c := client(t)
		a := post(t, c, base, "alice", "k", `{"account":"D","amount":1}`)
		b := post(t, c, base, "bob", "k", `{"account":"D","amount":1}`)
		if b.status != http.StatusCreated || b.replayed || b.body == a.body {
			t.Errorf("bob with alice's key: %+v; want his own debit", b)
		}
		if acct := getAccount(t, c, base, "D"); len(acct.Debits) != 2 {
			t.Errorf("account D: %d debits, want 2", len(acct.Debits))
		}
		if r := post(t, c, base, "", "k2", `{"account":"D","amount":1}`); r.status != http.StatusUnauthorized {
			t.Errorf("no caller: %+v, want 401", r)
		}
		if r := post(t, c, base, "alice", "", `{"account":"D","amount":1}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, httpidem.ProblemKeyMissing) {
			t.Errorf("no key: %+v, want 400 %s", r, httpidem.ProblemKeyMissing)
		}
		if r := post(t, c, base, "alice", "k3", `{"account":"D","amount":-5}`); r.status != http.StatusBadRequest {
			t.Errorf("negative amount: %+v, want 400", r)
		}
	})
}

// each runs f on the embedded miniredis and on a real redis-server (-redis).
func each(t *testing.T, f func(t *testing.T, cfg config)) {
	t.Run("miniredis", func(t *testing.T) { f(t, config{}) })
	t.Run("redis", func(t *testing.T) {
		f(t, config{redis: redistest.Start(t, redistest.Config{}).Addr()})
	})
}

// syncWriter serialises writes from the server's goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Redis loses the key's record: FLUSHALL on a real server, or the service
// restarted on a new embedded miniredis with the same database. The retry
// runs the handler, whose commit meets the ledger's row: it gets the
// committed response, replayed, and the account is debited once; so do 10
// concurrent duplicates after another loss.
func TestRetryAfterRedisLostTheRecord(t *testing.T) {
	check := func(t *testing.T, c *http.Client, base string, first reply) {
		t.Helper()
		retry := post(t, c, base, "alice", "lost-1", `{"account":"L","amount":700}`)
		if retry.status != http.StatusCreated || !retry.replayed || retry.body != first.body {
			t.Errorf("retry after the loss: %+v; want the committed %s, replayed", retry, first.body)
		}
		if a := getAccount(t, c, base, "L"); a.Balance != openingBalance-700 || len(a.Debits) != 1 {
			t.Errorf("account L: %+v; want one debit", a)
		}
	}
	t.Run("redis FLUSHALL", func(t *testing.T) {
		srv := redistest.Start(t, redistest.Config{})
		base := start(t, config{redis: srv.Addr()})
		c := client(t)
		first := post(t, c, base, "alice", "lost-1", `{"account":"L","amount":700}`)
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("first: %+v", first)
		}
		flush := func() {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer rdb.Close()
			if err := rdb.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		flush()
		check(t, c, base, first)
		flush()
		var wg sync.WaitGroup
		replies := make([]reply, 10)
		for i := range replies {
			c := client(t)
			wg.Go(func() { replies[i] = post(t, c, base, "alice", "lost-1", `{"account":"L","amount":700}`) })
		}
		wg.Wait()
		for i, r := range replies {
			if r.status != http.StatusCreated || !r.replayed || r.body != first.body {
				t.Errorf("duplicate %d after the loss: %+v; want the committed %s, replayed", i, r, first.body)
			}
		}
		check(t, c, base, first)
	})
	t.Run("restart on miniredis", func(t *testing.T) {
		cfg := config{db: filepath.Join(t.TempDir(), "bank.db")}
		c := client(t)
		var first reply
		t.Run("before", func(t *testing.T) {
			first = post(t, c, start(t, cfg), "alice", "lost-1", `{"account":"L","amount":700}`)
			if first.status != http.StatusCreated || first.replayed {
				t.Fatalf("first: %+v", first)
			}
		}) // the service stops: its miniredis is gone
		c.CloseIdleConnections()
		check(t, c, start(t, cfg), first)
	})
}
