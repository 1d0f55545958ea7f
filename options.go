// options.go: the Options of New, their defaults and their validation.

package idem

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/slogdefault"
)

// An Option configures a Client. Pass options to New.
type Option func(*config)

type config struct {
	prefix        string
	retention     time.Duration
	lease         time.Duration
	wait          time.Duration
	pollInterval  time.Duration
	storeTimeout  time.Duration
	maxKeyLen     int
	maxKeyLenSet  bool // by WithMaxKeyLen, not the default
	maxResultSize int
	logger        *slog.Logger
	replicas      int           // WAIT for this many replicas after claims and outcomes; 0 = do not wait
	replicaWait   time.Duration // WAIT's timeout
	pipelines     int           // in flight at once (per master); 0 = every script alone
	observers     []Observer
	eventSecret   []byte // of Event.Key; nil: processSecret
	rawEventKeys  bool
	policyEvery   time.Duration // between checks of maxmemory-policy; 0: policyCheckEvery
	tombstones    time.Duration // kept past the retention; 0 = none
	ledger        Ledger        // nil: none
	ledgerLookups bool          // look up before every fn, not only takeovers
	detach        time.Duration // run fn detached from the caller's context, for at most this; 0 = not detached
	recoverAfter  time.Duration // an unfinished registered operation waits this long for its caller
	maxRecoveries int           // recoveries that do not finish an operation before it is parked
	problems      []string
}

// defaultPipelines is the default of WithPipelines.
const defaultPipelines = 4

func defaultConfig() config {
	return config{
		prefix:        "idem",
		retention:     24 * time.Hour,
		lease:         30 * time.Second,
		wait:          10 * time.Second,
		pollInterval:  500 * time.Millisecond, // a waiter's longest pause between polls
		storeTimeout:  10 * time.Second,
		maxKeyLen:     512,
		maxResultSize: 1 << 20,
		pipelines:     defaultPipelines,
		recoverAfter:  defaultRecoverAfter,
		maxRecoveries: defaultMaxRecoveries,
		logger:        slog.New(slogdefault.Handler{}),
	}
}

func (c *config) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// validate checks the options together; New panics on what it returns.
func (c *config) validate() error {
	if c.lease > c.retention {
		c.problem("WithLease(%v) is longer than WithRetention(%v): a record would expire under a live lease", c.lease, c.retention)
	}
	if c.ledger != nil {
		// A key the ledger cannot index would be retried for ever: refuse
		// it before fn runs.
		if max := c.ledger.MaxKeyLen(); max > 0 && c.maxKeyLen > max {
			if c.maxKeyLenSet {
				c.problem("WithMaxKeyLen(%d) is above the ledger's limit of %d bytes (%T.MaxKeyLen)", c.maxKeyLen, max, c.ledger)
			}
			c.maxKeyLen = max
		}
	}
	if len(c.problems) > 0 {
		return fmt.Errorf("idem: invalid options: %s", strings.Join(c.problems, "; "))
	}
	return nil
}

// WithPrefix sets the prefix of every Redis key the Client uses: records are
// stored at <prefix>:{<key>}. It must be non-empty and must not contain '{'
// or '}' (the braces are the Redis Cluster hash tag).
// The default is "idem".
func WithPrefix(prefix string) Option {
	return func(c *config) {
		if prefix == "" || strings.ContainsAny(prefix, "{}") {
			c.problem("WithPrefix(%q): must be non-empty and without '{' or '}'", prefix)
			return
		}
		c.prefix = prefix
	}
}

// WithRetention sets how long a finished record is kept: during the
// retention, every call with the key replays the stored outcome; after it,
// the key is new again and fn runs again. The retention counts from the
// outcome's recording; replays do not extend it. It must be at least the
// lease and at least 1ms; Redis counts it in whole milliseconds (rounded
// down). Choose it longer than the latest retry your clients can send
// (cmd/ttlbench helps).
// The default is 24 hours.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.problem("WithRetention(%v): must be at least 1ms", d)
			return
		}
		c.retention = d
	}
}

// maxLease is the longest lease: 2^40 ms (about 35 years), the most lease
// left that parseClaim accepts in a claim reply.
const maxLease = (1 << 40) * time.Millisecond

// WithLease sets how long a claim holds the key without a heartbeat. While
// fn runs, the lease is renewed every third of it; if the owner dies, the
// key is taken over by the next caller once the lease has ended. Shorter
// leases recover faster from crashes; longer ones tolerate longer pauses
// (GC, network) of a live owner. It must be at least 10ms and at most
// about 35 years (2^40 ms).
// The default is 30 seconds.
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d < 10*time.Millisecond || d > maxLease {
			c.problem("WithLease(%v): must be at least 10ms and at most %v", d, maxLease)
			return
		}
		c.lease = d
	}
}

// WithWait sets how long a duplicate call waits for the owner's outcome
// before it returns ErrInProgress. Zero means do not wait. The caller's
// context bounds the wait too.
// The default is 10 seconds.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.problem("WithWait(%v): must not be negative", d)
			return
		}
		c.wait = d
	}
}

