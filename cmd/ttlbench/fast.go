package main

import (
	"context"
	"strconv"
	"time"
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
func newRecordSizes(retention time.Duration, opts Options) recordSizes {
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
func (s recordSizes) of(p *Plan, op int32, i int32, finished bool) int64 {
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
// it. progress, when not nil, is incremented as requests are replayed.
func fastPolicy(ctx context.Context, plan *Plan, retention time.Duration, opts Options) (Result, error) {
	res := Result{
		Retention:   retention,
		Operations:  plan.Ops(),
		Requests:    plan.Len(),
		Retries:     plan.Len() - plan.Ops(),
		BytesMethod: bytesPayload,
	}
	sizes := newRecordSizes(retention, opts)
	R := int64(retention)
	at := plan.At
	ops := plan.Op
	fps := plan.FP

	// state[op] is op's record: 0 none; > 0 finished, expiring at that
	// time; < 0 in progress until minus that time. A live record is never
	// at time 0: it expires at least a millisecond after it was written,
	// and an fn with a duration ends after it started.
	state := make([]int64, plan.Ops())
	// holder[op] is the request whose claim wrote op's record: its
	// fingerprint is the record's.
	holder := make([]int32, plan.Ops())
	// expiring holds the requests whose finished records are live, in the
	// order they were recorded, which is the order they expire in: every
	// record is kept for the same retention, and recordings happen in time
	// order.
	var expiring ring
	// running holds the requests whose fn is running (only with durations),
	// by the time their outcome is recorded.
	var running recordingQueue

	var live, runs int64
	var bytes, peakBytes int64
	var peakRecords int64
	note := func() {
		peakRecords = max(peakRecords, live)
		peakBytes = max(peakBytes, bytes)
	}
	expireUntil := func(t int64) {
		for expiring.len() > 0 {
			i := expiring.front()
			op := ops[i]
			if state[op] > t {
				return
			}
			expiring.pop()
			state[op] = 0
			live--
			bytes -= sizes.of(plan, op, i, true)
		}
	}
	record := func(i int32, t int64) {
		op := ops[i]
		state[op] = t + R
		expiring.push(i)
	}
	finish := func(i int32, t int64) {
		expireUntil(t)
		record(i, t)
		op := ops[i]
		bytes += sizes.of(plan, op, i, true) - sizes.of(plan, op, i, false)
		note()
	}

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
		for running.len() > 0 && running.next() <= t {
			j, done := running.pop()
			finish(j, done)
		}
		expireUntil(t)

		op := ops[i]
		switch s := state[op]; {
		case s == 0:
			runs++
			live++
			holder[op] = i
			if d := plan.duration(int(i)); d > 0 {
				state[op] = -(t + int64(d))
				running.push(i, t+int64(d))
				bytes += sizes.of(plan, op, i, false)
			} else {
				record(i, t)
				bytes += sizes.of(plan, op, i, true)
			}
		case fps[i] != 0 && fps[holder[op]] != 0 && fps[i] != fps[holder[op]]:
			res.Conflicts++
		case s < 0:
			res.InProgress++
		default:
			res.Replays++
		}
		note()
	}
	for running.len() > 0 {
		j, done := running.pop()
		finish(j, done)
	}
	if opts.Progress != nil {
		opts.Progress.Add(int64(len(at) % batch))
	}
	res.Duplicates = int(runs) - plan.Ops()
	res.PeakRecords, res.PeakBytes = int(peakRecords), peakBytes
	return res, nil
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
