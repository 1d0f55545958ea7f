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
// # What is not promised
//
// Exactly-once execution across a whole system is not promised, and cannot
// be by a lock service alone: Redis replication is asynchronous, a failover
// can lose a recent claim, and a paused process can act after its lease
// ended. Use the two real defences: pass Attempt.Key to the downstream
// system's own idempotency mechanism, and use Attempt.Number as a fencing
// token (or a cue to reconcile) when it is greater than 1.
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
// policy when it can and warns through WithLogger.
package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"
)

var (
	//go:embed lua/record.lua
	recordSrc string
	//go:embed lua/claim.lua
	claimSrc string
	//go:embed lua/complete.lua
	completeSrc string
	//go:embed lua/release.lua
	releaseSrc string
	//go:embed lua/renew.lua
	renewSrc string
	//go:embed lua/status.lua
	statusSrc string

	claimScript    = newScript(claimSrc)
	completeScript = newScript(completeSrc)
	releaseScript  = newScript(releaseSrc)
	renewScript    = newScript(renewSrc)
	statusScript   = newScript(statusSrc)
)

// script is a Lua script with its source at hand, for the pipelined EVAL
// fallback of WithReplicas.
type script struct {
	*redis.Script
	src string
}

// newScript inserts the helpers of lua/record.lua into a script where it
// says --[[lua/record.lua]], or else at its top.
func newScript(src string) script {
	if strings.Contains(src, recordMarker) {
		src = strings.Replace(src, recordMarker, recordSrc, 1)
	} else {
		src = recordSrc + "\n" + src
	}
	return script{redis.NewScript(src), src}
}

const recordMarker = "--[[lua/record.lua]]"

// Client runs idempotent operations on one Redis deployment. It is safe for
// concurrent use; create one per process and share it. Close it when done.
type Client struct {
	rdb redis.UniversalClient
	cfg config

	// Script arguments that never change, boxed once: "PUBLISH" or
	// "SPUBLISH" ("" in tests that lose notifications), and the lease and
	// retention in milliseconds.
	publish, leaseMs, retentionMs any
	// mark is the lease mark of a new claim (see lua/record.lua), in
	// decimal: the retention less the lease, in milliseconds.
	mark string

	hub      *hub
	flights  flights
	bounds   bounds // of recording an outcome, and of releasing a claim
	renewals renewals

	firstPoll time.Duration // a waiter's first pause; tests raise it to rely on pub/sub alone

	closed atomic.Bool
	wg     sync.WaitGroup // the background check started by New
}

// New returns a Client that stores its records in rdb, which may be a
// *redis.Client, a Sentinel failover client or a *redis.ClusterClient. The
// Client does not own rdb: Close does not close it.
//
// New starts a check of the server's maxmemory-policy in the background; a
// policy other than noeviction is reported through the logger (WithLogger).
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
		rdb: rdb, cfg: cfg, firstPoll: defaultFirstPoll,
		publish: "PUBLISH", leaseMs: cfg.lease.Milliseconds(), retentionMs: cfg.retention.Milliseconds(),
		mark: strconv.FormatInt(cfg.retention.Milliseconds()-cfg.lease.Milliseconds(), 10),
	}
	c.bounds.d = cfg.storeTimeout
	c.renewals.c, c.renewals.every = c, cfg.lease/3
	if _, ok := rdb.(*redis.ClusterClient); ok {
		c.publish = "SPUBLISH"
	}
	c.hub = newHub(rdb)
	if rdb != nil {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.checkEvictionPolicy(ctx)
		}()
	}
	return c
}

// Close stops what New started: it waits for the background check (at most
// five seconds) and closes the subscriber connection that wakes waiters.
// Calls waiting for another owner return ErrClosed; later calls to Do
// return ErrClosed. Close does not close the Redis client given to New. It
// is safe to call more than once.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	err := c.hub.close()
	c.wg.Wait()
	return err
}

