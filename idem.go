// idem.go: the Client, New and Close, and Do, where a call starts: its
// state (call) and its checks; it goes on in flights.go.

package idem

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/codec"
	"github.com/idem-go/idem/internal/notify"
	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
)

// Client runs idempotent operations on one Redis deployment. It is safe for
// concurrent use; create one per process and share it. Close it when done.
type Client struct {
	rdb redis.UniversalClient
	cfg config

	// Script arguments that never change, boxed once: "PUBLISH" or
	// "SPUBLISH" (or "", which publishes nothing), and the lease and
	// retention in milliseconds.
	publish, leaseMs, retentionMs any
	// ages is claim.lua's ARGV[3]: "1" to have replays' ages, for the
	// events (see Event.Age), else "" (then a plain claim leaves it out).
	ages any
	tomb tombstones
	// mark is the lease mark of a new claim (see lua/record.lua), in
	// decimal: the retention less the lease, in milliseconds.
	mark string

	hub      *notify.Hub
	scripts  *pipeline.Runner // runs the scripts that change records, concurrent calls' in shared pipelines
	flights  flights
	bounds   bounds // of recording an outcome, and of releasing a claim
	renewals renewals

	firstPoll time.Duration // a waiter's first pause (defaultFirstPoll)
	// margin is taken off the owner's lease deadline, for the drift of the
	// client's clock against the server's, and for timers that fire late.
	margin time.Duration

	bg        pipeline.Work // work that outlives its call (releases, renewal calls, senders), and the policy checks
	releasing atomic.Int64  // releases under way in the background
	policy    policyWatch   // the periodic check of maxmemory-policy

	closed atomic.Bool

	opsMu sync.Mutex
	ops   map[string]recoverer // the registered operations by name (Register), guarded by opsMu

	// Boxed script arguments of registered operations: the lease plus
	// WithRecoverAfter, in ms (a claim is due for recovery then),
	// WithRecoverAfter in ms, and WithMaxRecoveries.
	dueMs, recoverMs, maxRecoveries any
	cluster                         bool // rdb is a *redis.ClusterClient
}

// New returns a Client that stores its records in rdb, which may be a
// *redis.Client, a Sentinel failover client or a *redis.ClusterClient. The
// Client does not own rdb: Close does not close it.
//
// New starts a check of the server's maxmemory-policy in the background,
// repeated every minute until Close; a policy other than noeviction is
// reported through the logger (WithLogger) when first seen.
// New panics if an option is invalid, as that is a programming error.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	c := &Client{
		rdb: rdb, cfg: cfg, firstPoll: min(defaultFirstPoll, cfg.pollInterval), margin: cfg.lease / 32,
		publish: "PUBLISH", leaseMs: cfg.lease.Milliseconds(), retentionMs: cfg.retention.Milliseconds(),
		mark: strconv.FormatInt(cfg.retention.Milliseconds()-cfg.lease.Milliseconds(), 10),
	}
	c.bounds.d = cfg.storeTimeout
	c.ages = ""
	if len(cfg.observers) > 0 {
		c.ages = "1"
	}
	// Status and Forget reach the tombstones of other Clients whether or
	// not this one leaves any: it knows their buckets.
	c.tomb.buckets = serverBuckets
	if cfg.tombstones > 0 {
		span := cfg.retention + cfg.tombstones
		c.tomb = tombstones{on: true, span: span.Milliseconds(), window: tombstoneWindow(span).Milliseconds(), buckets: serverBuckets}
	}
	c.scripts = pipeline.NewRunner(rdb, cfg.pipelines, &c.bg)
	c.renewals.c, c.renewals.every = c, cfg.lease/3
	if _, ok := rdb.(*redis.ClusterClient); ok {
		c.cluster = true
		c.publish = "SPUBLISH"
		c.tomb.buckets = 16384
	}
	c.dueMs, c.recoverMs = (cfg.lease + cfg.recoverAfter).Milliseconds(), cfg.recoverAfter.Milliseconds()
	c.maxRecoveries = cfg.maxRecoveries
	c.hub = notify.New(rdb)
	if rdb != nil {
		c.policy.start(c, cfg.policyEvery)
	}
	return c
}

