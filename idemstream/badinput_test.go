package idemstream_test

// Bad input: entries without a key, with a key too long, with a corrupt
// record; a key that is not a stream; a group deleted while running; bad
// arguments and options.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// TestBadEntries: entries that can never be handled (no key, a key too
// long, a corrupt record, the key of another entry with other fields) are
// dead-lettered with a reason that says why, without running the handler,
// and acknowledged; the entries around them are handled.
func TestBadEntries(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	add := func(values ...any) string {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: values}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	good := add("event", "ev-0")
	noKey := add("amount", "10")
	long := add("event", strings.Repeat("x", 600))
	corrupt := add("event", "ev-corrupt")
	conflict := add("event", "ev-0", "amount", "10") // ev-0 again, with other fields
	last := add("event", "ev-1")
	if err := rdb.Set(ctx, "idem:{4:s/g/ev-corrupt}", "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var ran []string
	var hooked []idemstream.DeadLetter
	c := idemstream.New(newIdem(t, addr), rdb, "s", "g", "c1", idemstream.WithKey(eventKey), quiet,
		idemstream.WithOnDeadLetter(func(_ context.Context, d idemstream.DeadLetter) {
			mu.Lock()
			hooked = append(hooked, d)
			mu.Unlock()
		}))
	r := start(t, c, func(_ context.Context, m redis.XMessage) error {
		mu.Lock()
		ran = append(ran, m.ID)
		mu.Unlock()
		return nil
	})
	drained(t, rdb, "s", "g", last, time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 2 || ran[0] != good || ran[1] != last {
		t.Errorf("the handler ran for %v, want only %s and %s", ran, good, last)
	}
	want := []struct {
		id     string
		reason error
		text   string
	}{
		{noKey, idemstream.ErrNoKey, "the entry has no key"},
		{long, idem.ErrInvalidKey, "longer than the limit"},
		{corrupt, idem.ErrCorrupt, "corrupt record"},
		{conflict, idem.ErrConflict, "key reused with different parameters"},
	}
	dl := deadLetters(t, rdb, "s:dead")
	if len(dl) != len(want) || len(hooked) != len(want) {
		t.Fatalf("dead letters %v, hook calls %v; want %d", dl, hooked, len(want))
	}
	for i, w := range want {
		e, _ := dl[i].Values[idemstream.FieldError].(string)
		if dl[i].Values[idemstream.FieldID] != w.id || !strings.Contains(e, w.text) {
			t.Errorf("dead letter %d: %v; want entry %s with an error saying %q", i, dl[i].Values, w.id, w.text)
		}
		if !errors.Is(hooked[i].Err, w.reason) {
			t.Errorf("dead letter %d: hook's Err %v, want one matching %v", i, hooked[i].Err, w.reason)
		}
	}
	if n := pending(t, rdb, "s", "g"); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
}

// TestNotAStream: Run on a key of another type returns ErrNotStream at
// once; a stream replaced by another type while Run reads makes Run
// return it too.
func TestNotAStream(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	keys := newIdem(t, addr)
	h := func(context.Context, redis.XMessage) error { return nil }
	if err := rdb.Set(ctx, "str", "a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err := idemstream.New(keys, rdb, "str", "g", "c1", quiet).Run(ctx, h)
	if !errors.Is(err, idemstream.ErrNotStream) || !strings.Contains(err.Error(), `"str"`) {
		t.Errorf("Run on a string: %v, want ErrNotStream naming the key", err)
	}

	ids := produce(t, rdb, "s", []int{0})
	r := start(t, idemstream.New(keys, rdb, "s", "g", "c1", quiet), h)
	drained(t, rdb, "s", "g", ids[0], time.Minute)
	if err := rdb.Set(ctx, "s", "now a string", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.wait(t, 30*time.Second); !errors.Is(err, idemstream.ErrNotStream) && !errors.Is(err, idemstream.ErrNoGroup) {
		t.Errorf("Run after its stream became a string: %v, want ErrNotStream (or ErrNoGroup)", err)
	}
}

// TestGroupDeleted: a group deleted while Run reads makes Run return
// ErrNoGroup, not create it again; a new Run creates it, from the
// stream's first entry, and the entries handled before replay their
// outcomes without running the handler again.
func TestGroupDeleted(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	keys := newIdem(t, addr)
	a := newApplier(rdb, "app")
	ids := produce(t, rdb, "s", []int{0, 1, 2})
	r := start(t, idemstream.New(keys, rdb, "s", "g", "c1", quiet), a.apply)
	drained(t, rdb, "s", "g", ids[2], time.Minute)
	if err := rdb.XGroupDestroy(ctx, "s", "g").Err(); err != nil {
		t.Fatal(err)
	}
	err := r.wait(t, 30*time.Second)
	if !errors.Is(err, idemstream.ErrNoGroup) || !strings.Contains(err.Error(), `group "g" of stream "s"`) {
		t.Fatalf("Run after its group was deleted: %v, want ErrNoGroup naming them", err)
	}
	if n, err := rdb.Exists(ctx, "s").Result(); err != nil || n != 1 {
		t.Fatalf("the stream: exists %d, %v", n, err)
	}
	groups, err := rdb.XInfoGroups(ctx, "s").Result()
	if err != nil || len(groups) != 0 {
		t.Fatalf("groups after Run returned: %v, %v; want none (not created again)", groups, err)
	}

	ids = append(ids, produce(t, rdb, "s", []int{3})...)
	r = start(t, idemstream.New(keys, rdb, "s", "g", "c1", quiet), a.apply)
	drained(t, rdb, "s", "g", ids[3], time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for ev, n := range a.counts(t) {
		if n != 1 {
			t.Errorf("%s applied %d times, want 1", ev, n)
		}
	}
	if n := len(a.counts(t)); n != 4 {
		t.Errorf("%d events applied, want 4", n)
	}
}

// TestBadArguments: a nil handler makes Run return an error naming it;
// Run while running is refused; invalid options panic in New, naming the
// option (nil clients and empty names: TestNewRefusesNilClients).
func TestBadArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := func(context.Context, redis.XMessage) error { return nil }
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr)
	if err := idemstream.New(keys, rdb, "s", "g", "c1", quiet).Run(ctx, nil); err == nil || !strings.Contains(err.Error(), "nil Handler") {
		t.Errorf("Run(nil): %v, want an error saying nil Handler", err)
	}

	c := idemstream.New(keys, rdb, "s", "g", "c1", quiet)
	r := start(t, c, h)
	eventually(t, 10*time.Second, "the first Run to create the group", func() bool {
		g, err := rdb.XInfoGroups(ctx, "s").Result()
		return err == nil && len(g) == 1
	})
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Run(tctx, h); err == nil || !strings.Contains(err.Error(), "running") {
		t.Errorf("a second Run: %v, want it refused", err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}

	for name, opt := range map[string]idemstream.Option{
		"WithWorkers(0)":        idemstream.WithWorkers(0),
		"WithMaxDeliveries(0)":  idemstream.WithMaxDeliveries(0),
		"WithBatch(0)":          idemstream.WithBatch(0),
		"WithBlock(0s)":         idemstream.WithBlock(0),
		"WithClaimIdle(1ms)":    idemstream.WithClaimIdle(time.Millisecond),
		"WithBackoff(2s, 1s)":   idemstream.WithBackoff(2*time.Second, time.Second),
		"WithDrainTimeout(-1s)": idemstream.WithDrainTimeout(-time.Second),
		"WithDeadLetter(\"\")":  idemstream.WithDeadLetter(""),
		"WithKey(nil)":          idemstream.WithKey(nil),
		"WithFingerprint(nil)":  idemstream.WithFingerprint(nil),
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(p.(string), name) {
					t.Errorf("New with %s: panic %v, want one naming the option", name, p)
				}
			}()
			idemstream.New(keys, rdb, "s", "g", "c", opt)
		}()
	}
}

// TestNewRefusesNilClients: nil clients and empty names panic in New,
// naming each, as httpidem.New and grpcidem.UnaryServerInterceptor panic
// on a nil Client: at construction, in every door, not at the first Run.
func TestNewRefusesNilClients(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	keys := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}), idem.WithLogger(nil))
	t.Cleanup(func() { _ = keys.Close() })
	rdb := newClient(t, mr.Addr())
	for _, tc := range []struct {
		name string
		new  func()
		want []string
	}{
		{"nothing", func() { idemstream.New(nil, nil, "", "", "") },
			[]string{"nil *idem.Client", "nil Redis client", "empty stream name", "empty group name", "empty consumer name"}},
		{"nil idem.Client", func() { idemstream.New(nil, rdb, "s", "g", "c") }, []string{"nil *idem.Client"}},
		{"nil Redis client", func() { idemstream.New(keys, nil, "s", "g", "c") }, []string{"nil Redis client"}},
		{"empty consumer", func() { idemstream.New(keys, rdb, "s", "g", "") }, []string{"empty consumer name"}},
	} {
		func() {
			defer func() {
				p := recover()
				s, _ := p.(string)
				if p == nil || !strings.HasPrefix(s, "idemstream: ") {
					t.Errorf("%s: New panicked with %v, want a panic with the package prefix", tc.name, p)
				}
				for _, w := range tc.want {
					if !strings.Contains(s, w) {
						t.Errorf("%s: panic %q does not say %q", tc.name, s, w)
					}
				}
			}()
			tc.new()
		}()
	}
}

