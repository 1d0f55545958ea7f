package main

import (
	"fmt"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// The two-tier policy (-tombstones) on the charts: the recommended pair as
// a point of its own in the trade-off, and its tombstone window (from the
// retention to the span, where a retry finds only the tombstone) on the
// gaps' time axis.

// pairColor is the colour of the pair and its tombstones.
const pairColor = "#6a1b9a"

// recommendedPair returns the recommended pair of the two-tier study, if
// there is one.
func (r *report) recommendedPair() (policyResult, bool) {
	if r.Pairs == nil || r.Pairs.Recommended < 0 {
		return policyResult{}, false
	}
	return r.Pairs.Results[r.Pairs.Recommended], true
}

// pairName names a pair as the options that set it.
func pairName(res policyResult) string {
	return fmt.Sprintf("WithRetention(%s), WithTombstones(%s)", units.ShortDuration(res.Retention), units.ShortDuration(res.Tombstones))
}

// drawPair draws the recommended pair in the trade-off, a diamond at its
// peak memory (records and tombstones) and duplicate rate (the span's), or
// says why there is none; and returns its label, to be placed with the
// others.
func (r *report) drawPair(c *canvas, xs, ys logScale) (point, string, bool) {
	if !r.TwoTier {
		return point{}, "", false
	}
	res, ok := r.recommendedPair()
	if !ok {
		why := "-tombstones: no pair recommended (see the text report)"
		if r.Pairs == nil {
			why = "-tombstones: no pair: no retention was recommended"
		}
		c.label(label{x: plotR - 8, y: plotT + 32, size: 11, anchor: "end", color: pairColor, text: why})
		return point{}, "", false
	}
	p := point{x: xs.pos(float64(max(res.PeakBytes, 1))), y: zeroY}
	if dr := res.DuplicateRate(); dr > 0 {
		p.y = ys.pos(dr)
	}
	title := esc(fmt.Sprintf("%s: %d duplicates, %d late retries refused, peak %d records and %d tombstones, %s",
		pairName(res), res.Duplicates, res.LateRetries, res.PeakRecords, res.PeakTombstones, formatBytes(res.PeakBytes)))
	c.printf(`<polygon class="pair recommended" points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"><title>%s</title></polygon>`+"\n",
		p.x, p.y-7, p.x+7, p.y, p.x, p.y+7, p.x-7, p.y, pairColor, title)
	return p, fmt.Sprintf("%s + %s tombstones (recommended pair)", units.ShortDuration(res.Retention), units.ShortDuration(res.Tombstones)), true
}

// drawTombstoneWindow shades, on the gaps' time axis, the recommended
// pair's tombstone window: retries with gaps from its retention to the
// span find only the tombstone and are refused (ErrLateRetry). It returns
// the drawing of its label, to run once the axes' text is taken.
func (r *report) drawTombstoneWindow(c *canvas, xs logScale, taken *[]box) func() {
	res, ok := r.recommendedPair()
	if !ok {
		return func() {}
	}
	span := res.Retention + res.Tombstones
	x0, x1 := xs.pos(float64(res.Retention)), xs.pos(float64(span))
	c.printf(`<rect class="tombstone-window" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.12"><title>%s</title></rect>`+"\n",
		x0, gapT, max(x1-x0, 1), gapB-gapT, pairColor,
		esc(fmt.Sprintf("tombstone window of %s: a retry %s to %s after the outcome finds only the tombstone (ErrLateRetry)",
			pairName(res), units.ShortDuration(res.Retention), units.ShortDuration(span))))
	c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5" stroke-dasharray="2 3"/>`+"\n", x0, gapT, x0, gapB, pairColor)
	text := fmt.Sprintf("tombstones %s–%s", units.ShortDuration(res.Retention), units.ShortDuration(span))
	return func() {
		var cands []label
		for dy := 8.0; dy < gapB-gapT; dy += 14 {
			cands = append(cands,
				label{x: x0 + 4, y: gapB - dy, size: 11, anchor: "start", color: pairColor, text: text},
				label{x: x0 - 4, y: gapB - dy, size: 11, anchor: "end", color: pairColor, text: text})
		}
		l := placeFirst(cands, *taken, box{plotL, gapT, gapR, gapB})
		c.label(l)
		*taken = append(*taken, l.box())
	}
}
