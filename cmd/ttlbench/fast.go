package main

import (
	"context"
	"strconv"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
)

// The fast engine replays a Plan without Redis: it keeps, for each
// operation, the one record idem would keep for its key, and applies the
// protocol's rules to it as lua/claim.lua and lua/complete.lua do, in the
// same order of events as the real engine (real.go) replays them through
// the library. A property test (TestEnginesAgree) holds the two to the
// same counts on random traces.
//
// The rules, for a request at time t with fingerprint fp:
//   - no record: the request claims the key and runs fn. The claim writes
//     an in-progress record ("p"), whose TTL is the retention; when fn's
//     outcome is recorded (at once, or Dur later) the record becomes a
//     finished one ("d") whose TTL is the retention again, counted from the
//     recording. A record whose TTL ran out is no record: Redis expired it
//     (a record expiring at t is gone for a request at t).
//   - a record whose fingerprint and fp are both set and differ: the
//     request gets ErrConflict, and nothing changes.
//   - a finished record: the request gets the stored result (a replay).
//   - an in-progress record: the request finds the operation in progress
//     (with WithWait, it would wait for the outcome). fn's owner renews its
//     lease while fn runs, so the lease never lapses under it and the
//     record never expires under it.
//
// At equal times, recordings come before requests, and requests keep the
// plan's order. Records change only at requests and recordings, so the
// peaks, taken after each, are exact.

// recordSizes gives the bytes of a record, counted as the real engine
// counts them on miniredis (bytesPayload): its name, <prefix>:{<key>}, and
// its value, "1" st len(fp) fp len(own) own n ":" tail (lua/record.lua),
// where the owner token is 16 bytes, the attempt number is 1 (nothing
// ever takes over: fns do not fail and leases do not lapse), the tail of
// an in-progress record is the lease mark, retention - lease in decimal
// milliseconds, and that of a finished record the result.
type recordSizes struct {
	base    int64 // name and value bytes every record has
	pending int64 // tail of an in-progress record
	done    int64 // tail of a finished record
}

// newRecordSizes returns the sizes for records of the given retention.
func newRecordSizes(retention time.Duration, opts options) recordSizes {
	const value = 2 + 1 + 1 + 16 + 1 + 1 // "1" st, len(fp), len(own), own, "1", ":"
	mark := retention.Milliseconds() - opts.Lease.Milliseconds()
	return recordSizes{
		base:    int64(len(recordPrefix)+3) + value,
		pending: int64(len(strconv.FormatInt(mark, 10))),
		done:    int64(opts.ResultSize),
	}
}

// of returns the bytes of op's record, finished or not, holding request
// i's fingerprint (a 16-byte digest, or nothing).
func (s recordSizes) of(p *traffic.Plan, op int32, i int32, finished bool) int64 {
	n := s.base + int64(p.KeyLen[op])
	if p.FP[i] != 0 {
		n += 16
	}
	if finished {
		return n + s.done
	}
	return n + s.pending
}

// fastPolicy replays plan with one retention and returns what it made of
// it. opts.Progress, when not nil, is incremented as requests are replayed.
func fastPolicy(ctx context.Context, plan *traffic.Plan, retention time.Duration, opts options) (policyResult, error) {
	return fastPair(ctx, plan, retention, 0, opts, nil)
}

