package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// What stats says of the retention: how old the finished records are, and,
// with idem.WithTombstones, the tombstones and the late retries they
// refused (see lua/tombstone.lua for their keys).

// recordAges are the ages of finished records: the retention less the TTL
// left, how long ago each outcome was recorded.
type recordAges struct {
	RetentionMS int64 `json:"retention_ms"`
	// Inferred is set when the retention was not given (-retention) but
	// taken for the longest TTL left of a finished record.
	Inferred bool  `json:"retention_inferred"`
	Finished int64 `json:"finished"`
	Sampled  int   `json:"sampled"`
	P50MS    int64 `json:"p50_ms"`
	P90MS    int64 `json:"p90_ms"`
	P99MS    int64 `json:"p99_ms"`
	MaxMS    int64 `json:"max_ms"`
}

// ageTally gathers the TTLs left of finished records, in bounded memory.
type ageTally struct {
	finished    int64
	minTTL      int64 // ms; -1 none yet
	maxTTL      int64
	sample      []int64 // TTLs left, ms, of about one finished record in every
	seen, every int64
}

func (a *ageTally) add(pttl int64) {
	if pttl < 0 {
		return
	}
	if a.finished == 0 || pttl < a.minTTL {
		a.minTTL = pttl
	}
	a.maxTTL = max(a.maxTTL, pttl)
	a.finished++
	a.seen++
	if a.seen%max(a.every, 1) == 0 {
		a.sample = append(a.sample, pttl)
	}
}

func (a *ageTally) merge(o *ageTally) {
	if o.finished == 0 {
		return
	}
	if a.finished == 0 || o.minTTL < a.minTTL {
		a.minTTL = o.minTTL
	}
	a.maxTTL = max(a.maxTTL, o.maxTTL)
	a.finished += o.finished
	a.sample = append(a.sample, o.sample...)
}

// result returns the ages for the retention (0: infer it).
func (a *ageTally) result(retention time.Duration) *recordAges {
	if a.finished == 0 {
		return nil
	}
	r := &recordAges{RetentionMS: retention.Milliseconds(), Finished: a.finished, Sampled: len(a.sample)}
	if retention <= 0 {
		// The newest record's TTL left is the retention less its age: a
		// little less than a whole second, as retentions are set.
		r.RetentionMS, r.Inferred = (a.maxTTL+999)/1000*1000, true
	}
	ages := make([]int64, len(a.sample))
	for i, ttl := range a.sample {
		ages[i] = max(r.RetentionMS-ttl, 0)
	}
	slices.Sort(ages)
	q := func(p float64) int64 {
		if len(ages) == 0 {
			return 0
		}
		return ages[min(len(ages)-1, int(p*float64(len(ages))))]
	}
	r.P50MS, r.P90MS, r.P99MS = q(0.5), q(0.9), q(0.99)
	r.MaxMS = max(r.RetentionMS-a.minTTL, 0)
	return r
}

// tombstoneStats are the tombstones under the prefix, and the late retries
// counted beside them.
type tombstoneStats struct {
	Count   int64 `json:"count"` // fields of the buckets, forgotten ones included
	Buckets int64 `json:"buckets"`
	// Bytes estimates their memory: MEMORY USAGE of sampled buckets,
	// scaled to all of them.
	Bytes        int64            `json:"estimated_bytes"`
	LateRetries  int64            `json:"late_retries"`
	LateByDay    map[string]int64 `json:"late_retries_by_day"` // UTC dates
	sampledBytes int64
	sampled      int64
}

func (ts *tombstoneStats) merge(o *tombstoneStats) {
	ts.Count += o.Count
	ts.Buckets += o.Buckets
	ts.sampledBytes += o.sampledBytes
	ts.sampled += o.sampled
	ts.LateRetries += o.LateRetries
	for d, n := range o.LateByDay {
		ts.LateByDay[d] += n
	}
}

func (ts *tombstoneStats) finish() {
	if ts.sampled > 0 {
		ts.Bytes = ts.sampledBytes * ts.Buckets / ts.sampled
	}
}

