package main

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// options say how a Plan is replayed.
type options struct {
	// Policies are the retentions to compare, each in a run of its own.
	Policies []time.Duration
	// Lease is passed to WithLease; it must not exceed any policy.
	Lease time.Duration
	// ResultSize is the size in bytes of fn's result, which is stored.
	ResultSize int
	// Engine is engineFast (the protocol's rules, applied in Go) or
	// engineReal (the library, on miniredis or Redis).
	Engine string
	// Redis is the address of a real Redis (with engineReal); empty means
	// an embedded miniredis on a virtual clock.
	Redis string
	// TimeScale is how many times faster than virtual time a real Redis
	// runs (at least 1).
	TimeScale float64
	// TombstoneBytes is the memory a tombstone is counted for (see
	// tombstones.go).
	TombstoneBytes int
	// Progress, when not nil, is incremented as requests are replayed.
	Progress *atomic.Int64
}

// The engines.
const (
	engineFast = "fast" // fast.go
	engineReal = "real" // this file
)

// policyResult is what one retention policy made of a Plan.
type policyResult struct {
	Retention time.Duration
	// Tombstones is how long tombstones were kept past the retention
	// (idem.WithTombstones; fast engine only); 0: none.
	Tombstones time.Duration
	// Operations and Requests count the plan's operations and Do calls;
	// Retries are the requests after an operation's first.
	Operations, Requests, Retries int
	// Replays are requests answered from a stored record without running
	// fn; Conflicts are requests refused with ErrConflict (a key reused
	// with another fingerprint); InProgress are requests that found the
	// operation's fn still running (with WithWait they wait for it).
	Replays, Conflicts, InProgress int
	// Duplicates counts the runs of fn beyond the first for an operation.
	Duplicates int
	// LateRetries are requests that found no record but a tombstone, and
	// were refused with ErrLateRetry (with Tombstones only).
	LateRetries int
	// PeakRecords and PeakBytes are the most records alive at once and the
	// most bytes they held at once (see BytesMethod).
	PeakRecords int
	PeakBytes   int64
	// PeakTombstones is the most tombstones alive at once; PeakBytes
	// counts them at options.TombstoneBytes each.
	PeakTombstones int
	// BytesMethod says how bytes were measured.
	BytesMethod string
}

// DuplicateRate is duplicates per operation.
func (r policyResult) DuplicateRate() float64 {
	if r.Operations == 0 {
		return 0
	}
	return float64(r.Duplicates) / float64(r.Operations)
}

// How bytes are counted, by store.
const (
	bytesPayload     = "payload"      // miniredis and the fast engine: key + value
	bytesMemoryUsage = "memory-usage" // Redis: MEMORY USAGE of each record
)