// fastPair replays plan with one retention and, when tombstones > 0,
// tombstones kept that long past it (idem.WithTombstones; see
// tombstones.go), and returns what it made of it. With late not nil, it
// appends the gap of every request refused as a late retry: the time from
// the recording of its key's last run, in nanoseconds.
func fastPair(ctx context.Context, plan *traffic.Plan, retention, tombstones time.Duration, opts options, late *[]int64) (policyResult, error) {
	res := policyResult{
		Retention:   retention,
		Tombstones:  tombstones,
		Operations:  plan.Ops(),
		Requests:    plan.Len(),
		Retries:     plan.Len() - plan.Ops(),
		BytesMethod: bytesPayload,
	}
	sw := &sweep{
		plan:   plan,
		sizes:  newRecordSizes(retention, opts),
		r:      int64(retention),
		state:  make([]int64, plan.Ops()),
		holder: make([]int32, plan.Ops()),
	}
	if tombstones > 0 {
		sw.tomb = newTombRule(plan.Start, retention+tombstones)
		sw.tombEnd = make([]int64, plan.Ops())
		sw.recorded = make([]int64, plan.Ops())
		sw.tombBytes = int64(opts.TombstoneBytes)
	}
	at, ops, fps := plan.At, plan.Op, plan.FP
	const batch = 1 << 14
	for i := range int32(len(at)) {
		if i%batch == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if opts.Progress != nil && i > 0 {
				opts.Progress.Add(batch)
			}
		}
		t := int64(at[i])
		for sw.running.len() > 0 && sw.running.next() <= t {
			sw.finish(sw.running.pop())
		}
		sw.expireUntil(t)

		op := ops[i]
		switch s := sw.state[op]; {
		case s == 0 && (sw.tombEnd == nil || sw.tombEnd[op] <= t):
			sw.claim(i, t)
		case fps[i] != 0 && fps[sw.holder[op]] != 0 && fps[i] != fps[sw.holder[op]]:
			res.Conflicts++
		case s == 0:
			// No record, but a tombstone: a late retry, refused.
			res.LateRetries++
			if late != nil {
				*late = append(*late, t-sw.recorded[op])
			}
		case s < 0:
			res.InProgress++
		default:
			res.Replays++
		}
		sw.note()
	}
	for sw.running.len() > 0 {
		sw.finish(sw.running.pop())
	}
	if opts.Progress != nil {
		opts.Progress.Add(int64(len(at) % batch))
	}
	res.Duplicates = int(sw.runs) - plan.Ops()
	res.PeakRecords, res.PeakBytes = int(sw.peakRecords), sw.peakBytes
	res.PeakTombstones = int(sw.peakTombs)
	return res, nil
}

// A sweep is the state of one replay by the fast engine.
type sweep struct {
	plan  *traffic.Plan
	sizes recordSizes
	r     int64 // the retention, in nanoseconds

	// state[op] is op's record: 0 none; > 0 finished, expiring at that
	// time; < 0 in progress until minus that time. A live record is never
	// at time 0: it expires at least a millisecond after it was written,
	// and an fn with a duration ends after it started.
	state []int64
	// holder[op] is the request whose claim wrote op's record: its
	// fingerprint is the record's.
	holder []int32
	// expiring holds the requests whose finished records are live, in the
	// order they were recorded, which is the order they expire in: every
	// record is kept for the same retention, and recordings happen in time
	// order.
	expiring ring
	// running holds the requests whose fn is running (only with
	// durations), by the time their outcome is recorded.
	running recordingQueue

	runs, live, peakRecords int64
	bytes, peakBytes        int64

	// With tombstones only (tombEnd nil without): tomb is the rule of
	// their lifetimes; tombEnd[op] is when op's tombstone stops being
	// found (0: it has none), recorded[op] when its last run's outcome was
	// recorded; tombs holds the operations whose tombstones are live, in
	// the order they end, which is the order they were written in (see
	// tombRule.end). A key has at most one live tombstone: it runs again
	// only once its tombstone is gone.
	tomb              tombRule
	tombEnd, recorded []int64
	tombs             ring
	tombBytes         int64 // bytes a tombstone is counted for
	tombLive          int64
	peakTombs         int64
}

// claim runs fn for request i at time t: a new record, finished at once or
// when fn ends.
func (sw *sweep) claim(i int32, t int64) {
	op := sw.plan.Op[i]
	sw.runs++
	sw.live++
	sw.holder[op] = i
	if d := sw.plan.Duration(int(i)); d > 0 {
		sw.state[op] = -(t + int64(d))
		sw.running.push(i, t+int64(d))
		sw.bytes += sw.sizes.of(sw.plan, op, i, false)
		return
	}
	sw.state[op] = t + sw.r
	sw.expiring.push(i)
	sw.bytes += sw.sizes.of(sw.plan, op, i, true)
	sw.bury(op, t)
}

