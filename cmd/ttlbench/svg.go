package main

import (
	"encoding/xml"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem/cmd/ttlbench/internal/units"
)

// The chart's geometry, in pixels. The plot has two bands: a logarithmic
// one for duplicate rates above zero, and below it, across an axis break, a
// row for policies with no duplicates at all, which a log scale cannot show.
const (
	svgW     = 880
	svgH     = 1030
	plotL    = 110 // left edge of the plot
	plotR    = 840 // right edge
	plotT    = 110 // top of the log band
	logB     = 410 // bottom of the log band
	zeroY    = 455 // the zero row
	axisY    = 480 // the x axis
	labelPad = 2   // the space kept clear around a label, in pixels
)

// SVG draws the trade-off: x is the peak memory of live records, y the
// duplicate rate, one labelled point per policy, the recommendation and the
// target marked. It is hand-written SVG 1.1, without scripts or external
// resources, to put in a design review.
func (r *report) SVG() []byte {
	c := &canvas{}
	c.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n",
		svgW, svgH, svgW, svgH)
	c.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	c.text(svgW/2, 32, 18, "middle", "bold", "#222", "Retention trade-off: duplicate executions vs. Redis memory")
	sub := append(wrap(r.Workload, 12, plotR-plotL), wrap("replayed "+r.Traffic+"; "+r.Setup, 12, plotR-plotL)...)
	for i, line := range sub {
		c.text(svgW/2, 54+16*i, 12, "middle", "", "#555", line)
	}

	xs, ys := r.scales()
	pts := make([]point, len(r.Results))
	for i, res := range r.Results {
		pts[i] = point{x: xs.pos(float64(max(res.PeakBytes, 1))), y: zeroY}
		if dr := res.DuplicateRate(); dr > 0 {
			pts[i].y = ys.pos(dr)
		}
	}
	r.drawAcceptable(c, ys)
	drawAxes(c, xs, ys)
	taken := []box{r.drawTarget(c, ys, pts)}
	if r.recommended() < 0 && len(r.Results) > 0 {
		l := label{x: plotR - 8, y: plotT + 16, size: 12, anchor: "end", weight: "bold", color: "#b71c1c",
			text: "no retention tried meets the target"}
		c.label(l)
		taken = append(taken, l.box())
	}
	r.drawPoints(c, pts)
	pair, pairText, hasPair := r.drawPair(c, xs, ys)
	obstacles := taken
	if hasPair {
		obstacles = append(obstacles, box{pair.x - 8, pair.y - 8, pair.x + 8, pair.y + 8})
	}
	labels := r.placeLabels(pts, obstacles)
	for _, l := range labels {
		c.label(l)
		obstacles = append(obstacles, l.box())
	}
	if hasPair {
		var cands []label
		for _, d := range []float64{12, 24, 36, 48} {
			for _, at := range []struct {
				dx, dy float64
				anchor string
			}{{0, d + 8, "middle"}, {0, -d + 2, "middle"}, {d, d + 8, "start"}, {-d, d + 8, "end"}, {d, -d + 2, "start"}, {-d, -d + 2, "end"}} {
				cands = append(cands, label{x: pair.x + at.dx, y: pair.y + at.dy, size: 12, anchor: at.anchor, weight: "bold", color: pairColor, text: pairText})
			}
		}
		for _, p := range pts {
			obstacles = append(obstacles, box{p.x - 7, p.y - 7, p.x + 7, p.y + 7})
		}
		c.label(placeFirst(cands, obstacles, box{plotL + 6, plotT - 8, svgW - 6, axisY - 2}))
	}
	r.drawGaps(c)
	c.printf("</svg>\n")
	return []byte(c.b.String())
}