// isLateKey says whether a key under <prefix>:t:{ is a hash of late-retry
// counts (<prefix>:t:{<tag>}:late) rather than a bucket of tombstones
// (<prefix>:t:{<tag>}:<i>:<k>.<j>).
func isLateKey(key string) bool { return strings.HasSuffix(key, "}:late") }

// readTombstones reads a batch of tombstone buckets (their sizes, and
// MEMORY USAGE of one in every) and late-retry hashes into ts.
func readTombstones(ctx context.Context, node *redis.Client, buckets, late []string, ts *tombstoneStats, seen *int64, every int64) error {
	pipe := node.Pipeline()
	lens := make([]*redis.IntCmd, len(buckets))
	usage := make([]*redis.IntCmd, len(buckets))
	for i, k := range buckets {
		lens[i] = pipe.HLen(ctx, k)
		*seen++
		if every > 0 && *seen%every == 0 {
			usage[i] = pipe.MemoryUsage(ctx, k, 0)
		}
	}
	days := make([]*redis.MapStringStringCmd, len(late))
	for i, k := range late {
		days[i] = pipe.HGetAll(ctx, k)
	}
	if len(buckets)+len(late) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	for i := range buckets {
		n, err := lens[i].Result()
		if err != nil || n == 0 {
			continue // gone, or not a hash
		}
		ts.Count += n
		ts.Buckets++
		if usage[i] != nil {
			if u, err := usage[i].Result(); err == nil {
				ts.sampledBytes += u
				ts.sampled++
			}
		}
	}
	for i := range late {
		m, err := days[i].Result()
		if err != nil {
			continue
		}
		for d, v := range m {
			day, err1 := strconv.ParseInt(d, 10, 64)
			n, err2 := strconv.ParseInt(v, 10, 64)
			if err1 != nil || err2 != nil || n < 0 {
				continue // not claim.lua's
			}
			ts.LateRetries += n
			ts.LateByDay[time.Unix(day*86400, 0).UTC().Format(time.DateOnly)] += n
		}
	}
	return nil
}

// printRetention prints the record ages and the tombstones.
func printRetention(out *printer, t *tally) {
	if a := t.Ages; a != nil {
		ms := func(v int64) string {
			d := time.Duration(v) * time.Millisecond
			if d >= time.Hour {
				return dur(d.Round(time.Minute))
			}
			return dur(d.Round(time.Second))
		}
		how := "(-retention)"
		if a.Inferred {
			how = "(the longest TTL left of a finished record, to the second; give -retention if it is not the Client's)"
		}
		out.printf("\nrecord ages: how long ago the %d finished records were recorded (the retention less the TTL left),\n", a.Finished)
		out.printf("  retention %s %s\n", ms(a.RetentionMS), how)
		out.printf("  from %d of them: p50 %s, p90 %s, p99 %s, max %s\n", a.Sampled, ms(a.P50MS), ms(a.P90MS), ms(a.P99MS), ms(a.MaxMS))
	}
	ts := t.Tombstones
	if ts.Count == 0 && ts.LateRetries == 0 {
		out.printf("\ntombstones: none (idem.WithTombstones is off, or nothing finished since it was set)\n")
		return
	}
	out.printf("\ntombstones (idem.WithTombstones): %d in %d buckets", ts.Count, ts.Buckets)
	if ts.Bytes > 0 && ts.Count > 0 {
		out.printf(", about %s (MEMORY USAGE, %.1f B each)", size(ts.Bytes), float64(ts.Bytes)/float64(ts.Count))
	}
	out.printf("\nlate retries refused (ErrLateRetry), in the last 8 days: %d\n", ts.LateRetries)
	days := make([]string, 0, len(ts.LateByDay))
	for d := range ts.LateByDay {
		days = append(days, d)
	}
	slices.Sort(days)
	for _, d := range days {
		out.printf("  %-14s %10d\n", d, ts.LateByDay[d])
	}
	if ts.LateRetries > 0 {
		out.printf("  each came after its record's retention: a retry that late ran again without tombstones;\n" +
			"  lengthen WithRetention (see idem.replay.age, and docs/retention.md)\n")
	}
}
