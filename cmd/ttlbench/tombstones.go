package main

import "time"

// Tombstones (idem.WithTombstones): what is left of a finished record once
// its retention has ended, kept for a while longer so that a late retry is
// refused (ErrLateRetry) instead of running fn again. The fast engine
// models them as lua/tombstone.lua keeps them; TestTombstonesAgree holds
// the model to the library.
//
// The completion of a run at server time c (in milliseconds) writes the
// key's tombstone into the bucket of window i = floor((c + span) / w),
// where span is the retention plus the tombstone time and w the window
// width, max(span/4, 1s); the bucket expires at the end of its window,
// (i+1)w, and a claim finds the tombstone until then. So a tombstone lasts
// at least span after the recording and less than span + w. While the
// record lives, the claim finds the record and never looks.
//
// The memory a tombstone takes is measured, not modelled: 26.8 bytes each
// for 100,000 tombstones on one server, 49.9 with one bucket per cluster
// slot (used_memory; TestTombstoneMemory in the root package).
const (
	tombstoneBytes        = 27
	tombstoneBytesCluster = 50
)

// tombRule gives the end of a tombstone's life, in nanoseconds from the
// plan's start, as idem's Client computes it for a retention and a
// tombstone time (see tombstones in the root package).
type tombRule struct {
	start  int64 // the plan's start, in Unix nanoseconds
	span   int64 // retention + tombstone time, in milliseconds
	window int64 // width of the windows, in milliseconds
}

func newTombRule(start time.Time, span time.Duration) tombRule {
	return tombRule{start: start.UnixNano(), span: span.Milliseconds(), window: max(span/4, time.Second).Milliseconds()}
}

// end returns when the tombstone that a recording at t (nanoseconds from
// the start) leaves stops being found: the end of its bucket's window.
// A claim at a time of end or later does not find it. end never decreases
// with t.
func (r tombRule) end(t int64) int64 {
	c := floorDiv(r.start+t, int64(time.Millisecond)) // the server's TIME, in ms
	i := floorDiv(c+r.span, r.window)
	return (i+1)*r.window*int64(time.Millisecond) - r.start
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
