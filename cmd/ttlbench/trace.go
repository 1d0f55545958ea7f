package main

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxKeyLen is the longest key ttlbench accepts: idem's default
// WithMaxKeyLen, which the simulated Client is given explicitly so that the
// two agree.
const maxKeyLen = 512

// A TraceError is a line of a trace that cannot be read.
type TraceError struct {
	Line int // from 1
	Err  error
}

// Error returns "line N: what is wrong".
func (e *TraceError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap returns the underlying error.
func (e *TraceError) Unwrap() error { return e.Err }

// ReadTrace reads recorded requests, one per line as key,unix_ms or
// key,unix_ms,fingerprint (CSV: a key with a comma or a quote is quoted).
// Lines starting with '#' and blank lines are skipped, as is a header line
// starting with "key,unix_ms". Lines may come in any order: requests are
// sorted by time, keeping file order for equal times. Each request is one
// Do call; the first request with a key is the operation's first attempt,
// every later one a retry.
func ReadTrace(r io.Reader) (*Plan, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1 // checked below, with a clearer message
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true

	type request struct {
		key, fp string
		ms      int64
		line    int
	}
	var reqs []request
	first := true
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, &TraceError{Line: pe.Line, Err: pe.Err}
			}
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		if first && len(rec) >= 2 && strings.EqualFold(strings.TrimSpace(rec[0]), "key") &&
			strings.EqualFold(strings.TrimSpace(rec[1]), "unix_ms") {
			first = false
			continue
		}
		first = false
		bad := func(format string, args ...any) (*Plan, error) {
			return nil, &TraceError{Line: line, Err: fmt.Errorf(format, args...)}
		}
		if len(rec) != 2 && len(rec) != 3 {
			return bad("want key,unix_ms[,fingerprint], got %d fields", len(rec))
		}
		key := rec[0]
		switch {
		case key == "":
			return bad("empty key")
		case len(key) > maxKeyLen:
			return bad("key of %d bytes is longer than idem's limit of %d", len(key), maxKeyLen)
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(rec[1]), 10, 64)
		if err != nil || ms < 0 {
			return bad("unix_ms %q is not a time in milliseconds since 1970", rec[1])
		}
		var fp string
		if len(rec) == 3 {
			fp = strings.TrimSpace(rec[2])
		}
		reqs = append(reqs, request{key: key, fp: fp, ms: ms, line: line})
	}
	if len(reqs) == 0 {
		return nil, errors.New("no requests: want lines key,unix_ms[,fingerprint]")
	}
	slices.SortStableFunc(reqs, func(a, b request) int { return cmp.Compare(a.ms, b.ms) })
	if last := reqs[len(reqs)-1]; last.ms-reqs[0].ms > maxDelay.Milliseconds() {
		return nil, &TraceError{Line: last.line, Err: fmt.Errorf("unix_ms %d is more than %s after the earliest request (line %d)",
			last.ms, shortDuration(maxDelay), reqs[0].line)}
	}

	p := &Plan{Events: make([]Event, len(reqs)), Start: time.UnixMilli(reqs[0].ms).UTC()}
	ops := make(map[string]int32)
	for i, r := range reqs {
		op, seen := ops[r.key]
		kind := Retry
		if !seen {
			op, kind = int32(len(p.Keys)), First
			ops[r.key] = op
			p.Keys = append(p.Keys, r.key)
		}
		p.Events[i] = Event{At: time.Duration(r.ms-reqs[0].ms) * time.Millisecond, Op: op, Kind: kind, Fingerprint: r.fp}
	}
	p.Source = fmt.Sprintf("trace: %d requests for %d keys over %s", len(reqs), len(p.Keys), shortDuration(p.Span()))
	return p, nil
}
