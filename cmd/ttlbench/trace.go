package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// maxKeyLen is the longest key ttlbench accepts: idem's default
// WithMaxKeyLen, which the simulated Client is given explicitly so that the
// two agree.
const maxKeyLen = 512

// maxLine is the longest line a trace may have.
const maxLine = 1 << 20

// maxKeylessLines is how many line numbers of rows without a key a Plan
// keeps, for the report.
const maxKeylessLines = 5

// A traceError is a line of a trace that cannot be read.
type traceError struct {
	Line int // from 1; 0 when the error is not about one line
	Err  error
}

// Error returns "line N: what is wrong".
func (e *traceError) Error() string {
	if e.Line == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("line %d: %v", e.Line, e.Err)
}

// Unwrap returns the underlying error.
func (e *traceError) Unwrap() error { return e.Err }

// The roles of a trace's columns.
const (
	colKey = iota
	colTime
	colFingerprint
	colDuration
	nCols
)

// colNames are the roles' names, as -columns spells them.
var colNames = [nCols]string{"key", "time", "fingerprint", "duration"}

// headerNames are the column names a header line without -columns may use
// for each role.
var headerNames = [nCols][]string{
	{"key", "idempotency_key"},
	{"time", "unix_ms", "unix_s", "unix_us", "unix_ns", "timestamp", "ts"},
	{"fingerprint", "fp"},
	{"duration", "duration_ms"},
}

// headerHints are parts of the column names that a header may use for
// each role, for a suggestion of -columns.
var headerHints = [nCols][]string{
	{"key"},
	{"time", "_at", "date"},
	{"fingerprint", "sha", "hash", "digest"},
	{"duration", "latency", "elapsed"},
}

// A traceFormat says how to read a trace.
type traceFormat struct {
	// Columns maps roles (key, time, fingerprint, duration) to the names
	// of the header's columns: the first line is then a header, and the
	// named columns are read, the others ignored. Without it, a first line
	// whose first field is "key" is a header (see headerNames), and
	// otherwise the columns are key,time[,fingerprint[,duration]].
	Columns map[string]string
	// TimeUnit is the unit of times given as numbers (Unix time): one of
	// time.Second, Millisecond, Microsecond, Nanosecond. RFC 3339 times
	// carry their own.
	TimeUnit time.Duration
	// KeepKeys keeps each operation's key in the Plan (the real engine
	// needs them; the fast engine only their length).
	KeepKeys bool
	// Strict refuses a row without a key (an empty key field, or "-", as
	// access logs write a missing header); without it such rows are
	// skipped and counted in the Plan (Keyless).
	Strict bool
	// Progress, when not nil, counts the bytes read from the source.
	Progress *atomic.Int64
	// SizeHint, when not 0, is about how many bytes the trace holds,
	// decompressed: the requests' slices are made big enough once, early,
	// rather than grown (and copied) as they fill.
	SizeHint int64
}

// sizeHint returns about how many bytes a trace file holds, decompressed:
// its size, or for a gzip file the size its trailer records (modulo 4 GiB:
// 0, unknown, when that is less than the file's own size).
func sizeHint(f *os.File) int64 {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0
	}
	var b [4]byte
	if _, err := f.ReadAt(b[:2], 0); err != nil || b[0] != 0x1f || b[1] != 0x8b {
		return fi.Size()
	}
	if fi.Size() < 18 {
		return 0
	}
	if _, err := f.ReadAt(b[:], fi.Size()-4); err != nil {
		return 0
	}
	if n := int64(binary.LittleEndian.Uint32(b[:])); n >= fi.Size() {
		return n
	}
	return 0
}

// reserve makes room for about n requests and keys.
func (rd *traceReader) reserve(n int) {
	p := rd.p
	p.At = slices.Grow(p.At, n-len(p.At))
	p.Op = slices.Grow(p.Op, n-len(p.Op))
	p.FP = slices.Grow(p.FP, n-len(p.FP))
	p.KeyLen = slices.Grow(p.KeyLen, n-len(p.KeyLen))
	rd.ops.reserve(n)
}

