package httpidem_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/httpidem"
)

// TestHostileRequests: FAULTS.md row 41 through the middleware, under its
// default limits. A body of 80,000 members and one nested 10,000 deep are
// fingerprinted at a cost near that of a flat body of the same size
// (measured in turns in this run; the bound leaves a margin of 10 or more
// on both sides: the quadratic canonical form took 3,000 and 500 times as
// long), in memory linear in their size, and the handler runs; one nested
// deeper gets 400, and a 1 MB key 400, before anything is claimed.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: hostile bodies take a few seconds under -race")
	}
	mr := miniredis.RunT(t)
	b := &backend{Name: "miniredis", Addr: mr.Addr(), MR: mr}
	var runs atomic.Int64
	h := httpidem.New(b.Idem(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	n := 0
	serve := func(body []byte, key string) *httptest.ResponseRecorder {
		n++
		r := httptest.NewRequest(http.MethodPost, "/debits", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(httpidem.HeaderIdempotencyKey, fmt.Sprintf("%s-%d", key, n))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var wide, deep bytes.Buffer
	wide.WriteByte('{')
	for i := range 80000 {
		if i > 0 {
			wide.WriteByte(',')
		}
		fmt.Fprintf(&wide, `"m%06d":1`, i)
	}
	wide.WriteByte('}')
	for range 10000 {
		fmt.Fprintf(&deep, `{"pad":"%s","a":`, strings.Repeat("x", 80))
	}
	deep.WriteString("0" + strings.Repeat("}", 10000))
	for name, body := range map[string][]byte{"members=80000": wide.Bytes(), "depth=10000": deep.Bytes()} {
		t.Run(name, func(t *testing.T) {
			flat := []byte(`{"pad":"` + strings.Repeat("x", len(body)-10) + `"}`)
			var hostile, plain time.Duration
			var mem runtime.MemStats
			runtime.ReadMemStats(&mem)
			before := mem.TotalAlloc
			for i := range 3 {
				t0 := time.Now()
				if w := serve(body, name); w.Code != http.StatusCreated {
					t.Fatalf("%d: %.200s", w.Code, w.Body)
				}
				hostile += time.Since(t0)
				if i == 0 {
					runtime.ReadMemStats(&mem)
					if got, max := mem.TotalAlloc-before, 64*uint64(len(body)); got > max {
						t.Errorf("a request of %d bytes allocated %d bytes, over %d", len(body), got, max)
					}
				}
				t0 = time.Now()
				if w := serve(flat, "flat"); w.Code != http.StatusCreated {
					t.Fatalf("flat: %d", w.Code)
				}
				plain += time.Since(t0)
			}
			ratio := float64(hostile) / float64(plain)
			t.Logf("%d bytes: %v a request, a flat body of the same size %v (×%.1f)", len(body), hostile/3, plain/3, ratio)
			if ratio > 200 {
				t.Errorf("a request took %.0f times as long as one with a flat body of the same size; want a linear cost", ratio)
			}
		})
	}
	tooDeep := strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001)
	if w := serve([]byte(tooDeep), "too-deep"); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "deeper than 10000") {
		t.Errorf("10001 levels: %d %.300s; want 400 giving the limit", w.Code, w.Body)
	}
	r := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{}`))
	r.Header.Set(httpidem.HeaderIdempotencyKey, strings.Repeat("k", 1<<20))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "longer than") {
		t.Errorf("1 MB key: %d %.300s; want 400", w.Code, w.Body)
	}
	if got, want := runs.Load(), int64(12); got != want {
		t.Errorf("the handler ran %d times, want %d", got, want)
	}
}
