// Package idem makes side-effecting operations safe to retry.
//
// A client that times out and sends the same request again cannot know
// whether the first attempt ran. It attaches an idempotency key to the
// logical operation, and the service wraps the side effect in Do:
//
//	receipt, err := idem.Do(ctx, client, req.IdempotencyKey,
//		idem.Fingerprint(req.Account, req.Amount),
//		func(ctx context.Context) (Receipt, error) {
//			a, _ := idem.AttemptFrom(ctx)
//			// Forward a.Key to the bank's own idempotency; a.Number > 1
//			// means an earlier attempt may have acted: reconcile first.
//			return bank.Debit(ctx, req.Account, req.Amount, a.Key)
//		})
//
// # How it works
//
// Each key has one record in Redis, <prefix>:{<key>}, a compact string
// changed only by Lua scripts (lua/*.lua), so every step is atomic on the
// server:
//
//	absent ──claim──▶ in progress (attempt 1) ──fn ok──▶ done ──retention ends──▶ absent
//	                      │ ──Permanent(err)──▶ failed (replayed like a result)
//	                      │ ──error or panic──▶ released ──claim──▶ in progress (attempt n+1)
//	                      └──lease ends (owner died), claim──▶ in progress (attempt n+1)
//
// Exactly one caller claims the key and runs fn; while it runs, a heartbeat
// renews its lease. Its result is stored for the retention (WithRetention)
// and returned to every later call with the key, without running fn.
// Duplicates that arrive while fn runs wait for the outcome (WithWait),
// woken by Redis pub/sub with polling as the fallback. A key reused with a
// different fingerprint gets ErrConflict at once. If the owner dies, its
// lease ends (WithLease) and the next caller takes over with the next
// attempt number, a fencing token available from AttemptFrom. A stale owner
// cannot overwrite a newer one: recording is compare-and-set on a random
// owner token, and fails with ErrLeaseLost.
//
// Do fails closed: when Redis cannot be reached, or a record cannot be
// understood, fn does not run and Do says why. When fn ran but its outcome
// could not be stored, Do returns an error wrapping ErrNotRecorded.
//
// # Leases and clocks
//
// The server's TTL decides when another caller may take a key over. The
// owner keeps its own, earlier deadline: a lease granted by a claim sent at
// t ends for it at t + lease - lease/32 (the server acted after t), and a
// renewal sent at t' that succeeds moves it to t' + lease - lease/32. fn
// does not start on less than a third of a lease (the owner renews once
// first), and fn's context ends at the owner's deadline, with cause
// ErrLeaseLost, whether or not a renewal call is still hanging. This holds
// under one assumption: over one lease, the client's and the server's
// clocks drift apart by much less than lease/32.
//
// # What is not promised
//
// Exactly-once execution across a whole system is not promised, and cannot
// be by a lock service alone: Redis replication is asynchronous, a failover
// can lose a recent claim, and a paused process can act after its lease
// ended. Use the two real defences: pass Attempt.Key to the downstream
// system's own idempotency mechanism, and use Attempt.Number as a fencing
// token (or a cue to reconcile) when it is greater than 1.
//
// # Steps
//
// An fn of several effects wraps each in Step: a step's outcome is
// checkpointed beside the record (compare-and-set on the owner token), and
// a later attempt resumes after the last checkpointed step. StepKey gives
// each step a stable key for the downstream system, which alone covers a
// step that acted and crashed before its checkpoint. See docs/steps.md.
//
// # Redis
//
// New takes any go-redis UniversalClient: a single server, Sentinel
// failover, or Redis Cluster, where every script touches one hash slot and
// notifications use sharded pub/sub (Redis 7). WithReplicas makes claims
// and outcomes wait for replicas (WAIT), so that an acknowledged outcome
// survives a failover. Run Redis with
// maxmemory-policy noeviction: every record has a TTL, so a volatile-*
// policy may evict a live claim and let a retry run twice. New checks the
// policy when it can and warns through WithLogger; Check checks all of it,
// for start-up and readiness probes.
//
// A lone call sends each script as one EVALSHA. Concurrent calls' scripts
// share pipelines (WithPipelines), each call keeping its own reply, errors
// and context; and a waiter woken by its owner's notification takes a
// small outcome from the notification itself, which follows the stored
// record, instead of claiming again.
//
// # Seeing it run
//
// WithObserver receives an Event for every call's outcome (executed,
// replayed, conflict, released, failed, lease lost, not recorded, in
// progress, error) and the steps on its way (waited, took over), with the
// key as a keyed digest. WithCallInfo tells one caller what became of its
// own call. The otelidem module turns events into OpenTelemetry metrics and
// spans; cmd/idemctl shows and mends the records from a shell.
package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/codec"
	"github.com/redis/go-redis/v9"
)