// parseColumns parses -columns: role=name pairs, comma-separated.
func parseColumns(s string) (map[string]string, error) {
	m := map[string]string{}
	for f := range strings.SplitSeq(s, ",") {
		role, name, ok := strings.Cut(strings.TrimSpace(f), "=")
		role, name = strings.TrimSpace(role), strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("want role=name pairs such as key=idempotency_key,time=ts, got %q", f)
		}
		if !slices.Contains(colNames[:], role) {
			return nil, fmt.Errorf("unknown role %q: the roles are %s", role, strings.Join(colNames[:], ", "))
		}
		if _, dup := m[role]; dup {
			return nil, fmt.Errorf("role %q given twice", role)
		}
		m[role] = name
	}
	if m["key"] == "" || m["time"] == "" {
		return nil, errors.New("must name the key and time columns (key=NAME,time=NAME)")
	}
	return m, nil
}

// parseTimeUnit parses -time-unit.
func parseTimeUnit(s string) (time.Duration, error) {
	switch s {
	case "s":
		return time.Second, nil
	case "ms":
		return time.Millisecond, nil
	case "us", "µs":
		return time.Microsecond, nil
	case "ns":
		return time.Nanosecond, nil
	}
	return 0, fmt.Errorf("unknown unit %q: want s, ms, us or ns", s)
}

// unitName names a time unit as -time-unit spells it.
func unitName(u time.Duration) string {
	switch u {
	case time.Second:
		return "s"
	case time.Microsecond:
		return "us"
	case time.Nanosecond:
		return "ns"
	}
	return "ms"
}

// unitWords names a time unit in words.
func unitWords(u time.Duration) string {
	switch u {
	case time.Second:
		return "seconds"
	case time.Microsecond:
		return "microseconds"
	case time.Nanosecond:
		return "nanoseconds"
	}
	return "milliseconds"
}

// Times outside [earliest, latest) are taken for a wrong -time-unit: a
// Unix time in seconds read as milliseconds falls in January 1970, one in
// microseconds read as milliseconds tens of thousands of years ahead.
var (
	earliest = time.Date(1995, 1, 1, 0, 0, 0, 0, time.UTC)
	latest   = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
)

// parseTrace reads recorded requests, one per line, CSV (a field holding a
// comma or a quote is quoted; a quoted field ends on its line). Blank
// lines and lines starting with '#' are skipped. Each request is one Do
// call; the first request with a key (by time) is the operation's first
// attempt, every later one a retry. Lines may come in any order: requests
// are sorted by time, keeping file order for equal times. Only what the
// engines need is kept, about 21 bytes a request and 22 a key while
// reading (the key is kept as a 96-bit hash, see keyTable, and the
// fingerprint as a 64-bit one), never the lines themselves.
func parseTrace(ctx context.Context, r io.Reader, f traceFormat) (*traffic.Plan, error) {
	if f.TimeUnit == 0 {
		f.TimeUnit = time.Millisecond
	}
	src, err := decompress(r, f.Progress)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	br := bufio.NewReaderSize(src, 1<<20)

	rd := &traceReader{
		f:      f,
		cols:   [nCols]int{0, 1, 2, 3},
		seeds:  [3]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed(), maphash.MakeSeed()},
		p:      &traffic.Plan{},
		minAt:  math.MaxInt64,
		maxAt:  math.MinInt64,
		header: f.Columns != nil,
	}
	var long []byte // a line longer than br's buffer, assembled
	for line := 1; ; line++ {
		if line%(1<<16) == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted: %w", ctx.Err())
		}
		b, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], b...)
			for err == bufio.ErrBufferFull && len(long) <= maxLine {
				b, err = br.ReadSlice('\n')
				long = append(long, b...)
			}
			if len(long) > maxLine {
				return nil, &traceError{Line: line, Err: fmt.Errorf("longer than %d bytes", maxLine)}
			}
			b = long
		}
		if len(b) > 0 {
			if perr := rd.line(line, b); perr != nil {
				return nil, rd.headerHint(line, perr)
			}
			rd.read += int64(len(b))
			if line == 1<<12 && f.SizeHint > 0 && len(rd.p.At) > 0 {
				rd.reserve(int(min(float64(f.SizeHint)/float64(rd.read)*float64(len(rd.p.At))*1.05, math.MaxInt32-1)))
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, &traceError{Line: line, Err: fmt.Errorf("read: %w", err)}
		}
	}
	return rd.plan()
}

// decompress returns r, or what it decompresses to when it starts as a
// gzip stream does. Decompression runs in a goroutine of its own, ahead of
// the parser, so that the two share the work of a big file.
func decompress(r io.Reader, progress *atomic.Int64) (io.ReadCloser, error) {
	if progress != nil {
		r = &countingReader{r: r, n: progress}
	}
	br := bufio.NewReaderSize(r, 1<<16)
	magic, _ := br.Peek(2)
	if !bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		return io.NopCloser(br), nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, &traceError{Err: fmt.Errorf("gzip: %w", err)}
	}
	return newPrefetcher(zr), nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

