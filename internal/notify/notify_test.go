package notify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/notify"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// wait is how long a test waits for a signal that must come: long, as the
// machine may be busy; a signal that must not come is checked for over
// quiet.
const (
	wait  = 10 * time.Second
	quiet = 200 * time.Millisecond
)

// eachServer runs f against miniredis and against a real redis-server.
func eachServer(t *testing.T, f func(t *testing.T, rdb *redis.Client, publish func(ch, msg string))) {
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		f(t, b.Client(t), func(ch, msg string) { b.Do(t, "PUBLISH", ch, msg) })
	})
}

// signalled fails the test unless w is signalled within wait.
func signalled(t *testing.T, w *notify.Watcher, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(wait):
		t.Fatalf("no signal within %v: %s", wait, what)
	}
}

// notSignalled fails the test if w is signalled within quiet.
func notSignalled(t *testing.T, w *notify.Watcher, what string) {
	t.Helper()
	select {
	case <-w.C():
		t.Fatalf("signalled: %s", what)
	case <-time.After(quiet):
	}
}

func TestWatchSignalsConfirmationAndMessages(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		defer h.Close()
		w := h.Watch("ch")
		defer w.Stop()
		signalled(t, w, "the subscription's confirmation")
		if msg, ok := w.Note(); ok {
			t.Fatalf("a confirmation left the note %q", msg)
		}

		publish("ch", "outcome")
		signalled(t, w, "a message")
		if msg, ok := w.Note(); !ok || msg != "outcome" {
			t.Fatalf("Note() = %q, %v; want %q, true", msg, ok, "outcome")
		}
		if msg, ok := w.Note(); ok {
			t.Fatalf("a second Note() = %q, true; want the note forgotten", msg)
		}

		// A one-byte message signals and leaves no note.
		publish("ch", "1")
		signalled(t, w, "a one-byte message")
		if msg, ok := w.Note(); ok {
			t.Fatalf("a one-byte message left the note %q", msg)
		}

		// Another channel's message is not this watcher's.
		publish("other", "not yours")
		notSignalled(t, w, "by another channel's message")
	})
}

func TestWatchersShareOneSubscription(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		defer h.Close()
		a := h.Watch("ch")
		signalled(t, a, "a's confirmation")
		// The channel is confirmed already: b is told at once that it may
		// look again.
		b := h.Watch("ch")
		signalled(t, b, "b joining a confirmed channel")
		if n := h.Subscribed(); n != 1 {
			t.Fatalf("Subscribed() = %d with two watchers of one channel, want 1", n)
		}
		if n := numSub(t, rdb, "ch"); n != 1 {
			t.Fatalf("the server counts %d subscribers of the channel, want 1 (one connection)", n)
		}
		publish("ch", "outcome")
		for name, w := range map[string]*notify.Watcher{"a": a, "b": b} {
			signalled(t, w, name+"'s message")
			if msg, ok := w.Note(); !ok || msg != "outcome" {
				t.Fatalf("%s: Note() = %q, %v; want %q, true", name, msg, ok, "outcome")
			}
		}

		// The channel stays while a watcher is left; the last one's Stop
		// unsubscribes it, in the background.
		a.Stop()
		a.Stop() // a second Stop changes nothing
		publish("ch", "again")
		signalled(t, b, "b, after a stopped")
		b.Stop()
		deadline := time.Now().Add(wait)
		for h.Subscribed() != 0 || numSub(t, rdb, "ch") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("after the last Stop: Subscribed() = %d, the server counts %d subscribers", h.Subscribed(), numSub(t, rdb, "ch"))
			}
			time.Sleep(5 * time.Millisecond)
		}

		// A watcher that comes back subscribes the channel anew.
		c := h.Watch("ch")
		defer c.Stop()
		signalled(t, c, "a new watcher's confirmation")
		publish("ch", "back")
		signalled(t, c, "a message after resubscribing")
	})
}

// numSub returns the number of subscribers of ch that the server counts.
func numSub(t *testing.T, rdb *redis.Client, ch string) int64 {
	t.Helper()
	m, err := rdb.PubSubNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return m[ch]
}