// Close stops what New started: it waits for the background check (at most
// five seconds), closes the subscriber connection that wakes waiters, and
// waits for the work that calls left in the background: releases of claims
// whose callers gave up, and renewal calls still under way (each bounded by
// WithStoreTimeout, or the go-redis client's timeouts).
// Calls waiting for another owner return ErrClosed; later calls to Do
// return ErrClosed. Close does not close the Redis client given to New. It
// is safe to call more than once.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.policy.stop()
	err := c.hub.Close()
	c.bg.Wait()
	return err
}

// Lease returns the Client's lease (WithLease): how long a claim holds a
// key after its owner's last renewal. Integrations use it to choose their
// own timeouts, such as how long a message may stay unacknowledged.
func (c *Client) Lease() time.Duration { return c.cfg.lease }

// Attempt describes the attempt that runs fn. Get it inside fn with
// AttemptFrom.
type Attempt struct {
	// Key is the idempotency key, to forward to a downstream system's own
	// idempotency mechanism.
	Key string
	// Number is 1 for the first attempt and grows by one at every takeover
	// (after an error, a panic, or an owner whose lease ended); it is never
	// reused for a key while its record is retained. Above 1, an earlier
	// attempt may have acted: reconcile before acting again. It also serves
	// as a fencing token.
	Number int64
}

type attemptKey struct{}

// AttemptFrom returns the Attempt that ctx belongs to. It reports false
// outside the fn of a Do call.
//
// fn's context ends when the lease is lost, or when the owner's lease
// deadline passes without a renewal (cause ErrLeaseLost), but its
// Deadline() is the caller's context's (none if the caller set none): the
// lease deadline moves with every renewal, so it is not reported as a
// deadline. Check ctx.Err() before each side effect, and bound a
// downstream call by a timeout shorter than the lease (WithLease), not by
// ctx.Deadline().
func AttemptFrom(ctx context.Context) (Attempt, bool) {
	a, ok := ctx.Value(attemptKey{}).(*Attempt)
	if !ok {
		return Attempt{}, false
	}
	return *a, true
}

// Do runs fn at most once per key while the key's record is retained, and
// returns its outcome: the first call claims the key and runs fn; later
// calls get the stored result, or the *StoredError of an error marked
// Permanent, without running fn. A key reused with another non-empty
// fingerprint (see Fingerprint) gets ErrConflict. While another caller
// runs fn, Do waits for its outcome (WithWait), else returns ErrInProgress.
//
// When fn returns another error, or panics, the key is released and the
// next call runs fn as the next Attempt.Number. fn's context carries the
// Attempt and ends, with cause ErrLeaseLost, when the lease is lost or its
// deadline passes (see "Leases and clocks"). If fn ran but its outcome
// could not be stored, Do returns fn's result with an error wrapping
// ErrNotRecorded (or ErrLeaseLost). Calls in one process may share one
// result slice: treat it as read-only.
func (c *Client) Do(ctx context.Context, key, fingerprint string, fn func(context.Context) ([]byte, error)) (res []byte, err error) {
	cl := &call{c: c, key: key, fn: fn}
	if op, ok := ctx.Value(inputKey{}).(*opCall); ok && op != nil {
		// Op.Do's input, or a recovery's: for this call only, not for
		// calls that fn makes.
		cl.op = op
		op.key = key
		ctx = context.WithValue(ctx, inputKey{}, (*opCall)(nil))
	}
	if !c.observed() {
		return cl.do(ctx, fingerprint)
	}
	ctx = cl.startNotes(ctx)
	returned := false
	defer func() { cl.report(ctx, err, returned) }()
	res, err = cl.do(ctx, fingerprint)
	returned = true
	return res, err
}