// TestScopeFitsTheClientsKeyLimit: a scope that leaves no room for a key
// within the Client's WithMaxKeyLen panics in New, as httpidem and
// grpcidem fit their limits to the Client's (door.FitKeyLen), instead of
// dead-lettering every entry as an invalid key.
func TestScopeFitsTheClientsKeyLimit(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	keys := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}), idem.WithLogger(nil), idem.WithMaxKeyLen(16))
	t.Cleanup(func() { _ = keys.Close() })
	rdb := newClient(t, mr.Addr())
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "WithMaxKeyLen(16)") {
				t.Errorf("New with a 15-byte scope and a 16-byte key limit: panic %v, want one naming the Client's limit", p)
			}
		}()
		idemstream.New(keys, rdb, "orders", "billing", "c1", quiet) // scope "orders/billing/"
	}()
	// A scope that leaves room is fine.
	idemstream.New(keys, rdb, "orders", "billing", "c1", quiet, idemstream.WithScope("o/"))
}

// A dead-lettered conflict is logged with its key's digest, never the key
// (keys may be personal data), as the Client logs keys.
func TestDeadLetterLogNamesTheKeyByDigest(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	ctx := context.Background()
	for _, values := range [][]any{{"event", "secret-order-77"}, {"event", "secret-order-77", "amount", "10"}} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	last, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"event", "ev-1"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var l logs
	c := idemstream.New(newIdem(t, addr), rdb, "s", "g", "c1", idemstream.WithKey(eventKey), idemstream.WithLogger(slog.New(&l)))
	r := start(t, c, func(context.Context, redis.XMessage) error { return nil })
	drained(t, rdb, "s", "g", last, time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	found := false
	for _, m := range l.all() {
		if strings.Contains(m, "secret-order-77") {
			t.Errorf("a log names the key: %s", m)
		}
		if strings.Contains(m, "entry dead-lettered") && strings.Contains(m, "key_digest=") && strings.Contains(m, "reused with different parameters") {
			found = true
		}
	}
	if !found {
		t.Errorf("no dead-letter log with the key's digest and the conflict: %q", l.all())
	}
}
