package main

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// headBytes is how much of each record stats reads (GETRANGE): enough for
// the longest header and lease mark (lua/record.lua), never a whole
// result.
const headBytes = 1024

// record is what stats learns of one record.
type record struct {
	key     string // the Redis key
	state   string // see stateNames
	attempt int64
	bytes   int64 // STRLEN
	pttl    int64 // ms; -1 no TTL
}

// The states stats counts.
const (
	stDone       = "done"
	stFailed     = "failed"
	stInProgress = "in progress" // lease live: an owner runs the operation
	stLeaseEnded = "lease ended" // in progress, lease over: the owner is gone; the next call takes over
	stReleased   = "released"    // the last attempt failed transiently
	stParked     = "parked"      // unfinished, a checked step parked (it waits for idemctl resolve), or its recoveries (idemctl retry)
	stUnreadable = "unreadable"  // not a record this version reads
)

var stateOrder = []string{stDone, stFailed, stInProgress, stLeaseEnded, stReleased, stParked, stUnreadable}

// stepParked starts the value of a parked checked step in a record's
// steps hash (<record>:steps; see idem's stepchecked.go).
const stepParked = 'u'

// recoveriesParked is the value of the parked marker of an operation that
// idem.WithMaxRecoveries recoveries did not finish: it waits for idemctl
// retry.
const recoveriesParked = "k"

// parseRecord reads the head of a record (lua/record.lua):
// "1" st len(fp) fp len(own) own n ":" tail, where the tail of "p" and "r"
// records is the lease mark (the PTTL at which the lease ends). whole says
// whether head is the whole record.
func parseRecord(head string, whole bool, pttl int64) (state string, attempt int64) {
	if len(head) < 3 || head[0] != '1' {
		return stUnreadable, 0
	}
	st := head[1]
	p := 3 + int(head[2]) // the owner's length byte
	if p >= len(head) {
		return stUnreadable, 0
	}
	nStart := p + 1 + int(head[p])
	if nStart >= len(head) {
		return stUnreadable, 0
	}
	colon := strings.IndexByte(head[nStart:], ':')
	if colon < 1 || colon > 15 {
		return stUnreadable, 0
	}
	n, err := strconv.ParseInt(head[nStart:nStart+colon], 10, 64)
	if err != nil || n < 1 || head[nStart] == '+' || head[nStart] == '-' {
		return stUnreadable, 0
	}
	tail := head[nStart+colon+1:]
	switch st {
	case 'd':
		return stDone, n
	case 'f':
		return stFailed, n
	case 'p', 'r':
		mark, err := strconv.ParseInt(tail, 10, 64)
		if !whole || err != nil || mark < 0 || len(tail) > 15 {
			return stUnreadable, 0
		}
		if st == 'r' {
			return stReleased, n
		}
		if pttl >= 0 && pttl-mark <= 0 {
			return stLeaseEnded, n
		}
		return stInProgress, n
	}
	return stUnreadable, 0
}

// Bucket bounds: value bytes, and TTLs.
var (
	byteBounds = []int64{128, 256, 512, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}
	ttlBounds  = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}
)

// tally is what stats counts, in memory bounded by -top and -sample
// whatever the keyspace's size.
type tally struct {
	Records      int64            `json:"records"`
	ByState      map[string]int64 `json:"by_state"`
	Retried      int64            `json:"attempts_above_1"`
	MaxAttempt   int64            `json:"max_attempt"`
	Bytes        int64            `json:"value_bytes"`
	MaxBytes     int64            `json:"max_value_bytes"`
	BytesBuckets []bucket         `json:"value_bytes_buckets"`
	NoTTL        int64            `json:"no_ttl"`
	TTLBuckets   []bucket         `json:"ttl_buckets"`
	Memory       memory           `json:"memory"`
	Biggest      []bigRecord      `json:"biggest"`
	Servers      int              `json:"servers"`
	Seconds      float64          `json:"seconds"`
	// Ages are the finished records' (nil with none); Tombstones those
	// under the prefix, with the late retries they refused.
	Ages       *recordAges     `json:"record_ages,omitempty"`
	Tombstones *tombstoneStats `json:"tombstones"`

	bytesCounts []int64
	ttlCounts   []int64
	samples     []int64 // MEMORY USAGE of the sampled records
	top         topN
	ages        ageTally
}