// call is one call of Do on its way through its key: what it was given,
// and what it learns on the way. A call that leads in-process duplicates
// is also their flight (see flights).
type call struct {
	c     *Client
	key   string
	fp    string // the fingerprint's digest
	fn    func(context.Context) ([]byte, error)
	op    *opCall    // a registered operation's (Op.Do, or a recovery); nil for Do
	until time.Time  // the end of the caller's wait (WithWait)
	notes *callNotes // for the observers; nil when nobody observes the call

	// Set by claim.
	keys      []string  // the Redis keys of the record and of its channel
	claimKeys []string  // of the record and of its steps' checkpoints
	keySet    [4]string // what keys and claimKeys hold (see callKeys)
	// claim.lua's command (see pipeline.RunArgs): two places for the
	// pipeline, the number of keys, claimKeys (boxed once: the record's
	// serves complete's command too), then ARGV[1..3], the new claim, the
	// retention, ages. Set once, before the first claim, for a pipeline
	// may read it after the call gave up on it (see pipeline.InFlight).
	claimCmd [8]any
	// complete.lua's command when the call has neither an operation nor
	// tombstones, for its first complete (see completeArgs).
	completeCmd  [9]any
	completeUsed bool
	token        string // the owner token of this call's claims
	n            int64  // the attempt claimed
	claimed      any    // the record of that claim ([]byte, boxed once), which complete finds unchanged

	// As a flight: ready is closed once res, err and retry are set; it is
	// made, under flights.mu, when the first follower comes.
	ready chan struct{}
	res   []byte
	err   error
	retry bool // the outcome is not the followers' to share: they try themselves
}

// do checks the call, then takes it through its key: it follows an
// in-process duplicate's flight, or leads and claims (see flights).
func (cl *call) do(ctx context.Context, fingerprint string) ([]byte, error) {
	if cl.fn == nil {
		return nil, errors.New("idem: Do called with a nil fn")
	}
	if err := cl.c.checkCall(ctx, cl.key); err != nil {
		return nil, err
	}
	cl.fp = digest(fingerprint)
	cl.until = time.Now().Add(cl.c.cfg.wait)
	if cl.op != nil && cl.op.recovery {
		// A recovery waits for no live owner: it comes back later.
		cl.until = time.Now()
		return cl.c.flights.do(ctx, cl)
	}
	if d := cl.c.cfg.detach; d > 0 {
		return cl.detached(ctx, d)
	}
	return cl.c.flights.do(ctx, cl)
}

// detached takes the call through its key on a context of its own, bounded
// by max, and returns its outcome, or the caller's context's error as
// soon as that ends (WithDetach). The call goes on in the background,
// counted in c.bg, so that Close waits for it.
func (cl *call) detached(ctx context.Context, max time.Duration) ([]byte, error) {
	type outcome struct {
		res      []byte
		err      error
		panicked bool
		value    any // the panic's
	}
	c := cl.c
	var (
		mu   sync.Mutex // orders the caller's leaving and the outcome's sending
		gone bool       // the caller stopped waiting; guarded by mu
		out  = make(chan outcome, 1)
	)
	send := func(o outcome) {
		mu.Lock()
		defer mu.Unlock()
		if gone && o.panicked {
			c.cfg.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelError, "idem: a detached fn panicked after its caller had gone; its claim was released",
				append(c.LogAttrs(cl.key, nil), slog.Any("panic", o.value))...)
		}
		out <- o
	}
	c.bg.Add()
	go func() {
		defer c.bg.Done()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max)
		defer cancel()
		finished := false
		defer func() {
			if !finished {
				// A panic (recovered here), or runtime.Goexit (recover
				// returns nil): own has given the claim back.
				send(outcome{panicked: true, value: recover()})
			}
		}()
		res, err := c.flights.do(dctx, cl)
		finished = true
		send(outcome{res: res, err: err})
	}()
	var o outcome
	select {
	case o = <-out:
	case <-ctx.Done():
		mu.Lock()
		gone = true
		select {
		case o = <-out: // it ended as the caller left: the caller gets it
			mu.Unlock()
		default:
			mu.Unlock()
			return nil, fmt.Errorf("idem: key %q: the caller's context ended; fn goes on, detached (WithDetach), and its outcome is recorded for the retry: %w", cl.key, ctx.Err())
		}
	}
	if o.panicked {
		if o.value == nil {
			panic(fmt.Sprintf("idem: key %q: the detached fn called runtime.Goexit or panicked with nil", cl.key))
		}
		panic(o.value)
	}
	return o.res, o.err
}

