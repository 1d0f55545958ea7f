// Package notify wakes the goroutines that wait on Redis pub/sub channels.
//
// A Hub holds a few subscriber connections, shared by all its waiters: one
// for a single Redis or Sentinel, one per master on a Redis Cluster (with
// sharded pub/sub, SSUBSCRIBE, which lives on the shard). A channel is
// subscribed when its first Watcher comes and unsubscribed, in the
// background, when its last one stops. A Watcher is signalled when the
// server confirms its subscription (from then on no message is missed, so
// the waiter should look again at what it waits for) and whenever a message
// arrives; it keeps the last message.
//
// Pub/sub is at most once: messages published while a connection is down
// are lost. go-redis reconnects and subscribes again (on a cluster, where it
// cannot, the Hub does), and each new confirmation signals the channel's
// watchers: a waiter that looks again after every signal, and polls as
// well, misses nothing.
package notify

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Hub holds the subscriber connections of one go-redis client and the
// channels its watchers wait on. It is safe for concurrent use.
type Hub struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient
	done    chan struct{} // closed by Close

	mu       sync.Mutex
	closed   bool                     // guarded by mu
	disabled bool                     // guarded by mu; no subscriptions (Disable)
	groups   map[string]*redis.PubSub // guarded by mu; by master address ("" outside a cluster)
	chans    map[string]*channelState // guarded by mu; by channel
	// leaving holds channels whose last waiter left, for unsubscribe to
	// unsubscribe them (if no waiter came back meanwhile); unsubscribing
	// says it runs.
	leaving       []string // guarded by mu
	unsubscribing bool     // guarded by mu

	wg sync.WaitGroup // the groups' reader (and, in a cluster, pinger) goroutines, and unsubscribe

	// io orders the subscriber connections' writes. It is taken while h.mu
	// is held, then h.mu is released, so writes go out in the order the
	// maps changed without blocking notifications.
	io sync.Mutex

	beforeSubscribe func(channel string) // see BeforeSubscribe
}

type channelState struct {
	waiters   map[*Watcher]struct{}
	confirmed bool // the server confirmed the subscription: no message can be missed from now on
	group     *redis.PubSub
}

// A Watcher is one waiter's interest in one channel.
type Watcher struct {
	h   *Hub
	ch  string
	sig chan struct{}
	// note is the last message that came for the channel.
	note atomic.Pointer[string]
}

// New returns a Hub that subscribes through rdb; it makes no connection
// until the first Watch.
func New(rdb redis.UniversalClient) *Hub {
	h := &Hub{
		rdb:    rdb,
		done:   make(chan struct{}),
		groups: make(map[string]*redis.PubSub),
		chans:  make(map[string]*channelState),
	}
	h.cluster, _ = rdb.(*redis.ClusterClient)
	return h
}

// Watch returns a Watcher of channel ch, subscribing ch if it is new.
// Its signal (C) fires once the subscription is confirmed, and at every
// message; not at all once the Hub is closed or disabled, nor while the
// subscription cannot be made: the waiter must poll as well. Stop it when
// done.
func (h *Hub) Watch(ch string) *Watcher {
	w := &Watcher{h: h, ch: ch, sig: make(chan struct{}, 1)}
	if hook := h.beforeSubscribe; hook != nil {
		hook(ch)
	}
	shard := ""
	if h.cluster != nil {
		if m, err := h.cluster.MasterForKey(context.Background(), ch); err == nil {
			shard = m.Options().Addr
		}
	}
	h.mu.Lock()
	if h.closed || h.disabled {
		h.mu.Unlock()
		return w
	}
	if cs, ok := h.chans[ch]; ok {
		cs.waiters[w] = struct{}{}
		if cs.confirmed {
			w.notify()
		}
		h.mu.Unlock()
		return w
	}
	ps, started := h.groups[shard]
	if !started {
		// No I/O yet: in a cluster, the connection must go to the shard
		// of the first channel, which the subscribe below names.
		if h.cluster != nil {
			ps = h.cluster.SSubscribe(context.Background())
		} else {
			ps = h.rdb.Subscribe(context.Background())
		}
		h.groups[shard] = ps
	}
	h.chans[ch] = &channelState{waiters: map[*Watcher]struct{}{w: {}}, group: ps}
	// Hand over to the I/O lock: subscribes and unsubscribes go out in the
	// order the map changed, while notifications need only h.mu.
	h.io.Lock()
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	// On error the waiter still polls; the subscription is made again on
	// reconnect (by go-redis, or in a cluster by readShard).
	if h.cluster != nil {
		_ = ps.SSubscribe(ctx, ch)
	} else {
		_ = ps.Subscribe(ctx, ch)
	}
	cancel()
	h.io.Unlock()
	if !started {
		// After the first subscribe, which picked the connection's node;
		// and without h.io, as start takes h.mu (the lock order is h.mu,
		// then h.io).
		h.start(ps)
	}
	return w
}