// drawAcceptable shades where a policy meets the target: at or below the
// target's line, or only the zero row for a target of 0.
func (r *report) drawAcceptable(c *canvas, ys logScale) {
	if r.Target > 0 {
		ty := ys.pos(r.Target)
		c.printf(`<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="#e8f5e9"/>`+"\n", plotL, ty, plotR-plotL, float64(axisY)-ty)
		return
	}
	c.printf(`<rect x="%d" y="%d" width="%d" height="%d" fill="#e8f5e9"/>`+"\n", plotL, zeroY-15, plotR-plotL, 30)
}

// drawAxes draws the grid, the ticks, the axes and their titles, with a
// break in the y axis between the log band and the zero row.
func drawAxes(c *canvas, xs, ys logScale) {
	for _, t := range ys.ticks {
		y := ys.pos(t.v)
		c.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, y, plotR, y)
		c.text(plotL-8, int(y)+4, 11, "end", "", "#333", t.label)
	}
	c.printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", plotL, zeroY, plotR, zeroY)
	c.text(plotL-8, zeroY+4, 11, "end", "", "#333", "0")
	for _, t := range xs.ticks {
		x := xs.pos(t.v)
		c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, plotT, x, axisY)
		c.printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/>`+"\n", x, axisY, x, axisY+5)
		c.text(int(x), axisY+19, 11, "middle", "", "#333", t.label)
	}
	brk := (logB + zeroY) / 2
	c.printf(`<polyline points="%d,%d %d,%d" fill="none" stroke="#333"/>`+"\n", plotL, plotT, plotL, brk-5)
	c.printf(`<polyline points="%d,%d %d,%d %d,%d" fill="none" stroke="#333"/>`+"\n", plotL, brk+5, plotL, axisY, plotR, axisY)
	for _, dy := range []int{-5, 5} {
		c.printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", plotL-6, brk+dy+3, plotL+6, brk+dy-3)
	}
	c.text((plotL+plotR)/2, axisY+42, 13, "middle", "", "#222", "peak memory of live records (bytes, log scale)")
	c.printf(`<text x="0" y="0" transform="translate(32 %d) rotate(-90)" font-size="13" text-anchor="middle" fill="#222">%s</text>`+"\n",
		(plotT+zeroY)/2, esc("duplicate executions per operation (log scale)"))
}

// drawFootnotes says how memory was measured, and what hollow points mean,
// in small print at the bottom.
func (r *report) drawFootnotes(c *canvas) {
	if len(r.Results) == 0 {
		return
	}
	const size, width = 10, svgW - plotL - 10
	lines := wrap(bytesNote(r.Results[0].BytesMethod), size, width)
	if r.Results[len(r.Results)-1].Retention > r.Arrivals {
		lines = append(lines, wrap(fmt.Sprintf(
			"hollow points: retentions longer than the %s of arrivals, whose peaks count every operation, not a steady state",
			roughDuration(r.Arrivals)), size, width)...)
	}
	for i, line := range lines {
		c.text(plotL, svgH-10-13*(len(lines)-1-i), size, "start", "", "#666", line)
	}
}

// drawTarget draws the target's line (for a target above 0) and its label,
// placed where no point is, and returns the label's box.
func (r *report) drawTarget(c *canvas, ys logScale, pts []point) box {
	y, text := float64(zeroY+4), "target: no duplicates (-target 0)"
	if r.Target > 0 {
		ty := ys.pos(r.Target)
		c.printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#2e7d32" stroke-dasharray="6 4"/>`+"\n", plotL, ty, plotR, ty)
		y, text = ty-6, "target: "+rate(r.Target)+" (-target)"
	}
	l := label{size: 11, color: "#2e7d32", text: text}
	for _, at := range []struct {
		x, dy  float64
		anchor string
	}{{plotL + 8, 0, "start"}, {plotR - 8, 0, "end"}, {plotL + 8, -22, "start"}, {plotR - 8, -22, "end"}} {
		l.x, l.y, l.anchor = at.x, y+at.dy, at.anchor
		if !hitsPoint(l.box(), pts) {
			break
		}
	}
	c.label(l)
	return l.box()
}