// Read reads and counts.
func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// prefetcher reads a source in a goroutine of its own, a few chunks ahead
// of its reader.
type prefetcher struct {
	chunks chan []byte
	free   chan []byte
	stop   chan struct{}
	done   chan struct{}
	err    error // set before chunks is closed
	cur    []byte
	buf    []byte // the chunk cur is in
}

// newPrefetcher starts reading r.
func newPrefetcher(r io.Reader) *prefetcher {
	const n, size = 4, 1 << 20
	p := &prefetcher{
		chunks: make(chan []byte, n),
		free:   make(chan []byte, n),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for range n {
		p.free <- make([]byte, size)
	}
	go func() {
		defer close(p.done)
		defer close(p.chunks)
		for {
			var b []byte
			select {
			case b = <-p.free:
			case <-p.stop:
				return
			}
			k, err := io.ReadFull(r, b[:cap(b)])
			if k > 0 {
				p.chunks <- b[:k]
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					p.err = err
				}
				return
			}
		}
	}()
	return p
}

// Read copies from the chunks read ahead.
func (p *prefetcher) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		if p.buf != nil {
			p.free <- p.buf[:cap(p.buf)]
			p.buf = nil
		}
		c, ok := <-p.chunks
		if !ok {
			if p.err != nil {
				return 0, fmt.Errorf("gzip: %w", p.err)
			}
			return 0, io.EOF
		}
		p.cur, p.buf = c, c
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

// Close stops the goroutine and waits for it.
func (p *prefetcher) Close() error {
	close(p.stop)
	for range p.chunks { // unblock a send
	}
	<-p.done
	return nil
}

// traceReader holds what parseTrace has read so far.
type traceReader struct {
	f          traceFormat
	header     bool       // the next data line is the header
	cols       [nCols]int // the column of each role; -1 when absent
	width      int        // fields in the header, when there is one
	headerLine int
	fields     [][]byte // scratch: the fields of a line
	unq        []byte   // scratch: unquoted fields

	ops   keyTable        // operation by key hash
	seeds [3]maphash.Seed // key hash (two), fingerprint hash
	p     *traffic.Plan

	read             int64    // bytes of the lines read
	firstLine        int      // the first data line, when it was not read as a header
	firstFields      []string // its fields
	minAt, maxAt     int64    // Unix ns
	minLine, maxLine int
	first            bool // a data line was read
}