// start runs the reader of a new subscriber connection.
func (h *Hub) start(ps *redis.PubSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return // Close closed ps
	}
	if h.cluster != nil {
		alive := make(chan struct{}, 1)
		h.wg.Add(2)
		go h.readShard(ps, alive)
		go h.pingShard(ps, alive)
		return
	}
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for m := range msgs {
			switch m := m.(type) {
			case *redis.Message:
				h.notify(m.Channel, false, m.Payload)
			case *redis.Subscription:
				if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
					h.notify(m.Channel, true, "")
				}
			}
		}
	}()
}

// The health check of a cluster subscriber connection, as go-redis's
// ChannelWithSubscriptions does it: a PING when nothing came for
// idleCheck; go-redis reconnects when the PING cannot be sent.
const (
	idleCheck   = 3 * time.Second
	pingTimeout = 5 * time.Second
)

// readShard reads a cluster subscriber connection (one per master) until
// close. It does what go-redis's ChannelWithSubscriptions does, and one
// thing more. On a new connection, go-redis re-subscribes all of ps's shard
// channels in one SSUBSCRIBE, which Redis refuses with CROSSSLOT when they
// span slots, as a master's channels do: nothing would be subscribed again.
// That refusal is the first reply on the new connection, whoever caused the
// reconnection, and comes through here: readShard then subscribes the
// channels again one by one, and each confirmation tells the channel's
// waiters to claim again (a notification may have been lost while the
// connection was down).
func (h *Hub) readShard(ps *redis.PubSub, alive chan<- struct{}) {
	defer h.wg.Done()
	ctx := context.Background()
	failures := 0 // connection errors in a row
	for {
		m, err := ps.Receive(ctx)
		if err != nil {
			var rerr redis.Error
			switch {
			case errors.Is(err, redis.ErrClosed):
				return
			case errors.As(err, &rerr):
				// An error reply; the connection is fine.
				if strings.HasPrefix(rerr.Error(), "CROSSSLOT") {
					h.resubscribe(ps)
				}
			default:
				// The connection is lost (or closed by Close); go-redis
				// reconnects on the next receive. Pause if that failed.
				if failures > 0 && !h.pause(100*time.Millisecond) {
					return
				}
				failures++
			}
			continue
		}
		failures = 0
		select {
		case alive <- struct{}{}:
		default:
		}
		switch m := m.(type) {
		case *redis.Message:
			h.notify(m.Channel, false, m.Payload)
		case *redis.Subscription:
			if m.Kind == "ssubscribe" {
				h.notify(m.Channel, true, "")
			}
		}
	}
}

// pingShard is the health check of a cluster subscriber connection: a PING
// when readShard received nothing for idleCheck.
func (h *Hub) pingShard(ps *redis.PubSub, alive <-chan struct{}) {
	defer h.wg.Done()
	t := time.NewTimer(idleCheck)
	defer t.Stop()
	for {
		select {
		case <-alive:
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
			_ = ps.Ping(ctx) // on failure go-redis reconnects
			cancel()
		case <-h.done:
			return
		}
		t.Reset(idleCheck)
	}
}

// resubscribe subscribes ps's channels again one SSUBSCRIBE each, after
// go-redis's re-subscription of them all in one was refused.
func (h *Hub) resubscribe(ps *redis.PubSub) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	var chans []string
	for ch, cs := range h.chans {
		if cs.group == ps {
			cs.confirmed = false // until the new connection confirms it
			chans = append(chans, ch)
		}
	}
	h.io.Lock()
	h.mu.Unlock()
	defer h.io.Unlock()
	for _, ch := range chans {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := ps.SSubscribe(ctx, ch)
		cancel()
		if err != nil {
			// The new connection is lost too (the waiters still poll); the
			// next one's refused re-subscription brings us back here.
			return
		}
	}
}

// pause waits for d and reports true, or reports false at once when the
// hub is closed.
func (h *Hub) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-h.done:
		return false
	}
}

