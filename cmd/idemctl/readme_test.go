package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/readmetest"
	"github.com/idem-go/idem/internal/redistest"
)

// TestReadme runs every command of README.md against a redis-server that
// holds the records it shows, with the idemctl built from this tree first
// on PATH, and checks what each prints.
func TestReadme(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{AppendOnly: true})
	rdb := srv.Client(t)
	c := idem.New(rdb, idem.WithLogger(nil))
	defer c.Close()
	ctx := context.Background()
	for i := range 40 {
		if _, err := c.Do(ctx, "order-"+strconv.Itoa(i+1), "fp", func(context.Context) ([]byte, error) {
			return []byte(strings.Repeat("r", 100)), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// An owner that died holding attempt 3.
	rdb.Set(ctx, "idem:{order-stuck}", rec('p', "fingerprint-----", "owner-token-----", 3, strconv.Itoa(int(time.Hour.Milliseconds()))), time.Hour)
	// An HTTP request of principal alice.
	h := httpidem.New(c, httpidem.WithScope(func(*http.Request) (string, error) { return "alice", nil }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	req := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{"amount":1}`))
	req.Header.Set(httpidem.HeaderIdempotencyKey, "k-1")
	h.ServeHTTP(httptest.NewRecorder(), req)

	bin := filepath.Dir(binary(t))
	readmetest.Run(t, "README.md", readmetest.Options{
		Dir:     t.TempDir(),
		Env:     []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")},
		Replace: []string{"localhost:6379", srv.Addr()},
	})
}
