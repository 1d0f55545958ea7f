package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The first pause of a waiter's polling; it doubles up to WithPollInterval.
const defaultFirstPoll = 25 * time.Millisecond

// run is one caller's way through the key: claim, and while another owner
// holds the key, wait and claim again, until it gets an outcome, becomes the
// owner, or its budget ends. The wait loop is the claim loop: pub/sub only
// says when to claim again. retry reports an outcome that in-process
// followers must not share (see flights).
func (c *Client) run(ctx context.Context, key, fp string, fn func(context.Context) ([]byte, error)) (res []byte, err error, retry bool) {
	keys := c.keys(key)
	token := newToken()
	first := c.claimRecord(fp, token, 1) // what a claim of a new key writes
	var (
		w        *watcher
		deadline time.Time
		seen     int64 // the attempt number last seen in progress
		pause    = c.firstPoll
		timer    *time.Timer
	)
	defer func() {
		if w != nil {
			w.stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		sent := time.Now()
		r, err := c.claim(ctx, keys, fp, first)
		if err != nil {
			if mayHaveRun(err) || errors.Is(err, ErrNotReplicated) {
				// The claim may have happened with its reply lost: give it
				// back if it is ours. fn does not run.
				c.release(ctx, keys, token)
			}
			return nil, fmt.Errorf("idem: claim key %q: %w", key, err), ctx.Err() != nil
		}
		switch r.kind {
		case 'c':
			if seen > 0 && r.n == 1 {
				c.release(ctx, keys, token)
				return nil, fmt.Errorf("%w: key %q: attempt %d was in progress; is the retention shorter than the operation?", ErrExpired, key, seen), false
			}
			if err := ctx.Err(); err != nil {
				// The caller gave up while the claim was under way (go-redis
				// applies a context's deadline to reads only with
				// ContextTimeoutEnabled): give the claim back; fn does not
				// start.
				c.release(ctx, keys, token)
				return nil, fmt.Errorf("idem: claim key %q: %w", key, err), true
			}
			if w != nil {
				w.stop()
				w = nil
			}
			claimed := first
			if r.n != 1 {
				claimed = c.claimRecord(fp, token, r.n)
			}
			return c.own(ctx, key, keys, fp, token, claimed, r.n, sent, fn)
		case 'd':
			return replyBytes(r.payload), nil, false
		case 'f':
			return nil, &StoredError{Message: r.payload}, false
		case 'x':
			return nil, fmt.Errorf("%w: key %q", ErrConflict, key), false
		case 'v':
			return nil, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, r.payload), false
		}
		// 'b': another owner holds a live lease.
		seen = r.n
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(c.cfg.wait)
		}
		if c.cfg.wait <= 0 || !now.Before(deadline) {
			return nil, fmt.Errorf("%w: key %q, attempt %d", ErrInProgress, key, r.n), false
		}
		if w == nil {
			w = c.hub.watch(keys[1])
		}
		d := min(jitter(pause), r.leaseLeft, deadline.Sub(now))
		pause = min(2*pause, c.cfg.pollInterval)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-w.sig:
		case <-timer.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: key %q, attempt %d: %w", ErrInProgress, key, r.n, ctx.Err()), true
		case <-c.hub.done:
			return nil, ErrClosed, false
		}
	}
}

// jitter spreads waiters' polls over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// mayHaveRun reports whether a failed script call may still have run on the
// server: its reply was lost, it timed out, or it was cancelled after it was
// sent. It did not run when Redis answered with an error, or when no
// connection could be made.
func mayHaveRun(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false
	}
	var oe *net.OpError
	return !errors.As(err, &oe) || oe.Op != "dial"
}

// flights lets concurrent calls in one process with the same key and
// fingerprint share one claim and one wait, so that a burst of duplicates
// costs one Redis round, not one each.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight // guarded by mu; by key
}

type flight struct {
	fp string
	// done is closed when res, err and retry are set. It is made (under
	// flights.mu) when the first follower comes: most calls have none.
	done  chan struct{}
	res   []byte
	err   error
	retry bool // the leader's outcome is not for followers: they try themselves
}