// simulateReal runs plan once per policy, each on a store of its own, and
// returns the results in the order of policies. The real engine runs all
// policies at once (each waits on its store); the fast engine runs as many
// at once as there are CPUs, each holding 12 bytes per operation.
func simulateReal(parent context.Context, plan *traffic.Plan, policies []time.Duration, opts options) ([]policyResult, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	results := make([]policyResult, len(policies))
	errs := make([]error, len(policies))
	runID := newRunID()
	startAt := time.Now() // virtual time 0 on a real Redis
	workers := len(policies)
	if opts.Engine != engineReal {
		workers = min(workers, runtime.GOMAXPROCS(0))
	}
	slots := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, retention := range policies {
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			var err error
			if opts.Engine == engineReal {
				results[i], err = realPolicy(ctx, plan, retention, opts, runID, i, startAt)
			} else {
				results[i], err = fastPolicy(ctx, plan, retention, opts)
			}
			if err != nil {
				errs[i] = fmt.Errorf("retention %s: %w", units.ShortDuration(retention), err)
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

// realPolicy replays plan through the library with one retention, on a
// store of its own.
func realPolicy(ctx context.Context, plan *traffic.Plan, retention time.Duration, opts options, runID string, n int, startAt time.Time) (policyResult, error) {
	tap := &keyTap{}
	var st store
	var err error
	if opts.Redis == "" {
		st, err = newMemStore(plan.Start, tap)
	} else {
		st, err = newRedisStore(ctx, opts.Redis, runID, n, startAt, opts.TimeScale, tap)
	}
	if err != nil {
		return policyResult{}, err
	}
	res, err := runPolicy(ctx, plan, retention, opts, st, tap)
	return res, errors.Join(err, st.close())
}

// A flight is a request whose fn runs for a while (Plan.Dur): its Do call
// runs in a goroutine of its own, and fn waits for the replay to reach the
// time its outcome is recorded.
type flight struct {
	i       int32         // the request
	release chan struct{} // closed to let fn return
	done    chan error    // Do's error, once it returned
}

// runPolicy replays plan through a Client with the given retention, one
// event at a time in virtual-time order: each request, and each recording
// of an outcome of an fn that runs for a while, which comes before the
// requests of its time (see fast.go for the order of events).
func runPolicy(ctx context.Context, plan *traffic.Plan, retention time.Duration, opts options, st store, tap *keyTap) (policyResult, error) {
	res := policyResult{
		Retention:   retention,
		Operations:  plan.Ops(),
		Requests:    plan.Len(),
		Retries:     plan.Len() - plan.Ops(),
		BytesMethod: bytesPayload,
	}
	if opts.Redis != "" {
		res.BytesMethod = bytesMemoryUsage
	}
	if plan.Keys == nil {
		return res, errors.New("internal error: the real engine needs the plan's keys")
	}

	scale := st.scale()
	var (
		// mu guards recs and now, which the tap reads from the goroutines
		// of Do calls (and of the library's lease renewals).
		mu     sync.Mutex
		recs   = newRecords()
		now    time.Duration
		runs   = make([]int32, plan.Ops()) // the ledger: how often fn ran, by operation
		result = make([]byte, opts.ResultSize)
		queue  recordingQueue // flights by the time their outcome is recorded
		flying = map[int32]*flight{}
	)
	tap.before = func(key string) {
		mu.Lock()
		defer mu.Unlock()
		if r, ok := recs.live[key]; ok {
			st.refresh(key, time.Duration(float64(r.expires-now)/scale))
		}
	}
	c := idem.New(st.client(),
		idem.WithPrefix(st.prefix()),
		idem.WithRetention(scaled(retention, scale)),
		idem.WithLease(scaled(opts.Lease, scale)),
		// A request that finds fn running gets ErrInProgress at once: it
		// must not block on the wall clock.
		idem.WithWait(0),
		idem.WithMaxKeyLen(maxKeyLen),
		idem.WithMaxResultSize(max(opts.ResultSize, 1)),
		idem.WithLogger(nil), // the report is the output; miniredis cannot tell its eviction policy
	)
	defer c.Close()
	defer func() {
		// An error left flights running: let them end.
		for _, f := range flying {
			close(f.release)
			<-f.done
		}
	}()

	// advance moves the store and the tracked records to virtual time at.
	advance := func(at time.Duration) error {
		mu.Lock()
		now = at
		mu.Unlock()
		if err := st.wait(ctx, at); err != nil {
			return err
		}
		mu.Lock()
		recs.expireUntil(at, st.expire)
		mu.Unlock()
		return nil
	}
	// settle reads what the event's scripts wrote and notes the peaks.
	settle := func(what string) error {
		for _, k := range tap.take() {
			ttl, size, ok, err := st.inspect(ctx, k)
			mu.Lock()
			switch {
			case err != nil:
			case !ok:
				recs.remove(k)
			case ttl <= 0:
				err = fmt.Errorf("%s: idem left record %q without a TTL", what, k)
			default:
				recs.set(k, now+time.Duration(float64(ttl)*scale), size)
			}
			mu.Unlock()
			if err != nil {
				return err
			}
		}
		recs.notePeak()
		return nil
	}
	describe := func(i int32) string {
		return fmt.Sprintf("request %d (key %q at %s)", i+1, plan.Keys[plan.Op[i]], units.ShortDuration(plan.At[i]))
	}
	// land records the outcome of the earliest flight.
	land := func() error {
		i, at := queue.pop()
		f := flying[i]
		delete(flying, i)
		if err := advance(time.Duration(at)); err != nil {
			return err
		}
		close(f.release)
		if err := <-f.done; err != nil {
			return fmt.Errorf("%s: recording its outcome: %w", describe(i), err)
		}
		return settle(describe(i))
	}

	for i := range int32(plan.Len()) {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		at := plan.At[i]
		for queue.len() > 0 && queue.next() <= int64(at) {
			if err := land(); err != nil {
				return res, err
			}
		}
		if err := advance(at); err != nil {
			return res, err
		}

		op := plan.Op[i]
		key := plan.Keys[op]
		before := runs[op]
		fn := func(context.Context) ([]byte, error) {
			runs[op]++
			return fill(result, key), nil
		}
		var out []byte
		var err error
		if d := plan.Duration(int(i)); d > 0 {
			f := &flight{i: i, release: make(chan struct{}), done: make(chan error, 1)}
			started := make(chan struct{})
			slow := func(ctx context.Context) ([]byte, error) {
				close(started)
				<-f.release
				return fn(ctx)
			}
			replied := make(chan struct{})
			go func() {
				var e error
				out, e = c.Do(ctx, key, plan.Fingerprint(int(i)), slow)
				err = e
				close(replied)
				f.done <- e
			}()
			select {
			case <-started: // the claim is ours: fn runs until the recording
				flying[i] = f
				queue.push(i, int64(at+d))
				if err := settle(describe(i)); err != nil {
					return res, err
				}
				if opts.Progress != nil {
					opts.Progress.Add(1)
				}
				continue
			case <-replied:
				<-f.done
			}
		} else {
			// fn's result reuses one buffer: Do has sent it to Redis by the
			// time it returns.
			out, err = c.Do(ctx, key, plan.Fingerprint(int(i)), fn)
		}
		ran := runs[op] > before
		switch {
		case err == nil && ran:
		case err == nil:
			res.Replays++
			if len(out) != len(result) || !bytes.Equal(out, fill(result, key)) {
				return res, fmt.Errorf("%s: replayed a result that is not this operation's", describe(i))
			}
		case errors.Is(err, idem.ErrConflict):
			res.Conflicts++
		case errors.Is(err, idem.ErrInProgress):
			res.InProgress++
		default:
			return res, fmt.Errorf("%s: %w", describe(i), err)
		}
		if err := settle(describe(i)); err != nil {
			return res, err
		}
		if opts.Progress != nil {
			opts.Progress.Add(1)
		}
	}
	for queue.len() > 0 {
		if err := land(); err != nil {
			return res, err
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