// bury leaves op's tombstone, as the recording of its outcome at t does.
func (sw *sweep) bury(op int32, t int64) {
	if sw.tombEnd == nil {
		return
	}
	sw.tombEnd[op], sw.recorded[op] = sw.tomb.end(t), t
	sw.tombs.push(op)
	sw.tombLive++
	sw.bytes += sw.tombBytes
}

// finish records the outcome of request i's fn at time t.
func (sw *sweep) finish(i int32, t int64) {
	sw.expireUntil(t)
	op := sw.plan.Op[i]
	sw.state[op] = t + sw.r
	sw.expiring.push(i)
	sw.bytes += sw.sizes.of(sw.plan, op, i, true) - sw.sizes.of(sw.plan, op, i, false)
	sw.bury(op, t)
	sw.note()
}

// expireUntil removes the records and tombstones whose time is up at t.
func (sw *sweep) expireUntil(t int64) {
	for sw.tombs.len() > 0 && sw.tombEnd[sw.tombs.front()] <= t {
		sw.tombs.pop()
		sw.tombLive--
		sw.bytes -= sw.tombBytes
	}
	for sw.expiring.len() > 0 {
		i := sw.expiring.front()
		op := sw.plan.Op[i]
		if sw.state[op] > t {
			return
		}
		sw.expiring.pop()
		sw.state[op] = 0
		sw.live--
		sw.bytes -= sw.sizes.of(sw.plan, op, i, true)
	}
}

// note updates the peaks after an event.
func (sw *sweep) note() {
	sw.peakRecords = max(sw.peakRecords, sw.live)
	sw.peakBytes = max(sw.peakBytes, sw.bytes)
	sw.peakTombs = max(sw.peakTombs, sw.tombLive)
}

// ring is a FIFO queue of request indexes.
type ring struct {
	buf        []int32
	head, size int
}

func (r *ring) len() int     { return r.size }
func (r *ring) front() int32 { return r.buf[r.head] }

func (r *ring) pop() {
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.size--
}

func (r *ring) push(i int32) {
	if r.size == len(r.buf) {
		r.grow()
	}
	k := r.head + r.size
	if k >= len(r.buf) {
		k -= len(r.buf)
	}
	r.buf[k] = i
	r.size++
}

func (r *ring) grow() {
	n := make([]int32, max(1024, len(r.buf)+len(r.buf)/2))
	k := copy(n, r.buf[r.head:])
	copy(n[k:], r.buf[:r.head])
	r.buf, r.head = n, 0
}

// recordingQueue is a min-heap of running fns by the time their outcome is
// recorded, ties in the order they started.
type recordingQueue struct{ h []recording }

// recording is an fn that ends at time at (nanoseconds from the start).
type recording struct {
	at int64
	i  int32
}

func (q *recordingQueue) len() int    { return len(q.h) }
func (q *recordingQueue) next() int64 { return q.h[0].at }

func (q *recordingQueue) less(a, b int) bool {
	x, y := q.h[a], q.h[b]
	return x.at < y.at || x.at == y.at && x.i < y.i
}

func (q *recordingQueue) push(i int32, at int64) {
	q.h = append(q.h, recording{at, i})
	for k := len(q.h) - 1; k > 0; {
		parent := (k - 1) / 2
		if !q.less(k, parent) {
			break
		}
		q.h[k], q.h[parent] = q.h[parent], q.h[k]
		k = parent
	}
}

// pop removes the earliest recording and returns its request and time.
func (q *recordingQueue) pop() (int32, int64) {
	top := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h = q.h[:last]
	for k := 0; ; {
		l, r, m := 2*k+1, 2*k+2, k
		if l < len(q.h) && q.less(l, m) {
			m = l
		}
		if r < len(q.h) && q.less(r, m) {
			m = r
		}
		if m == k {
			break
		}
		q.h[k], q.h[m] = q.h[m], q.h[k]
		k = m
	}
	return top.i, top.at
}
