package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// The second panel's geometry, in pixels: the retry gaps' survival curve
// against the retention, with the replayed retentions' memory.
const (
	gapTitleY = 560 // the panel's title
	gapT      = 600 // top of the plot
	gapB      = 900 // bottom of the plot: the time axis
	gapR      = 780 // right edge: the memory axis
)

// retentionTicks are the round retentions the time axis may show.
var retentionTicks = []time.Duration{
	time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour,
	30 * 24 * time.Hour, 90 * 24 * time.Hour, 365 * 24 * time.Hour,
}

// drawGaps draws the retry gaps: for each retention R, the share of the
// requests after an operation's first that come R or more after its
// outcome was recorded (log-log), which is what a retention of R lets run
// again, at most; beside it, on an axis of its own, the peak memory of
// each retention replayed; the recommendation and its interval marked.
func (r *report) drawGaps(c *canvas) {
	c.text(svgW/2, gapTitleY, 16, "middle", "bold", "#222", "Retry gaps: how late requests come, and what keeping records that long costs")
	if r.Gaps.N == 0 || len(r.Results) == 0 {
		c.text(svgW/2, (gapT+gapB)/2, 13, "middle", "", "#555", "no key was requested twice: no gaps to show")
		r.drawFootnotes(c)
		return
	}
	// Time axis: from the shortest retention shown to the longest, or the
	// longest gap.
	tlo := float64(r.Results[0].Retention)
	thi := float64(max(r.Results[len(r.Results)-1].Retention, r.Gaps.Max))
	if len(r.Survival) > 0 {
		tlo = min(tlo, float64(r.Survival[0].R))
	}
	xs := logScale{lo: tlo / 1.3, hi: thi * 1.3, a: plotL, b: gapR}
	var ticks []tick
	for _, d := range retentionTicks {
		if v := float64(d); v >= xs.lo && v <= xs.hi {
			ticks = append(ticks, tick{v: v, label: units.ShortDuration(d)})
		}
	}
	for len(ticks) > 9 {
		var thin []tick
		for i := 0; i < len(ticks); i += 2 {
			thin = append(thin, ticks[i])
		}
		ticks = thin
	}
	xs.ticks = ticks

	// Share axis: whole decades down to one request in N.
	slo := math.Pow(10, math.Floor(math.Log10(1/float64(r.Gaps.N))))
	ss := logScale{lo: slo, hi: 1, a: gapB, b: gapT}
	for v := slo; v <= 1.0001; v *= 10 {
		ss.ticks = append(ss.ticks, tick{v: v, label: rate(v)})
	}
	// Memory axis.
	bmin, bmax := math.Inf(1), 0.0
	for _, res := range r.Results {
		b := float64(max(res.PeakBytes, 1))
		bmin, bmax = min(bmin, b), max(bmax, b)
	}
	ms := logScale{lo: bmin / 1.5, hi: bmax * 1.5, a: gapB, b: gapT}
	for unit := 1.0; unit <= ms.hi; unit *= 1024 {
		for _, dec := range []float64{1, 10, 100} {
			if v := unit * dec; v >= ms.lo && v <= ms.hi && v < unit*1024 {
				ms.ticks = append(ms.ticks, tick{v: v, label: tickBytes(v)})
			}
		}
	}

	// The text drawn so far and below, which the labels placed in the
	// plot must not cover.
	var taken []box
	fixed := func(l label) {
		c.label(l)
		taken = append(taken, l.box())
	}
	taken = append(taken, label{x: svgW / 2, y: gapTitleY, size: 16, anchor: "middle", weight: "bold",
		text: "Retry gaps: how late requests come, and what keeping records that long costs"}.box())

	// The recommendation and its interval, behind the curves; the
	// tombstones of the recommended pair, after it.
	var later []func()
	if i := r.recommended(); i >= 0 {
		if r.Resamples > 0 {
			x0, x1 := xs.pos(float64(max(r.RetentionInterval[0], 1))), xs.pos(float64(max(r.RetentionInterval[1], 1)))
			c.printf(`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#e8f5e9"/>`+"\n", x0, gapT, max(x1-x0, 1), gapB-gapT)
		}
		later = append(later, r.drawTombstoneWindow(c, xs, &taken))
		x := xs.pos(float64(r.Results[i].Retention))
		c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#2e7d32" stroke-width="1.5" stroke-dasharray="5 3"/>`+"\n", x, gapT, x, gapB)
		text := fmt.Sprintf("recommended %s", units.ShortDuration(r.Results[i].Retention))
		if r.Resamples > 0 {
			text += fmt.Sprintf(" (95%%: %s–%s)", units.ShortDuration(r.RetentionInterval[0]), units.ShortDuration(r.RetentionInterval[1]))
		}
		// Beside the line, on the side with more room, as high as the
		// other labels leave free.
		sides := []struct {
			dx     float64
			anchor string
		}{{6, "start"}, {-6, "end"}}
		if x > (plotL+gapR)/2 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		later = append(later, func() {
			var cands []label
			for dy := 14.0; dy < gapB-gapT; dy += 14 {
				for _, sd := range sides {
					cands = append(cands, label{x: x + sd.dx, y: gapT + dy, size: 11, anchor: sd.anchor, weight: "bold", color: "#2e7d32", text: text})
				}
			}
			l := placeFirst(cands, taken, box{plotL, gapT, gapR, gapB})
			c.label(l)
			taken = append(taken, l.box())
		})
	}

	// Grid and axes.
	for _, t := range ss.ticks {
		y := ss.pos(t.v)
		c.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, y, gapR, y)
		fixed(label{x: plotL - 8, y: float64(int(y) + 4), size: 11, anchor: "end", color: "#333", text: t.label})
	}
	for _, t := range xs.ticks {
		x := xs.pos(t.v)
		c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, gapT, x, gapB)
		c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/>`+"\n", x, gapB, x, gapB+5)
		fixed(label{x: float64(int(x)), y: gapB + 19, size: 11, anchor: "middle", color: "#333", text: t.label})
	}
	for _, t := range ms.ticks {
		y := ms.pos(t.v)
		c.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e65100"/>`+"\n", gapR, y, gapR+5, y)
		fixed(label{x: gapR + 8, y: float64(int(y) + 4), size: 11, anchor: "start", color: "#e65100", text: t.label})
	}
	for _, f := range later {
		f()
	}
	c.printf(`<polyline points="%d,%d %d,%d %d,%d %d,%d" fill="none" stroke="#333"/>`+"\n", plotL, gapT, plotL, gapB, gapR, gapB, gapR, gapT)
	c.text((plotL+gapR)/2, gapB+42, 13, "middle", "", "#222", "retention R (log scale)")
	c.printf(`<text x="0" y="0" transform="translate(32 %d) rotate(-90)" font-size="13" text-anchor="middle" fill="#1565c0">%s</text>`+"\n",
		(gapT+gapB)/2, esc("share of later requests R or more late (log)"))
	c.printf(`<text x="0" y="0" transform="translate(%d %d) rotate(90)" font-size="13" text-anchor="middle" fill="#e65100">%s</text>`+"\n",
		svgW-14, (gapT+gapB)/2, esc("peak memory of live records (log)"))

	// The survival curve, and where it ends: no request came later.
	var pts []string
	for _, p := range r.Survival {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs.pos(float64(p.R)), ss.pos(p.Share)))
	}
	if len(pts) > 0 {
		end := xs.pos(float64(r.Gaps.Max))
		pts = append(pts, fmt.Sprintf("%.1f,%d", end, gapB))
		c.printf(`<polyline class="survival" points="%s" fill="none" stroke="#1565c0" stroke-width="2"/>`+"\n", strings.Join(pts, " "))
	}
	// Gap percentiles on the curve; those that fall on one gap share a
	// label, placed beside its point where no other text is.
	var marks []point
	for i := range gapQuantiles {
		if d := r.Gaps.Quantiles[i]; float64(d) >= xs.lo && d > 0 {
			marks = append(marks, point{xs.pos(float64(d)), ss.pos(max(1-gapQuantiles[i], slo))})
		}
	}
	for _, p := range marks {
		taken = append(taken, box{p.x - 4, p.y - 4, p.x + 4, p.y + 4})
	}
	for i := 0; i < len(gapQuantiles); {
		d := r.Gaps.Quantiles[i]
		j := i + 1
		for j < len(gapQuantiles) && r.Gaps.Quantiles[j] == d {
			j++
		}
		var names []string
		for _, q := range gapQuantiles[i:j] {
			names = append(names, "p"+pctLabel(q))
		}
		q := gapQuantiles[i]
		i = j
		if float64(d) < xs.lo || d <= 0 {
			continue
		}
		x, y := xs.pos(float64(d)), ss.pos(max(1-q, slo))
		c.printf(`<circle cx="%.1f" cy="%.1f" r="3" fill="#1565c0"/>`+"\n", x, y)
		text := strings.Join(names, ", ") + " " + units.ShortDuration(roundGap(d))
		var cands []label
		for _, dy := range []float64{-6, 14, -18, 26, -30, 38} {
			for _, at := range []struct {
				dx     float64
				anchor string
			}{{6, "start"}, {-6, "end"}} {
				cands = append(cands, label{x: float64(int(x)) + at.dx, y: float64(int(y)) + dy, size: 10, anchor: at.anchor, color: "#1565c0", text: text})
			}
		}
		l := placeFirst(cands, taken, box{plotL, gapT, gapR, gapB})
		c.label(l)
		taken = append(taken, l.box())
	}

	// Memory of each retention replayed.
	var mem []string
	for _, res := range r.Results {
		mem = append(mem, fmt.Sprintf("%.1f,%.1f", xs.pos(float64(res.Retention)), ms.pos(float64(max(res.PeakBytes, 1)))))
	}
	c.printf(`<polyline points="%s" fill="none" stroke="#e65100" stroke-width="1.5" stroke-dasharray="4 3"/>`+"\n", strings.Join(mem, " "))
	for i, res := range r.Results {
		x, y := xs.pos(float64(res.Retention)), ms.pos(float64(max(res.PeakBytes, 1)))
		title := esc(fmt.Sprintf("retention %s: peak %s", units.ShortDuration(res.Retention), formatBytes(res.PeakBytes)))
		fill := "#e65100"
		if i == r.recommended() {
			fill = "#2e7d32"
		}
		c.printf(`<rect class="memory" x="%.1f" y="%.1f" width="8" height="8" fill="%s"><title>%s</title></rect>`+"\n", x-4, y-4, fill, title)
	}
	// Legend, under the axis title.
	lx, ly := plotL, gapB+64
	c.printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#1565c0" stroke-width="2"/>`+"\n", lx, ly, lx+24, ly)
	c.text(lx+30, ly+4, 11, "start", "", "#333", fmt.Sprintf("share of the %d later requests (left axis)", r.Gaps.N))
	c.printf(`<rect x="%d" y="%d" width="8" height="8" fill="#e65100"/>`+"\n", lx+368, ly-4)
	c.text(lx+382, ly+4, 11, "start", "", "#333", "peak memory of each retention replayed (right axis)")
	r.drawFootnotes(c)
}

// pctLabel formats a quantile as a percentile's name: 0.999 as "99.9".
func pctLabel(q float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", 100*q), "0"), ".")
}

// roundGap rounds a gap for a label: to the second, or to the minute from
// an hour up.
func roundGap(d time.Duration) time.Duration {
	if d >= time.Hour {
		return d.Round(time.Minute)
	}
	return d.Round(time.Second)
}