type bucket struct {
	Below string `json:"below"` // "" for the last, open bucket
	Count int64  `json:"count"`
}

type memory struct {
	Sampled int     `json:"sampled"`
	Total   int64   `json:"estimated_total_bytes"`
	Mean    float64 `json:"mean_bytes"`
	P50     int64   `json:"p50_bytes"`
	P99     int64   `json:"p99_bytes"`
	Max     int64   `json:"max_bytes"`
}

type bigRecord struct {
	Key     string `json:"key"`
	State   string `json:"state"`
	Attempt int64  `json:"attempt"`
	Bytes   int64  `json:"value_bytes"`
	TTLms   int64  `json:"ttl_ms"`
}

func newTally(top int) *tally {
	return &tally{
		ByState:     map[string]int64{},
		bytesCounts: make([]int64, len(byteBounds)+1),
		ttlCounts:   make([]int64, len(ttlBounds)+1),
		top:         topN{n: top},
		Tombstones:  &tombstoneStats{LateByDay: map[string]int64{}},
	}
}

func (t *tally) add(r record) {
	t.Records++
	t.ByState[r.state]++
	if r.attempt > 1 {
		t.Retried++
	}
	t.MaxAttempt = max(t.MaxAttempt, r.attempt)
	t.Bytes += r.bytes
	t.MaxBytes = max(t.MaxBytes, r.bytes)
	i, _ := slices.BinarySearch(byteBounds, r.bytes+1)
	t.bytesCounts[i]++
	if r.pttl < 0 {
		t.NoTTL++
	} else {
		i, _ := slices.BinarySearch(ttlBounds, time.Duration(r.pttl)*time.Millisecond+1)
		t.ttlCounts[i]++
	}
	t.top.offer(r)
	if r.state == stDone || r.state == stFailed {
		t.ages.add(r.pttl)
	}
}

// merge adds o's counts to t.
func (t *tally) merge(o *tally) {
	t.Records += o.Records
	for k, v := range o.ByState {
		t.ByState[k] += v
	}
	t.Retried += o.Retried
	t.MaxAttempt = max(t.MaxAttempt, o.MaxAttempt)
	t.Bytes += o.Bytes
	t.MaxBytes = max(t.MaxBytes, o.MaxBytes)
	for i, v := range o.bytesCounts {
		t.bytesCounts[i] += v
	}
	for i, v := range o.ttlCounts {
		t.ttlCounts[i] += v
	}
	t.NoTTL += o.NoTTL
	t.samples = append(t.samples, o.samples...)
	for _, r := range o.top.h {
		t.top.offer(r)
	}
	t.ages.merge(&o.ages)
	t.Tombstones.merge(o.Tombstones)
}

// finish computes the summaries from the counts; retention is the
// Client's (0: unknown).
func (t *tally) finish(retention time.Duration) {
	t.Ages = t.ages.result(retention)
	t.Tombstones.finish()
	for i, n := range t.bytesCounts {
		b := bucket{Count: n}
		if i < len(byteBounds) {
			b.Below = sizeLabel(byteBounds[i])
		}
		t.BytesBuckets = append(t.BytesBuckets, b)
	}
	for i, n := range t.ttlCounts {
		b := bucket{Count: n}
		if i < len(ttlBounds) {
			b.Below = dur(ttlBounds[i])
		}
		t.TTLBuckets = append(t.TTLBuckets, b)
	}
	if m := len(t.samples); m > 0 {
		slices.Sort(t.samples)
		var sum int64
		for _, v := range t.samples {
			sum += v
		}
		t.Memory = memory{
			Sampled: m, Mean: float64(sum) / float64(m),
			P50: t.samples[m/2], P99: t.samples[min(m-1, m*99/100)], Max: t.samples[m-1],
		}
		t.Memory.Total = int64(t.Memory.Mean * float64(t.Records))
	}
	big := slices.Clone(t.top.h)
	slices.SortFunc(big, func(a, b record) int { return int(b.bytes - a.bytes) })
	t.Biggest = nil
	for _, r := range big {
		t.Biggest = append(t.Biggest, bigRecord{Key: r.key, State: r.state, Attempt: r.attempt, Bytes: r.bytes, TTLms: r.pttl})
	}
}

