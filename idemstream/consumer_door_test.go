package idemstream_test

// What idemstream shares with the other doors (package door): the key
// scheme and the default logger.

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// TestKeysShareHTTPScheme: with WithScope(""), an entry with key order-1
// and a POST through httpidem without a scope with Idempotency-Key
// order-1 name one record, door.Key("", "order-1"), as WithScope's doc
// says: the POST, of other parameters, is refused as a reuse of the key,
// and its handler does not run.
func TestKeysShareHTTPScheme(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr)
	ctx := context.Background()
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: []any{"event", "order-1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	c := idemstream.New(keys, rdb, "orders", "billing", "c1", quiet, idemstream.WithKey(eventKey), idemstream.WithScope(""))
	r := start(t, c, func(context.Context, redis.XMessage) error { handled.Add(1); return nil })
	eventually(t, 20*time.Second, "the entry handled", func() bool { return handled.Load() == 1 && pending(t, rdb, "orders", "billing") == 0 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, err := keys.Status(ctx, door.Key("", "order-1"))
	if err != nil || st.State != idem.StateDone {
		t.Fatalf("Status(door.Key(\"\", \"order-1\")) = %+v, %v; want the entry's record, done", st, err)
	}

	var ran atomic.Int32
	srv := httptest.NewServer(httpidem.New(keys)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", "order-1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity || ran.Load() != 0 {
		t.Fatalf("POST with the entry's key: %d, handler ran %d times; want 422 (one record, other parameters) and no run", resp.StatusCode, ran.Load())
	}
}

// TestDefaultLoggerIsReadAtLogTime: without WithLogger, the Consumer logs
// to slog.Default() as it is when it logs, as the Client, httpidem and
// grpcidem do (door.Logger), not as it was at New. Not parallel: it sets
// slog's default, which other tests' Consumers would log to.
func TestDefaultLoggerIsReadAtLogTime(t *testing.T) {
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	// A default of the program's own at New (Go's built-in one would pass
	// its records on to the next default through package log)...
	var before, l logs
	slog.SetDefault(slog.New(&before))
	c := idemstream.New(newIdem(t, addr), rdb, "s", "g", "c1", idemstream.WithKey(eventKey))
	// ... and another one after.
	slog.SetDefault(slog.New(&l))
	// An entry with no key is dead-lettered, and that is logged.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"other", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	r := start(t, c, func(context.Context, redis.XMessage) error { return nil })
	eventually(t, 20*time.Second, "the dead letter logged to the default logger set after New", func() bool {
		for _, m := range l.all() {
			if strings.Contains(m, "dead") {
				return true
			}
		}
		return false
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if m := before.all(); len(m) > 0 {
		t.Errorf("logged to the default logger of New's time: %q", m)
	}
}

// TestDefaultKeyIsTheEventID: without WithKey, an entry's key is its
// EventIDField, as the outbox relays write it: an event relayed twice (a
// relay killed between XADD and its delete) is handled once, while
// entries without the field are keyed by their IDs.
func TestDefaultKeyIsTheEventID(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr)
	ctx := context.Background()
	for _, values := range [][]any{
		{idemstream.EventIDField, "evt-1", "order", "o-1"},
		{idemstream.EventIDField, "evt-1", "order", "o-1"}, // relayed again
		{"order", "o-2"},
		{"order", "o-2"}, // no event id: another entry, another key
	} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var handled atomic.Int32
	c := idemstream.New(keys, rdb, "orders", "billing", "c1", quiet)
	r := start(t, c, func(context.Context, redis.XMessage) error { handled.Add(1); return nil })
	eventually(t, 20*time.Second, "every entry finished", func() bool {
		return handled.Load() >= 3 && pending(t, rdb, "orders", "billing") == 0
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := handled.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3: evt-1 once, each o-2 entry once", n)
	}
	st, err := keys.Status(ctx, door.Key("orders/billing/", "evt-1"))
	if err != nil || st.State != idem.StateDone {
		t.Errorf("Status of evt-1's key: %+v, %v; want done", st, err)
	}
}