// line reads one line of the trace.
func (rd *traceReader) line(n int, b []byte) error {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	if len(b) == 0 || b[0] == '#' || isSpace(b[0]) {
		// Blank, a comment, or a line that starts with spaces: look again.
		t := bytes.TrimLeftFunc(b, unicode.IsSpace)
		if len(t) == 0 || t[0] == '#' {
			return nil
		}
	}
	bad := func(format string, args ...any) error {
		return &traceError{Line: n, Err: fmt.Errorf(format, args...)}
	}
	fields, err := rd.split(b)
	if err != nil {
		return bad("%v", err)
	}
	if !rd.first {
		rd.first = true
		if rd.header || strings.EqualFold(string(bytes.TrimSpace(fields[0])), "key") {
			return rd.readHeader(n, fields)
		}
		rd.firstLine = n
		for _, f := range fields {
			rd.firstFields = append(rd.firstFields, strings.TrimSpace(string(f)))
		}
	}
	want := 2
	for _, c := range rd.cols[:colTime+1] {
		want = max(want, c+1)
	}
	if len(fields) < want || (rd.width == 0 && len(fields) > nCols) {
		if rd.width == 0 {
			return bad("want key,time[,fingerprint[,duration]], got %d fields", len(fields))
		}
		return bad("want the %d fields of the header (line %d), got %d", rd.width, rd.headerLine, len(fields))
	}
	field := func(role int) []byte {
		if c := rd.cols[role]; c >= 0 && c < len(fields) {
			return fields[c]
		}
		return nil
	}

	key := field(colKey)
	if t := trimSpace(key); len(t) == 0 || string(t) == "-" {
		if rd.f.Strict {
			return bad("no key (%q): -strict refuses rows without one; without -strict they are skipped and counted", key)
		}
		rd.p.Keyless++
		if len(rd.p.KeylessLines) < maxKeylessLines {
			rd.p.KeylessLines = append(rd.p.KeylessLines, n)
		}
		return nil
	}
	if len(key) > maxKeyLen {
		return bad("key of %d bytes is longer than idem's limit of %d", len(key), maxKeyLen)
	}
	at, err := rd.parseTime(trimSpace(field(colTime)))
	if err != nil {
		return bad("%v", err)
	}
	var fp uint64
	if v := trimSpace(field(colFingerprint)); len(v) > 0 {
		fp = max(maphash.Bytes(rd.seeds[2], v), 1) // 0 stands for none
	}
	var dur time.Duration
	if v := trimSpace(field(colDuration)); len(v) > 0 {
		if dur, err = parseOpDuration(string(v)); err != nil {
			return bad("%v", err)
		}
	}

	p := rd.p
	if len(p.KeyLen) >= math.MaxInt32-1 {
		return bad("more than %d keys", math.MaxInt32-1)
	}
	op, seen := rd.ops.index(maphash.Bytes(rd.seeds[0], key), uint32(maphash.Bytes(rd.seeds[1], key)))
	if !seen {
		p.KeyLen = append(p.KeyLen, uint16(traffic.EscapedLen(key)))
		if rd.f.KeepKeys {
			p.Keys = append(p.Keys, string(key))
		}
	}
	if at < rd.minAt {
		rd.minAt, rd.minLine = at, n
	}
	if at > rd.maxAt {
		rd.maxAt, rd.maxLine = at, n
	}
	if rd.maxAt-rd.minAt > int64(traffic.MaxDelay) {
		far, near := rd.maxLine, rd.minLine
		if n == rd.minLine {
			far, near = rd.minLine, rd.maxLine
		}
		return &traceError{Line: far, Err: fmt.Errorf("time is more than %s from that of line %d", units.ShortDuration(traffic.MaxDelay), near)}
	}
	if len(p.At) >= math.MaxInt32 {
		return bad("more than %d requests", math.MaxInt32)
	}
	p.At = append(p.At, time.Duration(at))
	p.Op = append(p.Op, op)
	p.FP = append(p.FP, fp)
	if dur > 0 && p.Dur == nil {
		p.Dur = make([]time.Duration, len(p.At)-1, cap(p.At))
	}
	if p.Dur != nil {
		p.Dur = append(p.Dur, dur)
	}
	return nil
}

// headerHint adds to err, the error of line n, a suggestion of -columns
// when n is the first data line and no header was read: a CSV whose
// header does not start with "key" fails there.
func (rd *traceReader) headerHint(n int, err error) error {
	var te *traceError
	if rd.f.Columns != nil || rd.width != 0 || n != rd.firstLine || !errors.As(err, &te) {
		return err
	}
	for _, f := range rd.firstFields {
		if _, terr := time.Parse(time.RFC3339Nano, f); terr == nil || isUnixTime([]byte(f)) {
			return err // a line with a time is data, not a header
		}
	}
	guess := [nCols]string{}
	for role := range nCols {
		for _, f := range rd.firstFields {
			l := strings.ToLower(f)
			if slices.Contains(guess[:], f) {
				continue
			}
			if slices.Contains(headerNames[role], l) || slices.ContainsFunc(headerHints[role], func(h string) bool { return strings.Contains(l, h) }) {
				guess[role] = f
				break
			}
		}
	}
	suggest := "-columns key=NAME,time=NAME"
	if guess[colKey] != "" && guess[colTime] != "" && guess[colKey] != guess[colTime] {
		var pairs []string
		for role, name := range guess {
			if name != "" {
				pairs = append(pairs, colNames[role]+"="+name)
			}
		}
		suggest = "-columns " + strings.Join(pairs, ",")
	}
	return &traceError{Line: te.Line, Err: fmt.Errorf("%w\n  if line %d is a header (%s), name the columns to read: %s",
		te.Err, n, strings.Join(rd.firstFields, ","), suggest)}
}