// topN keeps the n biggest records (a min-heap by bytes).
type topN struct {
	n int
	h []record
}

func (t *topN) Len() int           { return len(t.h) }
func (t *topN) Less(i, j int) bool { return t.h[i].bytes < t.h[j].bytes }
func (t *topN) Swap(i, j int)      { t.h[i], t.h[j] = t.h[j], t.h[i] }
func (t *topN) Push(x any)         { t.h = append(t.h, x.(record)) }
func (t *topN) Pop() any {
	r := t.h[len(t.h)-1]
	t.h = t.h[:len(t.h)-1]
	return r
}

func (t *topN) offer(r record) {
	switch {
	case t.n == 0:
	case len(t.h) < t.n:
		heap.Push(t, r)
	case r.bytes > t.h[0].bytes:
		t.h[0] = r
		heap.Fix(t, 0)
	}
}

// stats scans every record under the prefix, on every master of a
// cluster, and reports what it found.
func stats(ctx context.Context, o options, rdb redis.UniversalClient, out *printer, stderr io.Writer) error {
	start := time.Now()
	var scanned atomic.Int64
	stopProgress := progress(stderr, &scanned)
	total := newTally(o.top)
	var mu sync.Mutex
	scan := func(ctx context.Context, node *redis.Client) error {
		t, err := scanNode(ctx, o, node, &scanned)
		if err != nil {
			return fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
		mu.Lock()
		total.merge(t)
		total.Servers++
		mu.Unlock()
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("cannot scan a %T", rdb)
	}
	stopProgress()
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	total.finish(o.retention)
	total.Seconds = time.Since(start).Seconds()
	if out.json {
		return out.object(total)
	}
	printStats(out, o, total)
	return nil
}

// scanNode scans one server: SCAN for the records' keys, then, a batch at
// a time in one pipeline, the head of each record, its length and TTL, and
// MEMORY USAGE of about one record in every DBSIZE/-sample.
func scanNode(ctx context.Context, o options, node *redis.Client, scanned *atomic.Int64) (*tally, error) {
	t := newTally(o.top)
	dbsize, err := node.DBSize(ctx).Result()
	if err != nil {
		return nil, err
	}
	every := int64(1)
	if o.sample == 0 {
		every = 0
	} else if dbsize > int64(o.sample) {
		every = (dbsize + int64(o.sample) - 1) / int64(o.sample)
	}
	// Finished records' TTLs, for their ages: about 10,000 of them.
	t.ages.every = max(1, dbsize/10000)
	match := globEscape(o.prefix) + ":*"
	var (
		cursor    uint64
		seen      int64
		seenTombs int64
	)
	for {
		keys, next, err := node.Scan(ctx, cursor, match, int64(o.batch)).Result()
		if err != nil {
			return nil, err
		}
		recs, buckets, late := sortKeys(o.prefix, keys)
		if len(recs) > 0 {
			if err := readBatch(ctx, node, recs, t, &seen, every); err != nil {
				return nil, err
			}
			scanned.Add(int64(len(recs)))
		}
		if err := readTombstones(ctx, node, buckets, late, t.Tombstones, &seenTombs, every); err != nil {
			return nil, err
		}
		if next == 0 {
			return t, nil
		}
		cursor = next
	}
}

// sortKeys sorts the keys under the prefix: records (<prefix>:{<key>}, but
// not the hashes of steps' checkpoints, <prefix>:{<key>}:steps, the stored
// inputs of registered operations, <prefix>:{<key>}:in, nor the buckets of
// their index, <prefix>:{<tag>}:pending: a record's key ends with its
// '}', as idem escapes the '}' of a key), tombstone buckets and late-retry counts
// (<prefix>:t:{<tag>}..., see lua/tombstone.lua; not the registry of
// their windows, <prefix>:t:{<tag>}:w). Other keys are not idem's.
func sortKeys(prefix string, keys []string) (records, buckets, late []string) {
	rec, tomb := prefix+":{", prefix+":t:{"
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, rec):
			if strings.HasSuffix(k, "}") {
				records = append(records, k)
			}
		case strings.HasPrefix(k, tomb) && isLateKey(k):
			late = append(late, k)
		case strings.HasPrefix(k, tomb) && strings.HasSuffix(k, "}:w"):
		case strings.HasPrefix(k, tomb):
			buckets = append(buckets, k)
		}
	}
	return records, buckets, late
}