// drawPoints draws the curve through the policies, in order of retention,
// and a point for each: the recommended one ringed, and hollow those whose
// peak is not a steady state (the retention outlasts the arrivals).
func (r *report) drawPoints(c *canvas, pts []point) {
	var line []string
	for _, p := range pts {
		line = append(line, fmt.Sprintf("%.1f,%.1f", p.x, p.y))
	}
	c.printf(`<polyline points="%s" fill="none" stroke="#90a4ae" stroke-width="1.5"/>`+"\n", strings.Join(line, " "))
	for i, p := range pts {
		res := r.Results[i]
		title := esc(fmt.Sprintf("retention %s: %d duplicates (%s), peak %d records, %s",
			units.ShortDuration(res.Retention), res.Duplicates, rate(res.DuplicateRate()), res.PeakRecords, formatBytes(res.PeakBytes)))
		switch {
		case i == r.recommended():
			c.printf(`<circle cx="%.1f" cy="%.1f" r="11" fill="none" stroke="#2e7d32" stroke-width="2"/>`+"\n", p.x, p.y)
			c.printf(`<circle class="point recommended" cx="%.1f" cy="%.1f" r="6" fill="#2e7d32"><title>%s</title></circle>`+"\n", p.x, p.y, title)
		case res.Retention > r.Arrivals:
			c.printf(`<circle class="point" cx="%.1f" cy="%.1f" r="4.5" fill="white" stroke="#1565c0" stroke-width="2"><title>%s</title></circle>`+"\n", p.x, p.y, title)
		default:
			c.printf(`<circle class="point" cx="%.1f" cy="%.1f" r="5" fill="#1565c0"><title>%s</title></circle>`+"\n", p.x, p.y, title)
		}
	}
}

// point is a position on the chart, in pixels.
type point struct{ x, y float64 }

// tick is a labelled value on an axis.
type tick struct {
	v     float64
	label string
}

// logScale maps values in [lo, hi] logarithmically onto pixels [a, b].
type logScale struct {
	lo, hi float64
	a, b   float64
	ticks  []tick
}

