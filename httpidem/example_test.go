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
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/redis/go-redis/v9"
)

// A debit endpoint behind the middleware: the client's retry gets the
// first response again, a reordered JSON body is the same request, and the
// key reused for another amount is refused.
func Example() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	debit := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Account string
			Amount  int64
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a, _ := idem.AttemptFrom(r.Context())
		fmt.Printf("debiting %d from %s (attempt %d)\n", req.Amount, req.Account, a.Number)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"debit":"d-1","amount":%d}`, req.Amount)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /debits", httpidem.New(keys)(debit))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/debits", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpidem.HeaderIdempotencyKey, key)
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get(httpidem.HeaderReplayed), string(b))
	}
	post("debit-42", `{"account":"A","amount":100}`)
	post("debit-42", `{ "amount": 100, "account": "A" }`) // the retry
	post("debit-42", `{"account":"A","amount":999}`)      // another debit, same key
	// Output:
	// debiting 100 from A (attempt 1)
	// 201  {"debit":"d-1","amount":100}
	// 201 true {"debit":"d-1","amount":100}
	// 422  {"type":"https://pkg.go.dev/github.com/idem-go/idem/httpidem#ProblemKeyReused","title":"Idempotency key reused with another request","status":422,"detail":"this Idempotency-Key was used before with another request"}
}

// A duplicate that arrives while the first request runs waits for its
// response for as long as the Client's idem.WithWait allows (10 seconds by
// default), then gets 409 with Retry-After: here a Client of its own
// waits 100ms.
func Example_inProgress() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithWait(100*time.Millisecond))
	defer keys.Close()

	started, finish := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-finish
		w.WriteHeader(http.StatusCreated)
	})
	h := httpidem.New(keys)(slow)
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{}`))
		req.Header.Set(httpidem.HeaderIdempotencyKey, "debit-7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- post() }()
	<-started
	dup := post() // the first is still running: it waits 100ms, then gives up
	fmt.Println(dup.Code, dup.Header().Get("Retry-After"))
	close(finish)
	fmt.Println((<-first).Code)
	again := post() // the retry after the first finished: its response
	fmt.Println(again.Code, again.Header().Get(httpidem.HeaderReplayed))
	// Output:
	// 409 1
	// 201
	// 201 true
}

// A scope function names the principal a request acts for; without
// credentials it returns Unauthenticated, and the answer is 401 with the
// challenge. idemctl -scope finds a principal's record, under the key
// ScopedKey gives.
func ExampleUnauthenticated() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	caller := func(r *http.Request) (string, error) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			return "", httpidem.Unauthenticated(`Bearer realm="debits"`, errors.New("a bearer token is required"))
		}
		return user, nil // in production: the principal the token stands for
	}
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	h := httpidem.New(keys, httpidem.WithScope(caller))(created)
	post := func(auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{}`))
		req.Header.Set(httpidem.HeaderIdempotencyKey, "k-1")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	w := post("")
	fmt.Println(w.Code, w.Header().Get("WWW-Authenticate"))
	w = post("Bearer alice")
	fmt.Println(w.Code)
	st, _ := keys.Status(context.Background(), httpidem.ScopedKey("alice", "k-1"))
	fmt.Println(httpidem.ScopedKey("alice", "k-1"), st.State)
	// Output:
	// 401 Bearer realm="debits"
	// 201
	// 5:alicek-1 done
}