func (c *Client) checkEvictionPolicy(ctx context.Context) {
	m, err := c.rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		c.cfg.logger.Warn("idem: cannot check Redis maxmemory-policy; make sure it is noeviction, or live claims may be evicted",
			"error", err)
		return
	}
	if p, ok := m["maxmemory-policy"]; ok && p != "noeviction" {
		c.cfg.logger.Warn("idem: Redis maxmemory-policy is not noeviction: records have TTLs, so Redis may evict live claims and let a retry run twice",
			"maxmemory-policy", p)
	}
}

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
// ErrLeaseLost, if the lease is lost while fn runs. The outcome is recorded
// with a context detached from ctx, so a caller that gives up does not
// leave a finished operation unrecorded.
//
// If fn ran but the outcome could not be stored, Do returns fn's result
// together with an error wrapping ErrNotRecorded (or ErrLeaseLost, when a
// newer owner took over).
//
// Calls with the same key and fingerprint in one process may share one
// result slice (fn's own, or the one read from Redis): treat it as
// read-only, and copy it before changing it.
func (c *Client) Do(ctx context.Context, key, fingerprint string, fn func(context.Context) ([]byte, error)) ([]byte, error) {
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
// it returned it; replays get the decoded copy.
func Do[T any](ctx context.Context, c *Client, key, fingerprint string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, errors.New("idem: Do called with a nil fn")
	}
	var (
		own   T
		owned bool
	)
	b, err := c.Do(ctx, key, fingerprint, func(ctx context.Context) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		own, owned = v, true
		b, err := msgpack.Marshal(v)
		if err != nil {
			// fn has acted: record the failure rather than run it again.
			return nil, Permanent(fmt.Errorf("idem: encode result of %T: %w", v, err))
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
	if err := msgpack.Unmarshal(b, &v); err != nil {
		return zero, fmt.Errorf("%w: key %q: decode stored result into %T: %v", ErrCorrupt, key, v, err)
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
	sum := sha256.Sum256([]byte(fingerprint))
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

// claimReply is a decoded reply of lua/claim.lua.
type claimReply struct {
	kind      byte          // 'c' claimed, 'd' done, 'f' failed, 'b' busy, 'x' conflict, 'v' bad record
	n         int64         // attempt number ('c', 'b')
	leaseLeft time.Duration // ('c', 'b')
	payload   string        // result ('d'), message ('f'), reason ('v')
}

// claim runs lua/claim.lua for a call with fingerprint digest fp; keys are
// the record's and its channel's, first the record that a claim of a new
// key writes (claimRecord of attempt 1), which also tells the script the
// call's fingerprint, owner token and lease.
func (c *Client) claim(ctx context.Context, keys []string, fp string, first []byte) (claimReply, error) {
	v, err := c.write(ctx, claimScript, keys[:1], first, c.retentionMs).Result()
	if err != nil {
		return claimReply{}, err
	}
	return claimResult(v, fp, c.cfg.lease)
}

// claimRecord builds the record of a claim (see lua/record.lua): attempt n
// in progress, with fingerprint digest fp, owner token and the lease mark,
// as claim.lua writes it and renew.lua keeps it. claim.lua stores it as it
// is when the key is new; complete.lua finds it unchanged while the claim
// is the caller's.
func (c *Client) claimRecord(fp, token string, n int64) []byte {
	b := make([]byte, 0, headerSize(fp, token)+len(c.mark))
	return append(appendHeader(b, 'p', fp, token, n), c.mark...)
}

// headerSize bounds the size of a record's header (appendHeader).
func headerSize(fp, token string) int { return 3 + len(fp) + 1 + len(token) + 20 + 1 }

// appendHeader appends the header of a record in state st (see
// lua/record.lua), "1" st len(fp) fp len(token) token n ":", to b.
func appendHeader(b []byte, st byte, fp, token string, n int64) []byte {
	b = append(b, '1', st, byte(len(fp)))
	b = append(b, fp...)
	b = append(b, byte(len(token)))
	b = append(b, token...)
	b = strconv.AppendInt(b, n, 10)
	return append(b, ':')
}

// replyBytes returns the bytes of s, a string cut from a go-redis reply,
// without copying them: a replayed result may be large. go-redis reads each
// bulk reply into a []byte of its own and hands it out as a string without
// a copy (as its StringCmd.Bytes hands such bytes back without one); once
// the command is dropped, nothing else refers to them, so they can be the
// caller's.
func replyBytes(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// claimResult reads a reply of lua/claim.lua to a call with fingerprint
// digest fp and the given lease: an attempt number (claimed, with the whole
// lease), 0 (a conflict), a finished record (see readFinished), or an array
// (see parseClaim).
func claimResult(v any, fp string, lease time.Duration) (claimReply, error) {
	switch v := v.(type) {
	case int64:
		switch {
		case v == 0:
			return claimReply{kind: 'x'}, nil
		case v >= 1:
			return claimReply{kind: 'c', n: v, leaseLeft: lease}, nil
		}
	case string:
		return readFinished(v, fp), nil
	case []any:
		return parseClaim(v)
	}
	return claimReply{}, fmt.Errorf("%w: unexpected claim reply %v", ErrCorrupt, v)
}

// readFinished reads a finished record, which claim.lua returns whole (see
// lua/record.lua for the format), for a call with fingerprint digest fp:
// its outcome ('d' or 'f', with the payload), a conflict ('x') when the
// stored fingerprint differs, or 'v' with the reason when the record is not
// one this version understands. It checks what lua/record.lua's parse
// checks.
func readFinished(s, fp string) claimReply {
	bad := claimReply{kind: 'v', payload: "malformed record"}
	if s == "" || s[0] != '1' {
		return claimReply{kind: 'v', payload: "unknown record version"}
	}
	if len(s) < 3 || (s[1] != 'd' && s[1] != 'f') {
		return bad
	}
	fpEnd := 3 + int(s[2]) // fp is s[3:fpEnd]; the owner's length byte is at fpEnd
	if fpEnd+1 > len(s) || fpEnd+1+int(s[fpEnd]) >= len(s) {
		return bad // lengths past the end, or no attempt number after the owner
	}
	nStart := fpEnd + 1 + int(s[fpEnd])
	colon := strings.IndexByte(s[nStart:], ':')
	if colon < 1 || colon > 15 {
		return bad
	}
	n := s[nStart : nStart+colon]
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return bad
		}
	}
	if strings.Trim(n, "0") == "" {
		return bad // attempt 0
	}
	if stored := s[3:fpEnd]; fp != "" && stored != "" && stored != fp {
		return claimReply{kind: 'x'}
	}
	return claimReply{kind: s[1], payload: s[nStart+colon+1:]}
}

// write runs a script that changes a record. With WithReplicas, the script
// and a WAIT go in one pipeline, on one connection to the record's primary,
// and a shortfall of replicas is an error wrapping ErrNotReplicated (the
// script's reply is kept in the returned command all the same).
func (c *Client) write(ctx context.Context, s script, keys []string, args ...any) *redis.Cmd {
	if c.cfg.replicas == 0 {
		return s.Run(ctx, c.rdb, keys, args...)
	}
	var node redis.Cmdable = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		node = m
	}
	run := func(sha bool) (*redis.Cmd, *redis.Cmd) {
		pipe := node.Pipeline()
		var cmd *redis.Cmd
		if sha {
			cmd = pipe.EvalSha(ctx, s.Hash(), keys, args...)
		} else {
			cmd = pipe.Eval(ctx, s.src, keys, args...)
		}
		w := pipe.Do(ctx, "WAIT", c.cfg.replicas, c.cfg.replicaWait.Milliseconds())
		_, _ = pipe.Exec(ctx)
		return cmd, w
	}
	cmd, w := run(true)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, w = run(false)
	}
	if cmd.Err() != nil {
		return cmd
	}
	if err := w.Err(); err != nil {
		cmd.SetErr(fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err))
	} else if got, _ := w.Val().(int64); got < int64(c.cfg.replicas) {
		cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, got, c.cfg.replicas, c.cfg.replicaWait))
	}
	return cmd
}