func readBatch(ctx context.Context, node *redis.Client, keys []string, t *tally, seen *int64, every int64) error {
	type cmds struct {
		head  *redis.StringCmd
		n     *redis.IntCmd
		pttl  *redis.DurationCmd
		usage *redis.IntCmd
	}
	cs := make([]cmds, len(keys))
	pipe := node.Pipeline()
	for i, k := range keys {
		cs[i].head = pipe.GetRange(ctx, k, 0, headBytes-1)
		cs[i].n = pipe.StrLen(ctx, k)
		cs[i].pttl = pipe.PTTL(ctx, k)
		*seen++
		if every > 0 && *seen%every == 0 {
			cs[i].usage = pipe.MemoryUsage(ctx, k, 0)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	recs := make([]record, 0, len(keys))
	for i, k := range keys {
		c := cs[i]
		pttl := c.pttl.Val()
		if c.pttl.Err() != nil || pttl == -2 {
			continue // gone since SCAN saw it
		}
		r := record{key: k, pttl: -1}
		if pttl >= 0 {
			r.pttl = pttl.Milliseconds()
		}
		head, err := c.head.Result()
		switch {
		case err != nil:
			r.state = stUnreadable // another type than a string
		default:
			r.bytes = c.n.Val()
			r.state, r.attempt = parseRecord(head, r.bytes <= headBytes, r.pttl)
		}
		if c.usage != nil {
			if u, err := c.usage.Result(); err == nil {
				t.samples = append(t.samples, u)
			}
		}
		recs = append(recs, r)
	}
	if err := markParked(ctx, node, recs); err != nil {
		return err
	}
	for _, r := range recs {
		t.add(r)
	}
	return nil
}

// markParked reads the steps of the unfinished records among recs (in
// progress, lease ended, released), in one pipeline, and counts those
// with a parked checked step as parked, and those that their recoveries
// did not finish (idem.WithMaxRecoveries, marked recoveriesParked at
// idem's PARKED field): they run again only once an operator resolves the step
// (idemctl resolve) or retries them (idemctl retry), as Status says.
func markParked(ctx context.Context, node *redis.Client, recs []record) error {
	pipe := node.Pipeline()
	vals := make([]*redis.StringSliceCmd, len(recs))
	for i, r := range recs {
		if r.state == stInProgress || r.state == stLeaseEnded || r.state == stReleased {
			vals[i] = pipe.HVals(ctx, r.key+":steps")
		}
	}
	if pipe.Len() == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	for i, v := range vals {
		if v == nil {
			continue
		}
		for _, s := range v.Val() {
			if len(s) > 0 && (s[0] == stepParked || s == recoveriesParked) {
				recs[i].state = stParked
				break
			}
		}
	}
	return nil
}

// isPerKey reports whether a pipeline's error belongs to one command (a
// key of another type, a key gone), not to the connection.
func isPerKey(err error) bool {
	var re redis.Error
	return errors.Is(err, redis.Nil) || errors.As(err, &re)
}

// globEscape escapes the characters that SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// progress prints a line of progress on w while stats scans, when w is a
// terminal; the returned stop erases it.
func progress(w io.Writer, scanned *atomic.Int64) (stop func()) {
	f, ok := w.(*os.File)
	if !ok {
		return func() {}
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		drawn := false
		for {
			select {
			case <-quit:
				if drawn {
					fmt.Fprint(f, "\r\033[K")
				}
				return
			case <-tick.C:
				n := scanned.Load()
				fmt.Fprintf(f, "\r\033[Kscanned %d records (%.0f/s)", n, float64(n)/time.Since(start).Seconds())
				drawn = true
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

func printStats(out *printer, o options, t *tally) {
	out.printf("%d records under %s:{...} on %d server(s), scanned in %.1fs\n", t.Records, o.prefix, t.Servers, t.Seconds)
	if t.Records == 0 {
		printRetention(out, t)
		return
	}
	out.printf("\nby state:\n")
	for _, s := range stateOrder {
		n := t.ByState[s]
		if n == 0 && (s == stLeaseEnded || s == stParked || s == stUnreadable) {
			continue
		}
		note := ""
		switch s {
		case stInProgress:
			note = "  (an owner holds a live lease)"
		case stLeaseEnded:
			note = "  (in progress, but the owner is gone: the next call takes over)"
		case stReleased:
			note = "  (the last attempt failed; the next call runs again)"
		case stParked:
			note = "  (a checked step's outcome is unknown: it runs again once idemctl resolve settles it; or its recoveries did not finish it: idemctl retry)"
		case stUnreadable:
			note = "  (not a record idem reads: ErrCorrupt for its key)"
		}
		out.printf("  %-14s %10d  %6s%s\n", s, n, pct(n, t.Records), note)
	}
	out.printf("\nattempts above 1: %d (%s), highest attempt %d\n", t.Retried, pct(t.Retried, t.Records), t.MaxAttempt)
	out.printf("\nvalue bytes (STRLEN): %s in all, %s on average, largest %s\n", size(t.Bytes), size(t.Bytes/t.Records), size(t.MaxBytes))
	printBuckets(out, t.BytesBuckets, t.Records)
	if m := t.Memory; m.Sampled > 0 {
		out.printf("\nmemory (MEMORY USAGE of %d of %d records): about %s in all; per record p50 %s, p99 %s, max %s\n",
			m.Sampled, t.Records, size(m.Total), size(m.P50), size(m.P99), size(m.Max))
	}
	out.printf("\nTTL left:\n")
	printBuckets(out, t.TTLBuckets, t.Records)
	if t.NoTTL > 0 {
		out.printf("  %-14s %10d  (idem always sets a TTL: were these changed by hand, or not idem's?)\n", "no TTL", t.NoTTL)
	}
	if len(t.Biggest) > 0 {
		out.printf("\nbiggest records:\n")
		for _, b := range t.Biggest {
			out.printf("  %9s  %-11s attempt %-3d TTL %-9s %q\n", size(b.Bytes), b.State, b.Attempt, dur(time.Duration(b.TTLms)*time.Millisecond), b.Key)
		}
	}
	printRetention(out, t)
}

func printBuckets(out *printer, bs []bucket, total int64) {
	for _, b := range bs {
		label := "below " + b.Below
		if b.Below == "" {
			label = "more"
		}
		out.printf("  %-14s %10d  %6s\n", label, b.Count, pct(b.Count, total))
	}
}

// pct is n's share of total, as "12.3%" ("<0.1%" for a few, never "0.0%").
func pct(n, total int64) string {
	switch {
	case n == 0 || total == 0:
		return "0%"
	case n*1000 < total:
		return "<0.1%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
}

// sizeLabel writes a bucket's bound, a power of two, as "512 B" or "64 KiB".
func sizeLabel(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "none"
	case d > 0 && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Hour:
		h, m := d/time.Hour, (d%time.Hour)/time.Minute
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.Round(time.Second).String()
}