// Client runs idempotent operations on one Redis deployment. It is safe for
// concurrent use; create one per process and share it. Close it when done.
type Client struct {
	rdb redis.UniversalClient
	cfg config

	// Script arguments that never change, boxed once: "PUBLISH" or
	// "SPUBLISH" ("" in tests that lose notifications), and the lease and
	// retention in milliseconds.
	publish, leaseMs, retentionMs any
	// ages is claim.lua's ARGV[3]: "1" to have replays' ages, for the
	// events (see Event.Age), else "".
	ages any
	tomb tombstones
	// mark is the lease mark of a new claim (see lua/record.lua), in
	// decimal: the retention less the lease, in milliseconds.
	mark string

	hub      *hub
	scripts  runner // runs the scripts that change records, concurrent calls' in shared pipelines
	flights  flights
	bounds   bounds // of recording an outcome, and of releasing a claim
	renewals renewals

	firstPoll time.Duration // a waiter's first pause; tests raise it to rely on pub/sub alone
	// margin is taken off the owner's lease deadline, for the drift of the
	// client's clock against the server's, and for timers that fire late.
	margin time.Duration

	bg        background   // work that outlives its call (releases, renewal calls), and the policy checks
	releasing atomic.Int64 // releases under way in the background
	policy    policyWatch  // the periodic check of maxmemory-policy

	closed atomic.Bool
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
	if cfg.tombstones > 0 {
		span := cfg.retention + cfg.tombstones
		c.tomb = tombstones{on: true, span: span.Milliseconds(), window: tombstoneWindow(span).Milliseconds(), buckets: serverBuckets}
	}
	c.scripts.init(rdb, cfg.pipelines, &c.bg)
	c.renewals.c, c.renewals.every = c, cfg.lease/3
	if _, ok := rdb.(*redis.ClusterClient); ok {
		c.publish = "SPUBLISH"
		c.tomb.buckets = 16384
	}
	c.hub = newHub(rdb)
	if rdb != nil {
		c.policy.start(c, cfg.policyEvery)
	}
	return c
}

// Close stops what New started: it stops the periodic check of
// maxmemory-policy and waits for one under way (at most five seconds),
// closes the subscriber connection that wakes waiters, and
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
	err := c.hub.close()
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
// returns its result: the first call claims the key and runs fn; later
// calls return the stored result without running fn. The fingerprint
// identifies the operation's parameters (see Fingerprint); a key reused
// with a different non-empty fingerprint gets ErrConflict. An empty
// fingerprint is not checked.
//
// While another caller runs fn for the key, Do waits for its outcome (see
// WithWait) and returns ErrInProgress if it does not arrive in time. When
// fn returns an error, the key is released and the error returned; the next
// call runs fn again with a higher Attempt.Number, unless the error was
// marked Permanent: then it is stored and replayed as a *StoredError. When
// fn panics, the key is released and the panic continues in the caller.
//
// fn's context carries the Attempt and is cancelled, with cause
// ErrLeaseLost, if the lease is lost while fn runs, or when the owner's
// lease deadline passes without a renewal (see "Leases and clocks"); fn
// should check it before each side effect. If fn ends with a panic or
// runtime.Goexit, the key is released and either goes on. The outcome is
// recorded with a context detached from ctx, so a caller that gives up
// does not leave a finished operation unrecorded.
//
// If fn ran but the outcome could not be stored, Do returns fn's result
// together with an error wrapping ErrNotRecorded (or ErrLeaseLost, when a
// newer owner took over).
//
// Calls with the same key and fingerprint in one process may share one
// result slice (fn's own, or the one read from Redis): treat it as
// read-only, and copy it before changing it.
func (c *Client) Do(ctx context.Context, key, fingerprint string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	if c.observed(ctx) {
		return c.doObserved(ctx, key, fingerprint, fn)
	}
	return c.do(ctx, key, fingerprint, fn)
}

func (c *Client) do(ctx context.Context, key, fingerprint string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
	if fn == nil {
		return nil, errors.New("idem: Do called with a nil fn")
	}
	if err := c.checkCall(ctx, key); err != nil {
		return nil, err
	}
	return c.flights.do(ctx, c, key, digest(fingerprint), fn)
}