// readHeader reads the header line: with -columns it must name each
// column given there; without, the columns it names are those of
// headerNames.
func (rd *traceReader) readHeader(n int, fields [][]byte) error {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = strings.TrimSpace(string(f))
	}
	rd.cols = [nCols]int{-1, -1, -1, -1}
	rd.width, rd.headerLine = len(fields), n
	for role := range nCols {
		if rd.f.Columns != nil {
			want, ok := rd.f.Columns[colNames[role]]
			if !ok {
				continue
			}
			i := slices.Index(names, want)
			if i < 0 {
				return &traceError{Line: n, Err: fmt.Errorf("-columns: the header has no column %q for the %s (it has %s)",
					want, colNames[role], strings.Join(names, ", "))}
			}
			rd.cols[role] = i
			continue
		}
		for i, name := range names {
			if slices.Contains(headerNames[role], strings.ToLower(name)) {
				rd.cols[role] = i
				break
			}
		}
	}
	if rd.cols[colKey] < 0 || rd.cols[colTime] < 0 {
		return &traceError{Line: n, Err: fmt.Errorf("the header (%s) names no time column: name it with -columns key=NAME,time=NAME",
			strings.Join(names, ", "))}
	}
	return nil
}

// split cuts a CSV line into fields, leading spaces trimmed, quotes
// removed. The fields are valid until the next call.
func (rd *traceReader) split(b []byte) ([][]byte, error) {
	rd.fields = rd.fields[:0]
	if bytes.IndexByte(b, '"') < 0 {
		for {
			i := bytes.IndexByte(b, ',')
			if i < 0 {
				rd.fields = append(rd.fields, trimLeft(b))
				return rd.fields, nil
			}
			rd.fields = append(rd.fields, trimLeft(b[:i]))
			b = b[i+1:]
		}
	}
	// Quoted fields: unquote into rd.unq, which must not move while the
	// line's fields point into it.
	if cap(rd.unq) < len(b) {
		rd.unq = make([]byte, 0, 2*len(b))
	}
	rd.unq = rd.unq[:0]
	for {
		b = trimLeft(b)
		start := len(rd.unq)
		if len(b) > 0 && b[0] == '"' {
			b = b[1:]
			for {
				i := bytes.IndexByte(b, '"')
				if i < 0 {
					return nil, errors.New(`a quoted field does not end on its line (a field with a line break is not supported)`)
				}
				rd.unq = append(rd.unq, b[:i]...)
				b = b[i+1:]
				if len(b) > 0 && b[0] == '"' {
					rd.unq = append(rd.unq, '"')
					b = b[1:]
					continue
				}
				break
			}
			if len(b) > 0 && b[0] != ',' {
				return nil, fmt.Errorf(`extraneous %q after a quoted field`, b[0])
			}
		} else {
			i := bytes.IndexByte(b, ',')
			if i < 0 {
				i = len(b)
			}
			if bytes.IndexByte(b[:i], '"') >= 0 {
				return nil, errors.New(`bare quote " in a field that is not quoted: quote the field and double the quote ("")`)
			}
			rd.unq = append(rd.unq, b[:i]...)
			b = b[i:]
		}
		rd.fields = append(rd.fields, rd.unq[start:len(rd.unq):len(rd.unq)])
		if len(b) == 0 {
			return rd.fields, nil
		}
		b = b[1:] // the comma
	}
}

// parseTime reads a request's time, a Unix time in -time-unit or RFC 3339,
// as nanoseconds since 1970; a Unix time must fall between 1995 and 2100,
// or the unit is wrong: the error says which unit the number looks like.
func (rd *traceReader) parseTime(b []byte) (int64, error) {
	if isUnixTime(b) {
		ns, ok := parseUnix(b, rd.f.TimeUnit)
		if !ok || ns < earliest.UnixNano() || ns >= latest.UnixNano() {
			return 0, magnitudeError(b, rd.f.TimeUnit)
		}
		return ns, nil
	}
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return 0, fmt.Errorf("time %q is neither a Unix time (a number of %s, -time-unit %s) nor RFC 3339 (2006-01-02T15:04:05.999Z07:00)",
			b, unitWords(rd.f.TimeUnit), unitName(rd.f.TimeUnit))
	}
	if t.Before(earliest) || !t.Before(latest) {
		return 0, fmt.Errorf("time %q is not between %d and %d", b, earliest.Year(), latest.Year())
	}
	return t.UnixNano(), nil
}

// isUnixTime reports whether b looks like a Unix time: digits, perhaps
// with a fraction.
func isUnixTime(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return true
}