// parseClaim reads the array replies of lua/claim.lua: claimed before
// ('c'), busy ('b'), or a record this version does not understand ('v').
func parseClaim(v []any) (claimReply, error) {
	bad := func() (claimReply, error) {
		return claimReply{}, fmt.Errorf("%w: unexpected claim reply %v", ErrCorrupt, v)
	}
	if len(v) == 0 {
		return bad()
	}
	kind, _ := v[0].(string)
	if len(kind) != 1 {
		return bad()
	}
	r := claimReply{kind: kind[0]}
	switch r.kind {
	case 'c', 'b':
		if len(v) != 3 {
			return bad()
		}
		a, ok1 := v[1].(int64)
		b, ok2 := v[2].(int64)
		if !ok1 || !ok2 {
			return bad()
		}
		if r.kind == 'b' {
			a, b = b, a
		}
		// a is the attempt number, b the lease left in ms: a busy lease has
		// some left; none lasts 30 years.
		if a < 1 || b < 0 || b > 1<<40 || (r.kind == 'b' && b == 0) {
			return bad()
		}
		r.n, r.leaseLeft = a, time.Duration(b)*time.Millisecond
	case 'v':
		if len(v) != 2 {
			return bad()
		}
		s, ok := v[1].(string)
		if !ok {
			return bad()
		}
		r.payload = s
	default:
		return bad()
	}
	return r, nil
}

