package httpidem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

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
