package main

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Options say how a Plan is replayed.
type Options struct {
	// Policies are the retentions to compare, each in a run of its own.
	Policies []time.Duration
	// Lease is passed to WithLease; it must not exceed any policy.
	Lease time.Duration
	// ResultSize is the size in bytes of fn's result, which is stored.
	ResultSize int
	// Redis is the address of a real Redis; empty means an embedded
	// miniredis on a virtual clock.
	Redis string
	// TimeScale is how many times faster than virtual time a real Redis
	// runs (at least 1).
	TimeScale float64
	// Progress, when not nil, is incremented after every request.
	Progress *atomic.Int64
}

// Result is what one retention policy made of a Plan.
type Result struct {
	Retention time.Duration
	// Operations and Requests count the plan's operations and Do calls;
	// Retries are the requests after an operation's first.
	Operations, Requests, Retries int
	// Replays are requests answered from a stored record without running
	// fn; Conflicts are requests refused with ErrConflict (a key reused
	// with another fingerprint).
	Replays, Conflicts int
	// Duplicates counts the runs of fn beyond the first for an operation,
	// from the ledger fn writes to.
	Duplicates int
	// PeakRecords and PeakBytes are the most records alive at once and the
	// most bytes they held at once (see BytesMethod).
	PeakRecords int
	PeakBytes   int64
	// BytesMethod says how bytes were measured.
	BytesMethod string
}

// DuplicateRate is duplicates per operation.
func (r Result) DuplicateRate() float64 {
	if r.Operations == 0 {
		return 0
	}
	return float64(r.Duplicates) / float64(r.Operations)
}

// How bytes are counted, by store.
const (
	bytesPayload     = "payload"      // miniredis: key + field names + values
	bytesMemoryUsage = "memory-usage" // Redis: MEMORY USAGE of each record
)

// Simulate runs plan once per policy, concurrently, each on a store of its
// own, and returns the results in the order of opts.Policies.
func Simulate(parent context.Context, plan *Plan, opts Options) ([]Result, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	results := make([]Result, len(opts.Policies))
	errs := make([]error, len(opts.Policies))
	runID := newRunID()
	startAt := time.Now() // virtual time 0 on a real Redis
	var wg sync.WaitGroup
	for i, retention := range opts.Policies {
		wg.Go(func() {
			tap := &keyTap{}
			var st store
			var err error
			if opts.Redis == "" {
				st, err = newMemStore(plan.Start, tap)
			} else {
				st, err = newRedisStore(ctx, opts.Redis, runID, i, startAt, opts.TimeScale, tap)
			}
			if err == nil {
				results[i], err = runPolicy(ctx, plan, retention, opts, st, tap)
				err = errors.Join(err, st.close())
			}
			if err != nil {
				errs[i] = fmt.Errorf("retention %s: %w", shortDuration(retention), err)
				cancel() // the others' results are of no use now
			}
		})
	}
	wg.Wait()
	if err := parent.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	// Report the first policy's own error, not the cancellations it caused
	// in the others.
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return results, nil
}

// runPolicy replays plan through a Client with the given retention, one
// request at a time in virtual-time order.
func runPolicy(ctx context.Context, plan *Plan, retention time.Duration, opts Options, st store, tap *keyTap) (Result, error) {
	res := Result{
		Retention:   retention,
		Operations:  len(plan.Keys),
		Requests:    len(plan.Events),
		Retries:     len(plan.Events) - len(plan.Keys),
		BytesMethod: bytesPayload,
	}
	if opts.Redis != "" {
		res.BytesMethod = bytesMemoryUsage
	}

	scale := st.scale()
	var (
		recs   = newRecords()
		now    time.Duration
		runs   = make([]int32, len(plan.Keys)) // the ledger: how often fn ran, by operation
		result = make([]byte, opts.ResultSize)
	)
	// Set before New starts the Client's background work.
	tap.before = func(key string) {
		if r, ok := recs.live[key]; ok {
			st.refresh(key, time.Duration(float64(r.expires-now)/scale))
		}
	}
	c := idem.New(st.client(),
		idem.WithPrefix(st.prefix()),
		idem.WithRetention(scaled(retention, scale)),
		idem.WithLease(scaled(opts.Lease, scale)),
		// fn is instant and requests are sequential: nothing should wait,
		// and if something did, it must not block on the wall clock.
		idem.WithWait(0),
		idem.WithMaxKeyLen(maxKeyLen),
		idem.WithMaxResultSize(max(opts.ResultSize, 1)),
		idem.WithLogger(nil), // the report is the output; miniredis cannot tell its eviction policy
	)
	defer c.Close()
	for i, ev := range plan.Events {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		now = ev.At
		if err := st.wait(ctx, now); err != nil {
			return res, err
		}
		recs.expireUntil(now, st.expire)

		key := plan.Keys[ev.Op]
		before := runs[ev.Op]
		// fn's result reuses one buffer: Do has sent it to Redis by the time
		// it returns.
		out, err := c.Do(ctx, key, ev.Fingerprint, func(context.Context) ([]byte, error) {
			runs[ev.Op]++
			return fill(result, key), nil
		})
		ran := runs[ev.Op] > before
		switch {
		case err == nil && ran:
		case err == nil:
			res.Replays++
			if len(out) != len(result) || !bytes.Equal(out, fill(result, key)) {
				return res, fmt.Errorf("request %d (key %q at %s): replayed a result that is not this operation's",
					i+1, key, shortDuration(now))
			}
		case errors.Is(err, idem.ErrConflict):
			res.Conflicts++
		default:
			return res, fmt.Errorf("request %d (key %q at %s): %w", i+1, key, shortDuration(now), err)
		}

		for _, k := range tap.take() {
			ttl, size, ok, err := st.inspect(ctx, k)
			switch {
			case err != nil:
				return res, err
			case !ok:
				recs.remove(k)
			case ttl <= 0:
				return res, fmt.Errorf("request %d: idem left record %q without a TTL", i+1, k)
			default:
				recs.set(k, now+time.Duration(float64(ttl)*scale), size)
			}
		}
		recs.notePeak()
		if opts.Progress != nil {
			opts.Progress.Add(1)
		}
	}
	if err := st.check(len(recs.live)); err != nil {
		return res, err
	}
	for _, n := range runs {
		res.Duplicates += int(max(n-1, 0))
	}
	res.PeakRecords, res.PeakBytes = recs.peakRecords, recs.peakBytes
	return res, nil
}