// Do is the typed form of Client.Do: fn's result is stored encoded with
// msgpack and decoded for every replay, equal to the owner's value as
// reflect.DeepEqual sees it, or an error wrapping ErrDecode. A result type
// T that cannot round-trip is refused with ErrEncode before fn runs; a
// value that cannot be encoded once fn returned it finishes the key as a
// permanent failure wrapping ErrEncode (fn has acted). The package
// documentation says what round-trips ("Typed results").
func Do[T any](ctx context.Context, c *Client, key, fingerprint string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, errors.New("idem: Do called with a nil fn")
	}
	rc := codec.For(reflect.TypeFor[T]())
	if err := rc.Err(); err != nil {
		return zero, fmt.Errorf("%w: %v", ErrEncode, err)
	}
	var (
		mu    sync.Mutex // own and owned: a detached fn (WithDetach) sets them after Do returned
		own   T
		owned bool
	)
	b, err := c.Do(ctx, key, fingerprint, func(ctx context.Context) ([]byte, error) {
		p := pendingIn(ctx)
		if p != nil {
			p.setCodec(rc.Type().String(), func(v any) ([]byte, error) {
				t, ok := v.(T)
				if !ok {
					return nil, fmt.Errorf("the typed Do records a %s, not a %T", rc.Type(), v)
				}
				return rc.Encode(&t)
			})
		}
		v, err := fn(ctx)
		if p != nil {
			if d := p.decided(); d.e != nil {
				// The ledger decided the outcome; Client.Do returns it.
				if t, ok := d.v.(T); ok && d.mine && !d.e.Failed {
					mu.Lock()
					own, owned = t, true
					mu.Unlock()
				}
				return nil, nil
			}
		}
		if err != nil {
			return nil, err
		}
		mu.Lock()
		own, owned = v, true
		mu.Unlock()
		b, err := rc.Encode(&v)
		if err != nil {
			// fn has acted: record the failure rather than run it again.
			return nil, Permanent(fmt.Errorf("%w: key %q: %s: %v", ErrEncode, key, rc.Type(), err))
		}
		return b, nil
	})
	mu.Lock()
	mine, v0 := owned, own
	mu.Unlock()
	if mine && !errors.Is(err, ErrParked) {
		// fn's own value, with the error of its recording if any; not
		// when a parked step left the outcome to an operator.
		return v0, err
	}
	if err != nil {
		return zero, err
	}
	var v T
	if err := rc.Decode(b, &v); err != nil {
		return zero, fmt.Errorf("%w: key %q: %s: %v", ErrDecode, key, rc.Type(), err)
	}
	return v, nil
}

// checkCall tells why a call cannot start: no Redis client, a closed
// Client, an invalid key, or a context that is done.
func (c *Client) checkCall(ctx context.Context, key string) error {
	switch {
	case c == nil || c.rdb == nil:
		return errors.New("idem: Client has no Redis client (use idem.New with a non-nil client)")
	case c.closed.Load():
		return ErrClosed
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > c.cfg.maxKeyLen:
		return fmt.Errorf("%w: key of %d bytes is longer than the limit of %d", ErrInvalidKey, len(key), c.cfg.maxKeyLen)
	}
	return ctx.Err()
}

// digest stores parameters as a digest only: whatever the caller passes as
// a fingerprint, raw request data never reaches Redis.
func digest(fingerprint string) string {
	if fingerprint == "" {
		return ""
	}
	sum := sha256.Sum256(stringBytes(fingerprint)) // no copy: it may be large
	return string(sum[:16])
}
