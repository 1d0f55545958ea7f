package idem

import (
	"context"
	"time"

	"github.com/idem-go/idem/internal/pipeline"
)

// Test-only access to internals, for the tests in package idem_test.

// SetBeforeSubscribe installs a hook that runs between a waiter's claim and
// its subscribe, where a missed notification would hide.
func SetBeforeSubscribe(c *Client, hook func(channel string)) { c.hub.BeforeSubscribe(hook) }

// LosePublishes makes c's scripts publish nothing, as if every notification
// were lost; waiters then rely on polling.
func LosePublishes(c *Client) { c.publish = "" }

// PollOnly makes c neither publish nor subscribe: waiting is polling only.
func PollOnly(c *Client) {
	c.publish = ""
	c.hub.Disable()
}

// RecordKey is the Redis key of key's record.
func RecordKey(c *Client, key string) string { return c.recordKey(key) }

// ChannelKey is the notification channel of key's record.
func ChannelKey(c *Client, key string) string { return c.keys(key)[1] }

// Subscribed is the number of channels c's hub is subscribed to.
func Subscribed(c *Client) int { return c.hub.Subscribed() }

// Confirmed returns the number of c's channels whose subscription the
// server has confirmed (Subscribed counts them from the first Watch,
// before the SUBSCRIBE is even sent).
func Confirmed(c *Client) int { return c.hub.Confirmed() }

// WithPollInterval sets the longest pause between a waiter's polls (500ms
// by default; at least 1ms).
func WithPollInterval(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.problem("WithPollInterval(%v): must be at least 1ms", d)
			return
		}
		c.pollInterval = d
	}
}

// NoPolling makes c's waiters rely on pub/sub alone (and the owner's lease
// end): their first poll is an hour away.
func NoPolling(c *Client) { c.firstPoll = time.Hour }

// ScriptSource is the full source of the named script ("claim",
// "complete", "release", "renew", "status", "step", "stepcheck") as sent to Redis,
// helpers included.
func ScriptSource(name string) string { return scriptByName(name).Src }

// ScriptSHA is the SHA-1 that EVALSHA sends for the named script.
func ScriptSHA(name string) string { return scriptByName(name).Hash() }

func scriptByName(name string) pipeline.Script {
	switch name {
	case "claim":
		return claimScript
	case "complete":
		return completeScript
	case "release":
		return releaseScript
	case "renew":
		return renewScript
	case "status":
		return statusScript
	case "step":
		return stepScript
	case "stepcheck":
		return stepCheckScript
	}
	panic("no script " + name)
}

// ClaimReply is a decoded reply of lua/claim.lua, for TestClaimResult.
type ClaimReply struct {
	Kind      byte
	N         int64
	LeaseLeft time.Duration
	Payload   string
}

// ClaimResult decodes a reply of lua/claim.lua (see claimResult).
func ClaimResult(v any, fp string, lease time.Duration) (ClaimReply, error) {
	r, err := claimResult(v, fp, lease, 0)
	return ClaimReply{byte(r.kind), r.n, r.leaseLeft, r.payload}, err
}

// NewKeyArgs returns the arguments that c sends with the claim and with
// the completion of a new key, called with fingerprint fp, whose fn
// returns res, for owner token token: for BenchmarkScripts, which sends
// them itself.
func NewKeyArgs(c *Client, fp, token string, res []byte) (claim, complete []any) {
	d := digest(fp)
	first := c.claimRecord(d, token, 1)
	record, _ := finishedRecord(recordDone, d, token, 1, res) // not freed: garbage-collected
	return []any{first, c.retentionMs},
		[]any{first, record, c.retentionMs, c.publish}
}

// HasFollower reports whether a call waits for the in-process flight of
// key (the flight's ready channel is made when its first follower comes).
func HasFollower(c *Client, key string) bool {
	c.flights.mu.Lock()
	defer c.flights.mu.Unlock()
	fl := c.flights.m[key]
	return fl != nil && fl.ready != nil
}

// Queued is the number of script runs waiting for a pipeline in c's
// batcher (not on a cluster).
func Queued(c *Client) int { return c.scripts.Queued() }

// SetSlowPipeline sets how long a pipeline of c's may be in flight before
// it stops holding its place (50ms): tests that hold a pipeline and need
// the calls behind it to stay queued set it long. Set it before c sends.
func SetSlowPipeline(c *Client, d time.Duration) { c.scripts.SetSlow(d) }

// WithPolicyCheckEvery sets how often the Client checks maxmemory-policy
// again (a minute otherwise).
func WithPolicyCheckEvery(d time.Duration) Option {
	return func(c *config) { c.policyEvery = d }
}

// TombstoneCompletion returns what c sends to finish key's attempt 1 as
// owner token, with result res, when c leaves tombstones: the claim record
// to store first (as claim.lua would), and the keys and arguments of
// lua/complete.lua. For TestTombstoneMemory, which sends many at once.
func TombstoneCompletion(c *Client, key, fp, token string, res []byte) (claimed []byte, keys []string, args []any) {
	d := digest(fp)
	claimed = c.claimRecord(d, token, 1)
	record, _ := finishedRecord(recordDone, d, token, 1, res)
	ks := c.keys(key)
	return claimed, []string{ks[0], ks[1], c.tomb.base(c.cfg.prefix, ks[0])},
		[]any{claimed, record, c.retentionMs, c.publish, tombstoneField(ks[0]), c.tomb.span, c.tomb.window}
}

// PendingKey is the key of the index bucket that holds key's entry while
// its registered operation is unfinished.
func PendingKey(c *Client, key string) string { return c.pendingKey(c.recordKey(key)) }

// PendingBuckets is the keys of every bucket of c's index.
func PendingBuckets(c *Client) []string {
	ks := make([]string, c.buckets())
	for b := range ks {
		ks[b] = c.bucketKey(b)
	}
	return ks
}

// LeaseDeadline is the owner's lease deadline as fn's context ctx holds
// it (every renewal moves it); ok is false for a context that is not fn's.
func LeaseDeadline(ctx context.Context) (deadline time.Time, ok bool) {
	c, ok := ctx.(*attemptCtx)
	if !ok {
		return time.Time{}, false
	}
	return monoBase.Add(time.Duration(c.deadline.Load())), true
}
