package httpidem_test

import (
	"context"
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

// A step that charges through a provider: the transport stamps the step's
// key on the request, the same on every attempt of the operation.
func ExampleNewTransport() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("provider: Idempotency-Key", r.Header.Get("Idempotency-Key"))
		_, _ = io.WriteString(w, "ch-1")
	}))
	defer provider.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: httpidem.NewTransport(base)}

	charge, err := idem.Do(context.Background(), keys, "debit-42", "", func(ctx context.Context) (string, error) {
		return idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL, strings.NewReader("amount=100"))
			if err != nil {
				return "", err
			}
			resp, err := client.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		})
	})
	fmt.Println(charge, err)
	// Output:
	// provider: Idempotency-Key "idem-52kp4vvwdpojhho5wa2gv2h3zdbr4pdl"
	// ch-1 <nil>
}