// WithStoreTimeout sets how long Do keeps trying to record fn's outcome
// (and to release a failed claim) after fn returned, independent of the
// caller's context, which may have ended. Calls share their deadlines,
// so the time may run up to a sixteenth longer. It must be positive.
// The default is 10 seconds.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.problem("WithStoreTimeout(%v): must be positive", d)
			return
		}
		c.storeTimeout = d
	}
}

// WithMaxKeyLen sets the longest key, in bytes, that Do accepts; longer keys
// get ErrInvalidKey. It must be between 1 and 65536, and, with a ledger
// (WithLedger), at most the ledger's own limit (Ledger.MaxKeyLen).
// The default is 512, or the ledger's limit if that is lower.
func WithMaxKeyLen(n int) Option {
	return func(c *config) {
		if n < 1 || n > 1<<16 {
			c.problem("WithMaxKeyLen(%d): must be between 1 and 65536", n)
			return
		}
		c.maxKeyLen, c.maxKeyLenSet = n, true
	}
}

// WithMaxResultSize sets the largest result, in bytes (after msgpack
// encoding for the generic Do), that is stored. A larger result finishes the
// key as a permanent failure wrapping ErrTooLarge: fn has run, so it is
// never run again for the key. A permanent error's stored message is
// bounded too, by the larger of n and 256 bytes: a longer one is cut, with
// a marker saying so (the owner still gets the whole error). It must be
// positive.
// The default is 1 MiB.
func WithMaxResultSize(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.problem("WithMaxResultSize(%d): must be positive", n)
			return
		}
		c.maxResultSize = n
	}
}

// MaxKeyLen returns the longest key the Client accepts, in bytes
// (WithMaxKeyLen), for integrations that check their own limits against it.
func (c *Client) MaxKeyLen() int { return c.cfg.maxKeyLen }

// MaxResultSize returns the largest result the Client stores, in bytes
// (WithMaxResultSize), for integrations that check their own limits
// against it.
func (c *Client) MaxResultSize() int { return c.cfg.maxResultSize }

// WithLogger sets the logger for what the Client notices on its own: a Redis
// eviction policy that can drop live claims, failures to renew a lease or
// to release a claim. Records name keys by their digest (see LogAttrs). A
// nil logger discards.
// The default is slog.Default(), as it is when a message is logged.
func WithLogger(l *slog.Logger) Option {
	// Resolved here, not in the closure: one Option may be shared by
	// many New calls at once, and must not write what they read.
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return func(c *config) { c.logger = l }
}

// WithReplicas makes every claim and every recorded outcome wait until n
// replicas have acknowledged it (Redis WAIT, sent on the same connection as
// the write), for at most timeout. With it, an outcome that Do returned
// without error survives a failover to one of those replicas. A claim that
// reaches fewer replicas is given back and fn does not run; an outcome that
// reaches fewer is stored on the primary, but Do returns an error wrapping
// ErrNotRecorded and ErrNotReplicated. n must not be negative, and timeout
// must be positive when n is, and shorter than the go-redis client's
// ReadTimeout (3s by default), which also bounds the WAIT.
// The default is 0: do not wait for replicas.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) {
		if n < 0 || (n > 0 && timeout <= 0) {
			c.problem("WithReplicas(%d, %v): n must not be negative and the timeout must be positive", n, timeout)
			return
		}
		c.replicas, c.replicaWait = n, timeout
	}
}

// WithPipelines sets how many pipelines of scripts the Client keeps in
// flight at once (per master on a Redis Cluster). A call that finds fewer
// in flight and none queued sends its script alone, with its own context;
// otherwise it queues, and the next pipeline carries every queued call's
// script, each call keeping its own reply, errors and context. A shared
// pipeline runs with a context that carries no caller's values, so go-redis
// hooks (tracing) never see one request's values on another's scripts.
// With WithReplicas, claims and completions go alone. 0 sends every script
// alone; n must not be negative. 1 can cost a crowd of calls less CPU
// per call on a machine whose CPUs are saturated, but lowers throughput
// where they are not (docs/performance.md), and a reply held up (a large
// result, a paused server) then holds every other call for up to 50 ms,
// until its pipeline gives its place up.
// The default is 4.
func WithPipelines(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.problem("WithPipelines(%d): must not be negative", n)
			return
		}
		c.pipelines = n
	}
}

// WithLedger records outcomes in l as well as in Redis: fn commits its
// outcome in the transaction of its business change through l's driver
// (idemsql.Commit, idempgx.Commit), and the ledger's unique key decides
// which attempt's change stands, even with two live owners or after Redis
// lost a record. On a takeover (attempt above 1) the Client looks the key
// up in l before fn, and a recorded outcome is returned, and stored in
// Redis, without running fn. A fresh key costs no lookup (see
// WithLedgerLookups). With a ledger, a record's retention counts from the
// commit of its outcome: a record finished from a ledger row expires when
// the row is the retention old (see Entry.Age), so a ledger pruned of rows
// older than the retention keeps every row whose record Redis holds. The
// Client's key limit is lowered to the ledger's (Ledger.MaxKeyLen).
// The default is no ledger.
func WithLedger(l Ledger) Option {
	return func(c *config) {
		if l == nil {
			c.problem("WithLedger(nil): needs a Ledger")
			return
		}
		c.ledger = l
	}
}