// trimLeft drops leading spaces and tabs, as encoding/csv's
// TrimLeadingSpace does for the usual ones.
func trimLeft(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// trimSpace drops spaces and tabs at both ends.
func trimSpace(b []byte) []byte {
	b = trimLeft(b)
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// isSpace reports whether c is ASCII white space.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || c == '\n'
}

// magnitudeError explains a Unix time that, read in unit, is not between
// 1995 and 2100, and names the unit it looks like.
func magnitudeError(b []byte, unit time.Duration) error {
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("time %q is not a number of %s since 1970 (-time-unit %s)", b, unitWords(unit), unitName(unit))
	}
	when := func(u time.Duration) (string, bool) {
		ns := v * float64(u)
		year := 1970 + ns/(365.2425*24*float64(time.Hour))
		switch {
		case ns < float64(earliest.UnixNano()) && ns >= 0:
			return time.Unix(0, int64(ns)).UTC().Format("2006-01-02 15:04:05"), false
		case ns >= float64(latest.UnixNano()):
			return fmt.Sprintf("year %.0f", math.Floor(year)), false
		}
		return "", true
	}
	at, _ := when(unit)
	for _, u := range []time.Duration{time.Second, time.Millisecond, time.Microsecond, time.Nanosecond} {
		if _, ok := when(u); ok && u != unit {
			return fmt.Errorf("time %s read as %s since 1970 (-time-unit %s) is %s: the numbers look like %s: use -time-unit %s",
				b, unitWords(unit), unitName(unit), at, unitWords(u), unitName(u))
		}
	}
	return fmt.Errorf("time %s read as %s since 1970 (-time-unit %s) is %s, and in no unit (s, ms, us, ns) is it between %d and %d: "+
		"a trace's times must be Unix times or RFC 3339 (add an offset to relative times)",
		b, unitWords(unit), unitName(unit), at, earliest.Year(), latest.Year())
}

// parseUnix parses a non-negative decimal number of units (with a
// fraction, down to the nanosecond) as nanoseconds.
func parseUnix(b []byte, unit time.Duration) (int64, bool) {
	intPart, frac, _ := bytes.Cut(b, []byte("."))
	if len(intPart) == 0 || len(intPart) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range intPart {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n > math.MaxInt64/uint64(unit) {
		return 0, false
	}
	ns := int64(n) * int64(unit)
	scale := int64(unit)
	for _, c := range frac {
		if c < '0' || c > '9' {
			return 0, false
		}
		scale /= 10
		ns += int64(c-'0') * scale
	}
	return ns, true
}

// parseOpDuration reads how long fn ran: a Go duration (250ms, 1.5s) or a
// number of milliseconds.
func parseOpDuration(s string) (time.Duration, error) {
	var d time.Duration
	if strings.ContainsAny(s, "hmsuµn") {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("duration %q is neither a Go duration (250ms, 1.5s) nor a number of milliseconds", s)
		}
	} else {
		ns, ok := parseUnix([]byte(s), time.Millisecond)
		if !ok {
			return 0, fmt.Errorf("duration %q is neither a Go duration (250ms, 1.5s) nor a number of milliseconds", s)
		}
		d = time.Duration(ns)
	}
	if d < 0 || d > traffic.MaxDelay {
		return 0, fmt.Errorf("duration %q is not between 0 and %s", s, units.ShortDuration(traffic.MaxDelay))
	}
	return d, nil
}

// lineList formats the first line numbers of n rows: "4, 9, 12" or
// "4, 9, 12, 15, 20, ...".
func lineList(lines []int, n int) string {
	parts := make([]string, len(lines))
	for i, l := range lines {
		parts[i] = strconv.Itoa(l)
	}
	s := strings.Join(parts, ", ")
	if n > len(lines) {
		s += ", ..."
	}
	return s
}

// plan finishes the Plan: times counted from the earliest request, sorted.
func (rd *traceReader) plan() (*traffic.Plan, error) {
	p := rd.p
	rd.ops = keyTable{} // the largest thing held while reading
	if len(p.At) == 0 {
		if p.Keyless > 0 {
			return nil, fmt.Errorf("no requests: all %d rows lack a key (lines %s)", p.Keyless, lineList(p.KeylessLines, p.Keyless))
		}
		return nil, errors.New("no requests: want lines key,time[,fingerprint[,duration]]")
	}
	for i := range p.At {
		p.At[i] -= time.Duration(rd.minAt)
	}
	p.Start = time.Unix(0, rd.minAt).UTC()
	p.SortByTime(true)
	p.Source = fmt.Sprintf("trace: %d requests for %d keys over %s", p.Len(), p.Ops(), roughDuration(p.Span()))
	return p, nil
}
