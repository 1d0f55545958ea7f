// Package traffic is the traffic ttlbench replays: a Plan of requests in
// time order, generated from a Workload or read from a trace, the same
// for every retention policy it is run against.
package traffic

import (
	"cmp"
	"slices"
	"strconv"
	"time"
)

// Kind says why a request was sent.
type Kind uint8

// The kinds of request.
const (
	// First is an operation's first attempt.
	First Kind = iota
	// Retry is a client's retry after an attempt that timed out, or, in a
	// trace, any later request with a key already seen.
	Retry
	// Late is a late redelivery: a message redelivered, or a client that
	// recovered from an outage and sends its request again.
	Late
)

// A Plan is the traffic that every retention policy is run against: the
// same operations and requests, in time order, so that policies differ
// only in the retention. It holds one entry per request in parallel
// slices, sorted by time (ties keep the order they were generated or read
// in): ten million requests take about 210 MB.
type Plan struct {
	// At is each request's time, counted from Start.
	At []time.Duration
	// Op is each request's operation: an index into KeyLen (and Keys).
	Op []int32
	// FP stands for each request's fingerprint: 0 for none, else a hash of
	// it. Requests with a key agree on their fingerprint exactly when
	// their FP values are equal.
	FP []uint64
	// Dur is how long fn runs when a request runs it, from the claim to the
	// recording of its outcome; nil when every fn is instant.
	Dur []time.Duration
	// Kind says why each request was sent.
	Kind []Kind

	// KeyLen is, by operation, the length of its key as idem escapes it in
	// the record's name (see Client.keys): the key's bytes, plus one for
	// each '\' and '}'.
	KeyLen []uint16
	// Keys holds each operation's key when the plan is to be replayed
	// through the library (-engine real); nil otherwise.
	Keys []string

	// Start is the wall-clock time of At = 0, which the server's clock
	// shows: the library reads time from Redis (record TTLs), not from Go.
	Start time.Time
	// Source describes where the traffic came from, for titles.
	Source string
	// Keyless counts a trace's rows without a key, skipped; KeylessLines
	// holds the first few of their line numbers.
	Keyless      int
	KeylessLines []int
}

// Len returns the number of requests.
func (p *Plan) Len() int { return len(p.At) }

// Ops returns the number of operations (distinct keys).
func (p *Plan) Ops() int { return len(p.KeyLen) }

// Span is the virtual time from the first request to the last.
func (p *Plan) Span() time.Duration {
	if len(p.At) == 0 {
		return 0
	}
	return p.At[len(p.At)-1]
}

// Arrivals is the time from the first operation's arrival to the last's:
// a retention longer than that never reaches a steady state.
func (p *Plan) Arrivals() time.Duration {
	for i := len(p.Kind) - 1; i >= 0; i-- {
		if p.Kind[i] == First {
			return p.At[i]
		}
	}
	return 0
}

// Count returns how many requests of kind k the plan holds.
func (p *Plan) Count(k Kind) int {
	n := 0
	for _, x := range p.Kind {
		if x == k {
			n++
		}
	}
	return n
}

// Duration returns how long fn runs when request i runs it.
func (p *Plan) Duration(i int) time.Duration {
	if p.Dur == nil {
		return 0
	}
	return p.Dur[i]
}

// Fingerprint returns request i's fingerprint as the library is given it:
// empty for none, else a string that is equal for equal FP values.
func (p *Plan) Fingerprint(i int) string {
	if p.FP[i] == 0 {
		return ""
	}
	return strconv.FormatUint(p.FP[i], 16)
}

// EscapedLen returns the length of key in a record's name: idem escapes
// '\' as "\\" and '}' as "\c" (see Client.keys).
func EscapedLen[S string | []byte](key S) int {
	n := len(key)
	for i := range len(key) {
		if key[i] == '\\' || key[i] == '}' {
			n++
		}
	}
	return n
}

// SortByTime sorts the requests by time, keeping their order for equal
// times, and then marks the first request of each operation First and
// the others Retry when relabel is set (a trace knows no other kinds).
func (p *Plan) SortByTime(relabel bool) {
	if !slices.IsSorted(p.At) {
		type entry struct {
			at time.Duration
			i  int32
		}
		perm := make([]entry, len(p.At))
		for i, at := range p.At {
			perm[i] = entry{at, int32(i)}
		}
		slices.SortFunc(perm, func(a, b entry) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return cmp.Compare(a.i, b.i)
		})
		idx := make([]int32, len(perm))
		for i, e := range perm {
			idx[i] = e.i
		}
		perm = nil
		p.At = permute(p.At, idx)
		p.Op = permute(p.Op, idx)
		p.FP = permute(p.FP, idx)
		if p.Dur != nil {
			p.Dur = permute(p.Dur, idx)
		}
		if p.Kind != nil && !relabel {
			p.Kind = permute(p.Kind, idx)
		}
	}
	if relabel {
		if len(p.Kind) != len(p.At) {
			p.Kind = make([]Kind, len(p.At))
		}
		seen := make([]bool, p.Ops())
		for i, op := range p.Op {
			if seen[op] {
				p.Kind[i] = Retry
			} else {
				seen[op], p.Kind[i] = true, First
			}
		}
	}
}

// permute returns s reordered: element i of the result is s[idx[i]].
func permute[T any](s []T, idx []int32) []T {
	out := make([]T, len(s))
	for i, j := range idx {
		out[i] = s[j]
	}
	return out
}