// notify wakes the waiters of channel ch: for a confirmed subscription,
// or a notification whose message is msg.
func (h *Hub) notify(ch string, confirmed bool, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs, ok := h.chans[ch]
	if !ok {
		return
	}
	if confirmed {
		cs.confirmed = true
	}
	for w := range cs.waiters {
		if len(msg) > 1 {
			w.note.Store(&msg)
		}
		w.notify()
	}
}

// C receives a value whenever the waiter should look again: the
// subscription was confirmed (or made again after a reconnect), or a
// message arrived. Values do not queue: one stands for any number.
func (w *Watcher) C() <-chan struct{} { return w.sig }

// Note returns the last message of more than one byte that came for the
// channel since the last call, and forgets it (shorter messages only
// signal). The message is shared
// by every watcher of the channel: do not change it.
func (w *Watcher) Note() (msg string, ok bool) {
	if p := w.note.Swap(nil); p != nil {
		return *p, true
	}
	return "", false
}

func (w *Watcher) notify() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// Stop ends the watcher's interest in its channel. The channel's last
// waiter leaves it to unsubscribe, in the background: a waiter returns
// without waiting for the write, and the waiters that a crowd of owners'
// outcomes wakes at once do not line up behind each other's writes.
func (w *Watcher) Stop() {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	cs, ok := h.chans[w.ch]
	if !ok {
		return
	}
	delete(cs.waiters, w)
	switch {
	case len(cs.waiters) > 0:
	case h.closed:
		delete(h.chans, w.ch)
	default:
		h.leaving = append(h.leaving, w.ch)
		if !h.unsubscribing {
			h.unsubscribing = true
			h.wg.Add(1)
			go h.unsubscribe()
		}
	}
}

// unsubscribe unsubscribes the channels that their last waiters left and
// no waiter came back to, many in one UNSUBSCRIBE where it can (in a
// cluster, SUNSUBSCRIBE takes the channels of one slot: one each), until
// none is left. A channel is dropped from h.chans before its unsubscribe
// goes out, in h.io's order: a waiter that comes for it then subscribes it
// anew, after the unsubscribe.
func (h *Hub) unsubscribe() {
	defer h.wg.Done()
	for {
		h.mu.Lock()
		if h.closed || len(h.leaving) == 0 {
			h.unsubscribing = false
			h.leaving = nil
			h.mu.Unlock()
			return
		}
		groups := make(map[*redis.PubSub][]string)
		for _, ch := range h.leaving {
			if cs, ok := h.chans[ch]; ok && len(cs.waiters) == 0 {
				delete(h.chans, ch)
				groups[cs.group] = append(groups[cs.group], ch)
			}
		}
		h.leaving = nil
		h.io.Lock()
		h.mu.Unlock()
		for ps, chans := range groups {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if h.cluster != nil {
				for _, ch := range chans {
					_ = ps.SUnsubscribe(ctx, ch)
				}
			} else {
				_ = ps.Unsubscribe(ctx, chans...)
			}
			cancel()
		}
		h.io.Unlock()
	}
}

// BeforeSubscribe makes Watch call f(ch) before it subscribes: tests use
// it to publish in the gap between a waiter's look and its subscription.
// Set it before the first Watch.
func (h *Hub) BeforeSubscribe(f func(ch string)) { h.beforeSubscribe = f }

// Disable makes later watchers subscribe nothing: they are never
// signalled, and waiters rely on polling alone.
func (h *Hub) Disable() {
	h.mu.Lock()
	h.disabled = true
	h.mu.Unlock()
}

// Subscribed returns the number of channels that have watchers, or whose
// unsubscription has not been sent yet.
func (h *Hub) Subscribed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.chans)
}

// Confirmed returns the number of channels whose subscription the server
// has confirmed on the current connection: from then on the server holds
// the subscription, and no message published to them is missed.
func (h *Hub) Confirmed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, cs := range h.chans {
		if cs.confirmed {
			n++
		}
	}
	return n
}

// Done is closed by Close.
func (h *Hub) Done() <-chan struct{} { return h.done }

// Close closes the subscriber connections and waits for the Hub's
// goroutines. Watchers are not signalled: waiters select on Done too.
// It is safe to call more than once.
func (h *Hub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.done)
	var errs []error
	for _, ps := range h.groups {
		if err := ps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	h.mu.Unlock()
	h.wg.Wait()
	return errors.Join(errs...)
}
