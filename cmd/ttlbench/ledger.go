package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// Ledger rows (idemsql, idempgx): how long to keep them, the retention
// that matters for money. A row keeps an operation exactly-once when Redis
// has lost its record, and gives a retry its receipt; once Prune has
// removed it, a retry runs fn again (or is refused by a tombstone, and gets
// no receipt). So a row is kept as long as a retry can arrive that must get
// the receipt, and rows are cheap (a database row each, not Redis memory),
// so the rule is generous:
//
//	prune age = the longest of
//	  the recommended retention (Prune's documented floor: a row is kept at
//	  least as long as the Client's retention, so that it outlives every
//	  record Redis holds of it; with -tombstones, the span, which is the
//	  recommended retention),
//	  twice the trace's longest retry gap (its 100th percentile: the
//	  longest of a sample understates the tail beyond it; twice that
//	  covers a tail as long again), and
//	  one day (Prune runs as a daily job),
//	rounded up to whole days.
//
// A trace shows only gaps shorter than the time it covers: when its
// longest gap is half that time or more, the tail may run on past the
// trace, and the report says so.

// pruneFactor is how many times the longest retry gap a row is kept.
const pruneFactor = 2

// ledgerAdvice is the recommended age for Prune and what set it.
type ledgerAdvice struct {
	Age       time.Duration // keep rows this long: Prune(ctx, time.Now().Add(-Age))
	Retention time.Duration // the recommended retention, the floor; 0 when none was recommended
	Longest   time.Duration // the trace's longest retry gap; 0 when no key was requested twice
	Covered   time.Duration // the time the trace covers
}

// adviseLedger applies the rule to the longest retry gap, the recommended
// retention (0: none) and the time the trace covers.
func adviseLedger(longest, retention, covered time.Duration) ledgerAdvice {
	const day = 24 * time.Hour
	age := max(retention, pruneFactor*longest, day)
	age = (age + day - 1) / day * day
	return ledgerAdvice{Age: age, Retention: retention, Longest: longest, Covered: covered}
}

// goDuration writes d, whole days, as a Go expression: 24*time.Hour.
func goDuration(d time.Duration) string {
	if days := d / (24 * time.Hour); days > 1 {
		return fmt.Sprintf("%d*24*time.Hour", days)
	}
	return "24*time.Hour"
}

// lines says, in the text report, how long to keep ledger rows and why.
func (a ledgerAdvice) lines() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ledger rows (idemsql, idempgx): keep %s, Prune(ctx, time.Now().Add(-%s)), the longest of\n  ",
		units.ShortDuration(a.Age), goDuration(a.Age))
	var parts []string
	if a.Retention > 0 {
		parts = append(parts, "the retention ("+units.ShortDuration(a.Retention)+")")
	}
	if a.Longest > 0 {
		parts = append(parts, fmt.Sprintf("twice the longest retry gap (%d × %s)", pruneFactor, roughDuration(a.Longest)))
	}
	parts = append(parts, "a day")
	b.WriteString(strings.Join(parts, ", "))
	b.WriteString(", rounded up to whole days")
	switch {
	case a.Longest == 0:
		b.WriteString(":\n  no key was requested twice, so the trace shows no retry to size them by")
	default:
		b.WriteString(":\n  a row gives a retry its receipt once Redis has no record, as long as a retry may come; rows are cheap")
	}
	if a.Retention == 0 {
		b.WriteString(";\n  no retention was recommended: keep rows at least as long as the one you choose")
	}
	b.WriteString("\n")
	if a.Longest > 0 && 2*a.Longest >= a.Covered {
		fmt.Fprintf(&b, "  the longest gap is half or more of the %s the trace covers: later retries may lie beyond it\n",
			roughDuration(a.Covered))
	}
	return b.String()
}