// Do is the typed form of Client.Do: the result of fn is stored encoded
// with msgpack and decoded for every replay. The owner gets fn's value as
// it returned it; a replay gets the stored copy, equal to it as
// reflect.DeepEqual sees it (nil and empty slices told apart; times and
// marshaled types as said below), or an error wrapping ErrDecode that
// names the key and the type, never a zero or partial value.
//
// What round-trips: booleans, numbers, strings, byte slices and arrays,
// slices, arrays, maps, pointers and structs of these, by exported field
// (under its msgpack tag name, if any; embedded structs as msgpack inlines
// them); time.Time, as the same instant in the local time zone (its
// location and monotonic reading are not stored); and types with their
// own marshaler and unmarshaler (msgpack.CustomEncoder, msgpack.Marshaler,
// encoding.BinaryMarshaler, encoding.TextMarshaler: big.Int, big.Rat,
// netip.Addr, url.URL, decimal types), as faithfully as their pair is.
//
// What is refused, with an error wrapping ErrEncode, at the first call
// with a given T and before fn runs: interface fields (an int would come
// back as another integer type), unexported fields and fields tagged
// msgpack:"-" (they would come back zero), channels, funcs, complex
// numbers, pointers to pointers, slices or maps (a pointer to nil is
// stored as nil), map keys that hold pointers or times, a marshaler
// without its unmarshaler, and msgpack's omitempty (on a field, or on a
// struct's _msgpack field) on a field that would come back as another
// value: a slice or map (empty comes back nil), a float (-0 comes back
// 0), a struct, or a type with an IsZero method. omitempty on booleans,
// integers, strings, pointers and arrays is accepted: their empty value is
// Go's zero value. Hold such state in a type with a marshaler, or use
// Client.Do with bytes of your own.
//
// Changing T keeps stored results readable where nothing is lost: a field
// added to T decodes as its zero value, and a number decodes into any
// numeric type that holds it exactly. A stored field that T no longer has
// (renamed or removed), a value that does not fit its field (300 into a
// uint8, 1.5 into an int, -1 into a uint), or another shape is ErrDecode.
//
// A value of T that cannot be encoded once fn returned it (a cyclic value,
// a marshaler that failed) finishes the key as a permanent failure
// wrapping ErrEncode: fn has acted, so it is not run again.
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
			if e, mine, val := p.decided(); e != nil {
				// The ledger decided the outcome; Client.Do returns it.
				if t, ok := val.(T); ok && mine && !e.Failed {
					own, owned = t, true
				}
				return nil, nil
			}
		}
		if err != nil {
			return nil, err
		}
		own, owned = v, true
		b, err := rc.Encode(&v)
		if err != nil {
			// fn has acted: record the failure rather than run it again.
			return nil, Permanent(fmt.Errorf("%w: key %q: %s: %v", ErrEncode, key, rc.Type(), err))
		}
		return b, nil
	})
	if owned {
		return own, err
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

// keys returns the Redis keys of key's record and of its notification
// channel, built in one allocation: <prefix>:{<escaped key>} and the same
// with ":done" after it. The escaping ('\' to "\\", '}' to "\c") keeps the
// hash tag non-empty and exactly the key, so the record and its channel
// always share a cluster slot, whatever bytes the key holds.
func (c *Client) keys(key string) []string {
	var b strings.Builder
	b.Grow(len(c.cfg.prefix) + len(key) + 4 + len(doneSuffix))
	b.WriteString(c.cfg.prefix)
	b.WriteString(":{")
	if strings.IndexByte(key, '\\') >= 0 || strings.IndexByte(key, '}') >= 0 {
		for i := 0; i < len(key); i++ {
			switch key[i] {
			case '\\':
				b.WriteString(`\\`)
			case '}':
				b.WriteString(`\c`)
			default:
				b.WriteByte(key[i])
			}
		}
	} else {
		b.WriteString(key)
	}
	b.WriteByte('}')
	b.WriteString(doneSuffix)
	ch := b.String()
	return []string{ch[:len(ch)-len(doneSuffix)], ch}
}

const doneSuffix = ":done"

// recordKey is the Redis key of key's record.
func (c *Client) recordKey(key string) string { return c.keys(key)[0] }

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return string(b[:])
}

// The states of a record.
const (
	// StateAbsent: no record; the next Do runs fn as attempt 1.
	StateAbsent State = iota
	// StateInProgress: an attempt holds or held the lease.
	StateInProgress
	// StateDone: a result is stored and replayed.
	StateDone
	// StateFailed: a permanent error is stored and replayed.
	StateFailed
	// StateReleased: the last attempt failed transiently; the next Do runs
	// fn again with the next attempt number.
	StateReleased
)