func (f *flights) do(ctx context.Context, c *Client, key, fp string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	if c.cfg.wait <= 0 {
		// Followers could only wait; with no waiting, each asks Redis.
		res, err, _ := c.run(ctx, key, fp, fn)
		return res, err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		f.mu.Lock()
		fl, ok := f.m[key]
		if ok && fl.fp != fp {
			// Another call with other parameters is under way: let Redis
			// decide which one conflicts.
			f.mu.Unlock()
			res, err, _ := c.run(ctx, key, fp, fn)
			return res, err
		}
		if ok {
			if fl.done == nil {
				fl.done = make(chan struct{})
			}
			done := fl.done
			f.mu.Unlock()
			if timer == nil {
				timer = time.NewTimer(c.cfg.wait)
			}
			select {
			case <-done:
				if fl.retry {
					continue
				}
				return fl.res, fl.err
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: key %q: %w", ErrInProgress, key, ctx.Err())
			case <-timer.C:
				return nil, fmt.Errorf("%w: key %q", ErrInProgress, key)
			case <-c.hub.done:
				return nil, ErrClosed
			}
		}
		fl = &flight{fp: fp}
		if f.m == nil {
			f.m = make(map[string]*flight)
		}
		f.m[key] = fl
		f.mu.Unlock()
		return f.lead(ctx, c, key, fl, fn)
	}
}

func (f *flights) lead(ctx context.Context, c *Client, key string, fl *flight, fn func(context.Context) ([]byte, error)) (res []byte, err error) {
	fl.retry = true // kept if run panics
	defer func() {
		f.mu.Lock()
		delete(f.m, key)
		done := fl.done
		f.mu.Unlock()
		if done != nil {
			close(done)
		}
	}()
	res, err, retry := c.run(ctx, key, fl.fp, fn)
	fl.res, fl.err, fl.retry = res, err, retry
	return res, err
}

// hub holds the Client's subscriber connections: one for a single Redis or
// Sentinel, one per master for a cluster (sharded pub/sub lives on the
// shard). Channels are subscribed when their first waiter comes and
// unsubscribed when their last one goes.
type hub struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient
	done    chan struct{} // closed by close

	mu       sync.Mutex
	closed   bool                     // guarded by mu
	disabled bool                     // guarded by mu; tests: no pub/sub, polling only
	groups   map[string]*redis.PubSub // guarded by mu; by master address ("" outside a cluster)
	chans    map[string]*channelState // guarded by mu; by channel

	wg sync.WaitGroup // the groups' reader goroutines

	// io orders the subscriber connections' writes. It is taken while h.mu
	// is held, then h.mu is released, so writes go out in the order the
	// maps changed without blocking notifications.
	io sync.Mutex

	// beforeSubscribe, when set (tests), runs between a waiter's claim and
	// its subscribe: the gap where a missed notification would hide.
	beforeSubscribe func(channel string)
}

type channelState struct {
	waiters   map[*watcher]struct{}
	confirmed bool // the server confirmed the subscription: no message can be missed from now on
	group     *redis.PubSub
}

// A watcher is one waiter's interest in one channel. sig receives a value
// whenever the waiter should claim again: the subscription was confirmed
// (or renewed after a reconnect), or a notification arrived.
type watcher struct {
	h   *hub
	ch  string
	sig chan struct{}
}

func newHub(rdb redis.UniversalClient) *hub {
	h := &hub{
		rdb:    rdb,
		done:   make(chan struct{}),
		groups: make(map[string]*redis.PubSub),
		chans:  make(map[string]*channelState),
	}
	h.cluster, _ = rdb.(*redis.ClusterClient)
	return h
}

func (h *hub) watch(ch string) *watcher {
	w := &watcher{h: h, ch: ch, sig: make(chan struct{}, 1)}
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
	h.chans[ch] = &channelState{waiters: map[*watcher]struct{}{w: {}}, group: ps}
	// Hand over to the I/O lock: subscribes and unsubscribes go out in the
	// order the map changed, while notifications need only h.mu.
	h.io.Lock()
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	// On error the waiter still polls; go-redis resubscribes on reconnect.
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
func (h *hub) start(ps *redis.PubSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return // close closed ps
	}
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for m := range msgs {
			switch m := m.(type) {
			case *redis.Message:
				h.notify(m.Channel, false)
			case *redis.Subscription:
				if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
					h.notify(m.Channel, true)
				}
			}
		}
	}()
}

func (h *hub) notify(ch string, confirmed bool) {
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
		w.notify()
	}
}

func (w *watcher) notify() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

func (w *watcher) stop() {
	h := w.h
	h.mu.Lock()
	cs, ok := h.chans[w.ch]
	if ok {
		delete(cs.waiters, w)
	}
	if !ok || len(cs.waiters) > 0 || h.closed {
		if ok && len(cs.waiters) == 0 {
			delete(h.chans, w.ch)
		}
		h.mu.Unlock()
		return
	}
	delete(h.chans, w.ch)
	h.io.Lock()
	h.mu.Unlock()
	defer h.io.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if h.cluster != nil {
		_ = cs.group.SUnsubscribe(ctx, w.ch)
	} else {
		_ = cs.group.Unsubscribe(ctx, w.ch)
	}
}

func (h *hub) close() error {
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
