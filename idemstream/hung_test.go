package idemstream_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// hungHandler returns a handler that, for the events in hang, blocks until
// the test ends, ignoring its context (as a handler stuck in a call with
// no deadline does), and handles the others at once. It counts the runs,
// by event, and the hung ones still running; the test's end releases them
// and waits for them.
func hungHandler(t *testing.T, hang ...string) (idemstream.Handler, chan string) {
	started := make(chan string, 100)
	release := make(chan struct{})
	returned := make(chan struct{}, 100)
	var hung atomic.Int64
	t.Cleanup(func() {
		close(release)
		for range hung.Load() {
			<-returned
		}
		// The abandoned Do records its outcome after the handler returns.
		time.Sleep(200 * time.Millisecond)
	})
	h := func(ctx context.Context, m redis.XMessage) error {
		ev := eventKey(m)
		started <- ev
		for _, x := range hang {
			if x == ev {
				hung.Add(1)
				<-release
				returned <- struct{}{}
				return nil
			}
		}
		return nil
	}
	return h, started
}

// A handler that hangs and ignores its context: after WithHandlerTimeout
// (and a grace) the worker abandons it, the entry stays pending, and the
// worker goes on with the next entries.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr)
	produce(t, rdb, "s", []int{0, 1, 2})
	h, started := hungHandler(t, "ev-0")
	c := idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithHandlerTimeout(500*time.Millisecond), quiet)
	r := start(t, c, h)
	for _, want := range []string{"ev-0", "ev-1", "ev-2"} {
		select {
		case ev := <-started:
			if ev != want {
				t.Fatalf("handled %s, want %s", ev, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s not handled: the worker is stuck behind the hung handler", want)
		}
	}
	eventually(t, 10*time.Second, "ev-1 and ev-2 acknowledged", func() bool { return pending(t, rdb, "s", "g") == 1 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, rdb, "s", "g"); n != 1 {
		t.Fatalf("%d entries pending; want the abandoned one", n)
	}
}

// Run returns within its drain timeout whatever a handler does: the
// entry that a hung handler holds stays pending, for redelivery.
func TestRunReturnsAfterDrainTimeout(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	keys := newIdem(t, addr, idem.WithWait(0))
	produce(t, rdb, "s", []int{0})
	h, started := hungHandler(t, "ev-0")
	c := idemstream.New(keys, rdb, "s", "g", "c1", idemstream.WithKey(eventKey),
		idemstream.WithDrainTimeout(300*time.Millisecond), quiet)
	r := start(t, c, h)
	<-started
	r.cancel()
	if err := r.wait(t, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := pending(t, rdb, "s", "g"); n != 1 {
		t.Fatalf("%d entries pending after the drain; want the hung one", n)
	}
}