func TestManyChannelsUnsubscribeTogether(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		defer h.Close()
		var ws []*notify.Watcher
		for i := range 50 {
			w := h.Watch(fmt.Sprintf("ch%d", i))
			signalled(t, w, "a confirmation")
			ws = append(ws, w)
		}
		if n := h.Subscribed(); n != 50 {
			t.Fatalf("Subscribed() = %d, want 50", n)
		}
		for _, w := range ws {
			w.Stop()
		}
		deadline := time.Now().Add(wait)
		for h.Subscribed() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("Subscribed() = %d after every Stop", h.Subscribed())
			}
			time.Sleep(5 * time.Millisecond)
		}
		for i := range 50 {
			if n := numSub(t, rdb, fmt.Sprintf("ch%d", i)); n != 0 {
				t.Fatalf("ch%d: the server still counts %d subscribers", i, n)
			}
		}
	})
}

func TestCloseEndsTheHub(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		w := h.Watch("ch")
		signalled(t, w, "the confirmation")
		select {
		case <-h.Done():
			t.Fatal("Done is closed before Close")
		default:
		}
		if err := h.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case <-h.Done():
		default:
			t.Fatal("Done is open after Close")
		}
		if err := h.Close(); err != nil {
			t.Fatalf("a second Close: %v", err)
		}
		publish("ch", "late")
		notSignalled(t, w, "after Close")
		w.Stop()
		// A watcher made after Close is never signalled.
		late := h.Watch("ch2")
		publish("ch2", "late")
		notSignalled(t, late, "a watcher made after Close")
		late.Stop()
	})
}

func TestDisable(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		defer h.Close()
		h.Disable()
		w := h.Watch("ch")
		defer w.Stop()
		publish("ch", "outcome")
		notSignalled(t, w, "with the Hub disabled")
		if n := h.Subscribed(); n != 0 {
			t.Fatalf("Subscribed() = %d with the Hub disabled", n)
		}
		if n := numSub(t, rdb, "ch"); n != 0 {
			t.Fatalf("the server counts %d subscribers with the Hub disabled", n)
		}
	})
}

// BeforeSubscribe runs in the gap between a waiter's look and its
// subscription: a message published there is lost, and the confirmation
// that follows is what tells the waiter to look again.
func TestBeforeSubscribe(t *testing.T) {
	eachServer(t, func(t *testing.T, rdb *redis.Client, publish func(ch, msg string)) {
		h := notify.New(rdb)
		defer h.Close()
		var got []string
		h.BeforeSubscribe(func(ch string) {
			got = append(got, ch)
			publish(ch, "in the gap")
		})
		w := h.Watch("ch")
		defer w.Stop()
		if len(got) != 1 || got[0] != "ch" {
			t.Fatalf("BeforeSubscribe saw %q, want [ch]", got)
		}
		signalled(t, w, "the confirmation after the gap")
		if msg, ok := w.Note(); ok {
			t.Fatalf("the message published before the subscription arrived: %q", msg)
		}
	})
}

// When the server closes the subscriber connection, go-redis reconnects
// and subscribes again; the new confirmation signals the watchers, whose
// messages then arrive as before.
func TestReconnectSignalsAgain(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	h := notify.New(rdb)
	defer h.Close()
	w := h.Watch("ch")
	defer w.Stop()
	signalled(t, w, "the confirmation")
	if n := srv.KillPubSub(t); n != 1 {
		t.Fatalf("killed %d pub/sub connections, want 1", n)
	}
	signalled(t, w, "the confirmation after the reconnection")
	deadline := time.Now().Add(wait)
	for numSub(t, rdb, "ch") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the channel was not subscribed again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.Do(t, "PUBLISH", "ch", "after")
	signalled(t, w, "a message after the reconnection")
	if msg, ok := w.Note(); !ok || msg != "after" {
		t.Fatalf("Note() = %q, %v; want %q, true", msg, ok, "after")
	}
}
