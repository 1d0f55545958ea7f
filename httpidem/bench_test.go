package httpidem_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var benchRuns atomic.Int64 // makes the keys of every benchmark run unique

// BenchmarkMiddleware measures what the middleware adds to a request, over
// a real TCP connection with Go's http.Client: a request with a new key
// (claim, handler, store: two Redis round trips) and a replayed one (one
// round trip, no handler), each run in turns with the same request to the
// bare handler, so that load on a shared machine weighs on both alike. It
// reports bare-ns/op and idem-ns/op (the time of one request of each),
// bare/idem (the share of the bare handler's throughput that the
// middleware keeps: 1 = no cost) and overhead-us/op (idem less bare). The
// Redis is a redis-server started for the benchmark when one is
// installed, else miniredis in this process. It never asserts a timing.
func BenchmarkMiddleware(b *testing.B) {
	addr := benchRedisAddr(b)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { _ = rdb.Close() })
	keys := idem.New(rdb)
	b.Cleanup(func() { _ = keys.Close() })

	resp := bytes.Repeat([]byte("x"), 100)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(resp)
	})
	mux := http.NewServeMux()
	mux.Handle("/bare", handler)
	mux.Handle("/idem", httpidem.New(keys)(handler))
	srv := httptest.NewServer(mux)
	b.Cleanup(srv.Close)
	tr := &http.Transport{}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	body := []byte(`{"account":"A","amount":100}`)
	call := func(b *testing.B, path, key string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpidem.HeaderIdempotencyKey, key)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated || n != int64(len(resp)) {
			b.Fatalf("%s: %d with %d bytes", path, res.StatusCode, n)
		}
	}
	inTurns := func(b *testing.B, key func() string) {
		var bare, mw time.Duration
		timed := func(f func(), total *time.Duration) {
			t0 := time.Now()
			f()
			*total += time.Since(t0)
		}
		i := 0
		for b.Loop() {
			k := key()
			sides := [2]func(){
				func() { timed(func() { call(b, "/bare", k) }, &bare) },
				func() { timed(func() { call(b, "/idem", k) }, &mw) },
			}
			sides[i%2]()
			sides[1-i%2]()
			i++
		}
		n := float64(b.N)
		b.ReportMetric(float64(bare.Nanoseconds())/n, "bare-ns/op")
		b.ReportMetric(float64(mw.Nanoseconds())/n, "idem-ns/op")
		b.ReportMetric(float64(bare)/float64(mw), "bare/idem")
		b.ReportMetric(float64(mw-bare)/n/1e3, "overhead-us/op")
	}

	run := benchRuns.Add(1)
	b.Run("NewKey", func(b *testing.B) {
		i := 0
		inTurns(b, func() string {
			i++
			return fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), run, i)
		})
	})
	b.Run("Replay", func(b *testing.B) {
		key := fmt.Sprintf("bench-replay-%d-%d", os.Getpid(), run)
		call(b, "/idem", key) // stored once
		inTurns(b, func() string { return key })
	})
}

// benchRedisAddr returns the address of a redis-server started for the
// benchmark (stopped at its end) when one is installed or
// IDEM_REQUIRE_REDIS=1, else of a miniredis.
func benchRedisAddr(b *testing.B) string {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv(redistest.RequireEnv) == "1" {
		return redistest.Start(b, redistest.Config{}).Addr()
	}
	b.Logf("redis-server not found: the benchmark runs on miniredis")
	return miniredis.RunT(b).Addr()
}

// BenchmarkHostileBodies measures the middleware on the request bodies of
// FAULTS.md row 41, each sent with a new key: an object of 80,000 members
// (880 KB) and objects nested 10,000 deep (970 KB), under the default 1 MiB
// body limit, on miniredis. One op is one request: run with
// -benchtime=1x -benchmem.
func BenchmarkHostileBodies(b *testing.B) {
	mr := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	b.Cleanup(func() { _ = rdb.Close() })
	keys := idem.New(rdb)
	b.Cleanup(func() { _ = keys.Close() })
	h := httpidem.New(keys)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	var wide, deep bytes.Buffer
	wide.WriteByte('{')
	for i := range 80000 {
		if i > 0 {
			wide.WriteByte(',')
		}
		fmt.Fprintf(&wide, `"m%06d":1`, i)
	}
	wide.WriteByte('}')
	pad := bytes.Repeat([]byte("x"), 80)
	for range 10000 {
		fmt.Fprintf(&deep, `{"pad":"%s","a":`, pad)
	}
	deep.WriteString("0" + string(bytes.Repeat([]byte("}"), 10000)))
	for _, tc := range []struct {
		name string
		body []byte
	}{{"members=80000", wide.Bytes()}, {"depth=10000", deep.Bytes()}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(httpidem.HeaderIdempotencyKey, fmt.Sprintf("hostile-%s-%d", tc.name, i))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusCreated {
					b.Fatalf("%d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