// WithLedgerLookups(true) makes the Client look the key up in the ledger
// before every fn, not only on takeovers: for an fn with effects before
// its transaction, or a Redis that may lose records (no persistence,
// failover without WithReplicas, eviction), where a lookup spares fn's
// first effects. The ledger's unique key keeps the change applied once
// either way.
// The default is false: look up on takeovers only.
func WithLedgerLookups(always bool) Option {
	return func(c *config) { c.ledgerLookups = always }
}

// WithDetach(max) lets the work outlive its caller: fn runs on a context
// without the caller's cancellation and deadline (its values kept),
// bounded by max and, as always, by the lease. A caller whose context
// ends first gets an error wrapping that context's error
// (errors.Is(err, context.DeadlineExceeded) or context.Canceled) at once,
// while fn goes on and its outcome is recorded as usual: the client's
// retry waits for the running attempt or replays its outcome, where it
// would otherwise cancel every attempt that takes longer than the
// client's timeout. A detached call that waits for another owner waits on
// too, for at most WithWait. Close waits for detached calls to end. A
// panic in fn reaches the caller if it still waits; after it has gone the
// claim is released, the panic is logged at Error, and the process goes
// on. max must be positive.
// The default is not detached: fn's context is the caller's.
func WithDetach(max time.Duration) Option {
	return func(c *config) {
		if max <= 0 {
			c.problem("WithDetach(%v): must be positive", max)
			return
		}
		c.detach = max
	}
}

// The defaults of WithRecoverAfter and WithMaxRecoveries.
const (
	defaultRecoverAfter  = time.Minute
	defaultMaxRecoveries = 5
)

// WithRecoverAfter sets how long an unfinished registered operation
// (Register) waits for its caller before a Recover loop takes it over: from
// the end of its lease, or from its release (fn failed transiently). d must
// be positive.
// The default is one minute.
func WithRecoverAfter(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.problem("WithRecoverAfter(%v): must be positive", d)
			return
		}
		c.recoverAfter = d
	}
}

// WithMaxRecoveries sets how many recoveries (Recover) may take a
// registered operation over without finishing it: after n, it is parked
// (StateParked; Do returns an error matching ErrParked without running fn)
// until Retry or Forget. A caller's own Do that claims it counts from 0
// again. n must be between 1 and 255.
// The default is 5.
func WithMaxRecoveries(n int) Option {
	return func(c *config) {
		if n < 1 || n > 255 {
			c.problem("WithMaxRecoveries(%d): must be between 1 and 255", n)
			return
		}
		c.maxRecoveries = n
	}
}

// WithTombstones makes every finished record leave a tombstone, kept for d
// after the retention ends: a call that finds no record but a tombstone
// gets ErrLateRetry (ErrConflict with other parameters) and fn does not
// run, where it would otherwise run again as a new key. With WithLedger,
// the key is looked up in the ledger first: an outcome it still holds is
// returned, as it would be without tombstones. A tombstone holds digests
// of the key and the fingerprint, about 20-45 bytes of Redis memory (see
// the README), against a few hundred for a record; claims of new keys read
// up to six small hashes more on the server (more while Clients of other
// retentions or tombstone times share the Redis: every Client finds every
// other's tombstones, and Forget reaches them all), and no call makes an
// extra round trip. d must not be negative, and the retention plus d at
// most about 35 years.
// The default is 0: no tombstones.
func WithTombstones(d time.Duration) Option {
	return func(c *config) {
		if d < 0 || d > maxLease {
			c.problem("WithTombstones(%v): must be between 0 and %v", d, maxLease)
			return
		}
		c.tombstones = d
	}
}

// WithObserver adds an Observer that receives an Event for every step and
// outcome of every call of Do (see Event). It may be given more than once:
// each observer gets every event, in the order they were given. Without
// observers, calls take no notes: they cost no allocation and no clock
// reading more.
// The default is no observer.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.problem("WithObserver(nil): give an Observer")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// WithEventKeySecret sets the secret of the keyed digest (HMAC-SHA256)
// that stands for the key in events (Event.Key): keys may carry personal
// or guessable data, which a plain hash would not hide. Give every
// instance of a service the same secret, at least 16 bytes (32 random
// bytes, say), so that their digests of one key agree and can be matched
// across logs and traces.
// The default is a random secret per process: digests agree within a
// process only.
func WithEventKeySecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) < 16 {
			c.problem("WithEventKeySecret: the secret has %d bytes, want at least 16", len(secret))
			return
		}
		c.eventSecret = append([]byte(nil), secret...)
	}
}

// WithRawEventKeys makes events carry the key itself (Event.RawKey) as well
// as its digest. Turn it on only where keys are not sensitive and the
// observer's output (logs, traces) is as private as Redis.
// The default is false: events carry the digest only.
func WithRawEventKeys(raw bool) Option {
	return func(c *config) { c.rawEventKeys = raw }
}