// release gives the claim up if it is still ours, so the next caller can
// take over at once instead of after the lease.
func (c *Client) release(ctx context.Context, keys []string, token string) {
	dctx := c.bounds.detached(ctx)
	err := releaseScript.Run(dctx, c.rdb, keys, token, c.publish).Err()
	if err != nil {
		c.cfg.logger.Warn("idem: could not release a claim; the key stays claimed until the lease ends",
			"record", keys[0], "error", err)
	}
}

// finishedRecord builds the record that stores an outcome (see
// lua/record.lua): state 'd' with the result, or 'f' with the permanent
// error's message, as payload, after the header of attempt n claimed with
// fingerprint digest fp and owner token. Built here, it reaches Redis as
// one argument that complete.lua stores as it is: Lua copies nothing.
//
// A large record's buffer comes from recordBufs and goes back there when
// free is called, once the record is sent for good: go-redis writes a
// command's arguments while it runs and keeps nothing of them after.
func finishedRecord(state byte, fp, token string, n int64, payload []byte) (record []byte, free func()) {
	size := headerSize(fp, token) + len(payload)
	var buf *[]byte
	if size >= pooledRecord {
		buf, _ = recordBufs.Get().(*[]byte)
		if buf == nil || cap(*buf) < size {
			buf = new([]byte)
			*buf = make([]byte, 0, size)
		}
		record = (*buf)[:0]
	} else {
		record = make([]byte, 0, size)
	}
	record = append(appendHeader(record, state, fp, token, n), payload...)
	if buf == nil {
		return record, func() {}
	}
	return record, func() { recordBufs.Put(buf) }
}

// recordBufs recycles the buffers of finished records of at least
// pooledRecord bytes (as *[]byte): without it, every large result would
// cost an allocation of its size, and the garbage collections that follow.
var recordBufs sync.Pool

const pooledRecord = 64 << 10