// scaled divides a duration by the time scale, rounded to the millisecond
// the library works in.
func scaled(d time.Duration, scale float64) time.Duration {
	return time.Duration(math.Round(float64(d)/scale/float64(time.Millisecond))) * time.Millisecond
}

// fill makes fn's result: the operation's key, then padding, so that a
// replay can be checked to belong to its operation. It reuses buf.
func fill(buf []byte, key string) []byte {
	n := copy(buf, key)
	for i := n; i < len(buf); i++ {
		buf[i] = '.'
	}
	return buf
}

// records tracks the live records of one run in virtual time: when each
// expires and how big it is, to count them and their bytes after every
// request. Records change only at requests (writes) and at expiries, so
// the peaks taken after each request are exact, not sampled.
type records struct {
	live        map[string]record
	queue       expiryQueue // may hold stale entries for rewritten records
	bytes       int64       // of the live records
	peakRecords int
	peakBytes   int64
}

// record is what records knows of one live record.
type record struct {
	expires time.Duration // virtual time
	bytes   int64
}

// newRecords returns an empty tracker.
func newRecords() *records { return &records{live: make(map[string]record)} }

// set notes that key is live until expires with size bytes.
func (rs *records) set(key string, expires time.Duration, size int64) {
	old, ok := rs.live[key]
	rs.bytes += size - old.bytes
	rs.live[key] = record{expires: expires, bytes: size}
	if !ok || old.expires != expires {
		heap.Push(&rs.queue, expiring{key: key, at: expires})
	}
}

// remove forgets a key that no longer exists.
func (rs *records) remove(key string) {
	if old, ok := rs.live[key]; ok {
		rs.bytes -= old.bytes
		delete(rs.live, key)
	}
}

// expireUntil removes the records whose expiry is at or before now, as
// Redis would have (a TTL counted down to zero has expired), calling drop
// for each.
func (rs *records) expireUntil(now time.Duration, drop func(key string)) {
	for len(rs.queue) > 0 && rs.queue[0].at <= now {
		e := heap.Pop(&rs.queue).(expiring)
		if r, ok := rs.live[e.key]; ok && r.expires == e.at {
			rs.remove(e.key)
			drop(e.key)
		}
	}
}

// notePeak updates the peaks with the live records after a request.
func (rs *records) notePeak() {
	rs.peakRecords = max(rs.peakRecords, len(rs.live))
	rs.peakBytes = max(rs.peakBytes, rs.bytes)
}

// expiring is an entry of the expiry queue: key expires at virtual time at,
// unless it was rewritten since.
type expiring struct {
	key string
	at  time.Duration
}

// expiryQueue is a min-heap of expiries (container/heap).
type expiryQueue []expiring

// Len implements heap.Interface.
func (q expiryQueue) Len() int { return len(q) }

// Less implements heap.Interface: earliest expiry first.
func (q expiryQueue) Less(i, j int) bool { return q[i].at < q[j].at }

// Swap implements heap.Interface.
func (q expiryQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }

// Push implements heap.Interface.
func (q *expiryQueue) Push(x any) { *q = append(*q, x.(expiring)) }

// Pop implements heap.Interface.
func (q *expiryQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}