// pos returns the pixel of value v.
func (s logScale) pos(v float64) float64 {
	f := (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	return s.a + f*(s.b-s.a)
}

// scales fits the axes to the results: whole decades of duplicate rate
// (with the target), and memory padded by a third on both sides.
func (r *report) scales() (xs, ys logScale) {
	bmin, bmax := math.Inf(1), 0.0
	rmin, rmax := math.Inf(1), 0.0
	all := r.Results
	if pair, ok := r.recommendedPair(); ok {
		all = append(slices.Clone(all), pair)
	}
	for _, res := range all {
		b := float64(max(res.PeakBytes, 1))
		bmin, bmax = min(bmin, b), max(bmax, b)
		if dr := res.DuplicateRate(); dr > 0 {
			rmin, rmax = min(rmin, dr), max(rmax, dr)
		}
	}
	if r.Target > 0 {
		rmin, rmax = min(rmin, r.Target), max(rmax, r.Target)
	}
	if rmax == 0 { // no duplicates anywhere: an empty band of sensible size
		rmin, rmax = 1e-4, 1e-2
	}
	if bmax == 0 {
		bmin, bmax = 1, 1
	}
	ylo := math.Pow(10, math.Floor(math.Log10(rmin)))
	yhi := math.Pow(10, math.Ceil(math.Log10(rmax)))
	if yhi <= ylo {
		yhi = ylo * 10
	}
	ys = logScale{lo: ylo, hi: yhi, a: logB, b: plotT}
	for v := ylo; v <= yhi*1.0001; v *= 10 {
		ys.ticks = append(ys.ticks, tick{v: v, label: rate(v)})
	}

	xlo, xhi := bmin/1.35, bmax*1.35
	xs = logScale{lo: xlo, hi: xhi, a: plotL, b: plotR}
	for _, mults := range [][]float64{{1}, {1, 2, 5}, {1, 1.5, 2, 3, 5, 7}} {
		xs.ticks = xs.ticks[:0]
		for unit := 1.0; unit <= xhi; unit *= 1024 {
			for _, dec := range []float64{1, 10, 100} {
				for _, m := range mults {
					if v := unit * dec * m; v >= xlo && v <= xhi && v < unit*1024 {
						xs.ticks = append(xs.ticks, tick{v: v, label: tickBytes(v)})
					}
				}
			}
		}
		if len(xs.ticks) >= 3 {
			break
		}
	}
	return xs, ys
}

// tickBytes labels a round size: 10 KiB, 1.5 MiB.
func tickBytes(v float64) string {
	u := 0
	for v >= 1024 && u < 5 {
		v /= 1024
		u++
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if u == 0 {
		return s + " B"
	}
	return s + " " + "KMGTP"[u-1:u] + "iB"
}

// label is a placed piece of text.
type label struct {
	x, y          float64
	size          int
	anchor        string
	weight, color string
	text          string
}

// box returns the space the label takes, in the glyphs of the widest font
// a viewer may draw it in (svgfont.go), with labelPad around it: from the
// baseline up by the font's ascent and down by its descent. The label is
// drawn at whole pixels, as canvas.label draws it.
func (l label) box() box {
	w := textWidth(l.text, l.size, l.weight == "bold")
	x, y, size := math.Trunc(l.x), math.Trunc(l.y), float64(l.size)
	b := box{x0: x, y0: y - 0.76*size, x1: x + w, y1: y + 0.24*size}
	switch l.anchor {
	case "end":
		b.x0, b.x1 = x-w, x
	case "middle":
		b.x0, b.x1 = x-w/2, x+w/2
	}
	return box{b.x0 - labelPad, b.y0 - labelPad, b.x1 + labelPad, b.y1 + labelPad}
}

// box is a rectangle on the chart, in pixels.
type box struct{ x0, y0, x1, y1 float64 }

// overlap returns the area a and b share.
func (a box) overlap(b box) float64 {
	w := min(a.x1, b.x1) - max(a.x0, b.x0)
	h := min(a.y1, b.y1) - max(a.y0, b.y0)
	if w <= 0 || h <= 0 {
		return 0
	}
	return w * h
}

// placeLabels puts each point's label where it covers no other label or
// point: it tries spots around the point, nearest first, and takes the one
// with the least overlap. Points that coincide share one label ("24h, 7d").
// obstacles are boxes already taken by other text.
func (r *report) placeLabels(pts []point, obstacles []box) []label {
	placed := slices.Clone(obstacles)
	var out []label
	// Spots along the curve between the points, which a label should not
	// cross either.
	var curve []point
	for i := 1; i < len(pts); i++ {
		a, b := pts[i-1], pts[i]
		n := int(math.Hypot(b.x-a.x, b.y-a.y) / 4)
		for k := 1; k < n; k++ {
			f := float64(k) / float64(n)
			curve = append(curve, point{a.x + f*(b.x-a.x), a.y + f*(b.y-a.y)})
		}
	}
	for i := 0; i < len(pts); {
		// Points i..j-1 are drawn on top of each other.
		j := i + 1
		for j < len(pts) && near(pts[j-1], pts[j]) {
			j++
		}
		var names []string
		rec := false
		for k := i; k < j; k++ {
			names = append(names, units.ShortDuration(r.Results[k].Retention))
			rec = rec || k == r.recommended()
		}
		p := pts[j-1]
		i = j
		l := label{size: 12, color: "#0d47a1", text: strings.Join(names, ", ")}
		if rec {
			l.weight, l.color, l.text = "bold", "#2e7d32", l.text+" (recommended)"
		}
		best, bestCost := label{}, math.Inf(1)
		var bestBox box
		for _, d := range []float64{14, 24, 38} {
			spots := []struct {
				dx, dy float64
				anchor string
			}{
				{d, 4, "start"}, {-d, 4, "end"}, {0, -d + 2, "middle"}, {0, d + 8, "middle"},
				{d * 0.7, -d * 0.7, "start"}, {-d * 0.7, -d * 0.7, "end"},
				{d * 0.7, d*0.7 + 8, "start"}, {-d * 0.7, d*0.7 + 8, "end"},
			}
			if p.y == zeroY {
				// On a crowded row, straight above or below reads best.
				spots[0], spots[2] = spots[2], spots[0]
				spots[1], spots[3] = spots[3], spots[1]
			}
			for _, c := range spots {
				cand := l
				cand.x, cand.y, cand.anchor = p.x+c.dx, p.y+c.dy, c.anchor
				b := cand.box()
				cost := 0.0
				for _, o := range placed {
					cost += o.overlap(b)
				}
				for _, q := range pts {
					cost += b.overlap(box{q.x - 7, q.y - 7, q.x + 7, q.y + 7})
				}
				for _, q := range curve {
					cost += 4 * b.overlap(box{q.x - 1, q.y - 1, q.x + 1, q.y + 1})
				}
				if b.x0 < plotL+6 || b.x1 > svgW-6 || b.y0 < plotT-8 || b.y1 > axisY-2 {
					cost += 1e6 // outside the plot
				}
				cost += d / 100 // prefer near spots when all else is equal
				if cost < bestCost {
					bestCost, bestBox, best = cost, b, cand
				}
			}
		}
		placed = append(placed, bestBox)
		out = append(out, best)
	}
	return out
}

// placeFirst returns the first of cands whose box stays inside within and
// covers none of taken; failing that, the one that covers least.
func placeFirst(cands []label, taken []box, within box) label {
	best, bestCost := cands[0], math.Inf(1)
	for _, l := range cands {
		b := l.box()
		cost := 0.0
		for _, o := range taken {
			cost += o.overlap(b)
		}
		if b.x0 < within.x0 || b.x1 > within.x1 || b.y0 < within.y0 || b.y1 > within.y1 {
			cost += 1e6
		}
		if cost == 0 {
			return l
		}
		if cost < bestCost {
			best, bestCost = l, cost
		}
	}
	return best
}

// hitsPoint reports whether b covers one of the points.
func hitsPoint(b box, pts []point) bool {
	for _, p := range pts {
		if b.overlap(box{p.x - 7, p.y - 7, p.x + 7, p.y + 7}) > 0 {
			return true
		}
	}
	return false
}

// near reports whether two points are drawn on top of each other.
func near(a, b point) bool { return math.Hypot(a.x-b.x, a.y-b.y) < 4 }

// wrap breaks s into lines at most width pixels wide at size, at spaces.
func wrap(s string, size int, width float64) []string {
	var lines []string
	var cur string
	for _, w := range strings.Fields(s) {
		if cur != "" && textWidth(cur+" "+w, size, false) > width {
			lines = append(lines, cur)
			cur = ""
		}
		if cur != "" {
			cur += " "
		}
		cur += w
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}

// canvas accumulates SVG text.
type canvas struct{ b strings.Builder }

// printf appends formatted SVG.
func (c *canvas) printf(format string, args ...any) { fmt.Fprintf(&c.b, format, args...) }

// label draws a placed label.
func (c *canvas) label(l label) {
	c.text(int(l.x), int(l.y), l.size, l.anchor, l.weight, l.color, l.text)
}

// text draws s at (x, y) with the given size, anchor, weight and colour.
func (c *canvas) text(x, y, size int, anchor, weight, color, s string) {
	w := ""
	if weight != "" {
		w = fmt.Sprintf(` font-weight="%s"`, weight)
	}
	c.printf(`<text x="%d" y="%d" font-size="%d" text-anchor="%s"%s fill="%s">%s</text>`+"\n", x, y, size, anchor, w, color, esc(s))
}

// esc escapes text for XML.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