// complete records an outcome, a record built by finishedRecord, with
// compare-and-set on the claim (claimed, built by claimRecord), retrying
// with a detached context until the store timeout. It never releases: fn
// has acted.
func (c *Client) complete(ctx context.Context, keys []string, claimed, record []byte) error {
	dctx := c.bounds.detached(ctx)
	var lastErr error
	for try, pause := 0, 20*time.Millisecond; ; try++ {
		n, err := c.write(dctx, completeScript, keys, claimed, record, c.retentionMs, c.publish).Int64()
		switch {
		case err == nil && n == 1:
			return nil
		case err == nil:
			return ErrLeaseLost
		case errors.Is(err, ErrNotReplicated):
			// Stored on the primary; retrying cannot make it more durable
			// than WAIT just did.
			return fmt.Errorf("%w: %w", ErrNotRecorded, err)
		}
		lastErr = err
		t := time.NewTimer(pause)
		select {
		case <-dctx.Done():
			t.Stop()
			return fmt.Errorf("%w: after %d tries: %w", ErrNotRecorded, try+1, lastErr)
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// own runs fn as the owner of attempt n, claimed with fingerprint digest fp
// by a request sent at sent that wrote the record claimed (see
// claimRecord), and records its outcome. retry tells in-process followers
// (see flights) that this outcome is not theirs to share: they should try
// the key themselves.
func (c *Client) own(ctx context.Context, key string, keys []string, fp, token string, claimed []byte, n int64, sent time.Time, fn func(context.Context) ([]byte, error)) (res []byte, err error, retry bool) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// fn's context and its lease's renewal, in one allocation.
	o := &struct {
		ctx   attemptCtx
		lease renewal
	}{ctx: attemptCtx{Context: cctx, a: Attempt{Key: key, Number: n}}}
	fctx := &o.ctx
	o.lease = renewal{ctx: fctx, cancel: cancel, keys: keys[:1], token: token, claimed: sent}
	c.renewals.start(&o.lease)

	var panicked bool
	var pv any
	func() {
		defer func() {
			if p := recover(); p != nil {
				panicked, pv = true, p
			}
		}()
		res, err = fn(fctx)
	}()
	c.renewals.stop(&o.lease)

	if panicked {
		c.release(ctx, keys, token)
		panic(pv)
	}
	if err != nil && !errors.As(err, new(*permanentError)) {
		c.release(ctx, keys, token)
		return nil, err, true
	}
	var record []byte
	var free func()
	switch {
	case err != nil:
		record, free = finishedRecord('f', fp, token, n, []byte(err.Error()))
	case len(res) > c.cfg.maxResultSize:
		err = tooLarge(len(res), c.cfg.maxResultSize)
		res = nil
		record, free = finishedRecord('f', fp, token, n, []byte(err.Error()))
	default:
		record, free = finishedRecord('d', fp, token, n, res)
	}
	serr := c.complete(ctx, keys, claimed, record)
	free()
	if serr != nil {
		if err != nil {
			return res, errors.Join(serr, err), true
		}
		return res, serr, true
	}
	return res, err, false
}

// State is the state of a key's record.
type State int

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

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateInProgress:
		return "in progress"
	case StateDone:
		return "done"
	case StateFailed:
		return "failed"
	case StateReleased:
		return "released"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Status describes a key's record, with times from the Redis server's clock.
type Status struct {
	// State is the record's state.
	State State
	// Attempt is the latest attempt number (0 when absent).
	Attempt int64
	// LeaseEnds is when the latest attempt's lease ends or ended, for a
	// record in progress or released (zero otherwise). While State is
	// StateInProgress, the next caller takes over after it.
	LeaseEnds time.Time
	// Expires is when the record will be deleted (zero when absent).
	Expires time.Time
}

// Status reports the state of key's record without changing it.
func (c *Client) Status(ctx context.Context, key string) (Status, error) {
	if err := c.checkCall(ctx, key); err != nil {
		return Status{}, err
	}
	v, err := statusScript.Run(ctx, c.rdb, c.keys(key)[:1]).Slice()
	if err != nil {
		return Status{}, fmt.Errorf("idem: status of key %q: %w", key, err)
	}
	return parseStatus(key, v)
}

func parseStatus(key string, v []any) (Status, error) {
	bad := func(why string) (Status, error) {
		return Status{}, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, why)
	}
	if len(v) == 2 {
		if why, ok := v[1].(string); ok && v[0] == "v" {
			return bad(why)
		}
	}
	if len(v) != 5 {
		return bad("unexpected status reply")
	}
	now, ok1 := v[0].(int64)
	pttl, ok2 := v[1].(int64)
	st, ok3 := v[2].(string)
	n, ok4 := v[3].(int64)
	lu, ok5 := v[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return bad("unexpected status reply")
	}
	switch {
	case st == "" && (pttl != -2 || n != 0 || lu != 0):
		return bad("inconsistent reply for an absent record")
	case st == "":
		return Status{}, nil
	case pttl < -1 || n < 1 || lu < 0 || (lu != 0 && (st == "d" || st == "f")):
		return bad("inconsistent status reply")
	}
	var s Status
	switch st {
	case "p":
		s.State = StateInProgress
	case "d":
		s.State = StateDone
	case "f":
		s.State = StateFailed
	case "r":
		s.State = StateReleased
	default:
		return bad(fmt.Sprintf("unknown state %q", st))
	}
	s.Attempt = n
	if lu > 0 {
		s.LeaseEnds = time.UnixMilli(lu)
	}
	if pttl >= 0 {
		s.Expires = time.UnixMilli(now + pttl)
	}
	return s, nil
}

// Forget deletes key's record, whatever its state: the next Do runs fn as
// attempt 1. It is an operator's escape hatch (a stuck or wrong record);
// forgetting a key whose operation ran lets a retry run it again. Waiters
// of a forgotten in-progress key see ErrExpired.
func (c *Client) Forget(ctx context.Context, key string) error {
	if err := c.checkCall(ctx, key); err != nil {
		return err
	}
	if err := c.rdb.Del(ctx, c.recordKey(key)).Err(); err != nil {
		return fmt.Errorf("idem: forget key %q: %w", key, err)
	}
	return nil
}
