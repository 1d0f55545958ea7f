package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// webhookArgs replay testdata/webhooks.csv.gz, a webhook consumer's log:
// events whose acknowledgement was lost come again on the provider's
// schedule, for up to three days, so the recommended retention (2d18h30m)
// lies beside 7d on the chart.
var webhookArgs = []string{"-trace", "testdata/webhooks.csv.gz"}

// chartRuns are the runs whose charts are checked: the default workload
// and every trace in testdata, with and without -tombstones.
var chartRuns = map[string][]string{
	"default":                           nil,
	"default-tombstones":                {"-tombstones"},
	"default-target":                    {"-target", "0.001"},
	"checkout":                          checkoutArgs,
	"checkout-tombstones":               append([]string{"-tombstones", "-late-target", "0.05"}, checkoutArgs...),
	"redeliveries":                      redeliveryArgs,
	"redeliveries-target":               append([]string{"-target", "0.01"}, redeliveryArgs...),
	"redeliveries-too-small":            append([]string{"-target", "0.001"}, redeliveryArgs...),
	"redeliveries-tombstones":           append([]string{"-tombstones", "-target", "0.01", "-late-target", "0.01"}, redeliveryArgs...),
	"redeliveries-too-small-tombstones": append([]string{"-tombstones", "-target", "0.001"}, redeliveryArgs...),
	"access":                            {"-trace", "testdata/access.csv", "-columns", "key=idempotency_key,time=time"},
	"webhooks":                          webhookArgs,
	"webhooks-tombstones":               append([]string{"-tombstones"}, webhookArgs...),
	"webhooks-target":                   append([]string{"-target", "0.01"}, webhookArgs...),
}

// chart runs the command with args and -svg, and returns the chart.
func chart(t *testing.T, args ...string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "chart.svg")
	code, _, stderr := runCmd(t, append([]string{"-svg", path}, args...)...)
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// chartLabels reads the horizontal text of a chart back into labels, with
// the position, size, anchor and weight it was drawn with.
func chartLabels(t *testing.T, svg []byte) []label {
	t.Helper()
	var out []label
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "text" {
			continue
		}
		l, rotated := label{anchor: "start"}, false
		for _, a := range se.Attr {
			switch a.Name.Local {
			case "x":
				l.x, _ = strconv.ParseFloat(a.Value, 64)
			case "y":
				l.y, _ = strconv.ParseFloat(a.Value, 64)
			case "font-size":
				l.size, _ = strconv.Atoi(a.Value)
			case "text-anchor":
				l.anchor = a.Value
			case "font-weight":
				l.weight = a.Value
			case "transform":
				rotated = true
			}
		}
		var s string
		if err := dec.DecodeElement(&s, &se); err != nil {
			t.Fatal(err)
		}
		l.text = s
		if !rotated {
			out = append(out, l)
		}
	}
}

// drawn returns the box that l's text covers when drawn in DejaVu Sans,
// the widest font the chart may be drawn in (svgfont.go): from the
// baseline up by the font's ascent, down by its descent.
func drawn(l label) box {
	w := textWidth(l.text, l.size, l.weight == "bold")
	b := box{x0: l.x, y0: l.y - 0.76*float64(l.size), x1: l.x + w, y1: l.y + 0.24*float64(l.size)}
	switch l.anchor {
	case "end":
		b.x0, b.x1 = l.x-w, l.x
	case "middle":
		b.x0, b.x1 = l.x-w/2, l.x+w/2
	}
	return b
}

// TestChartLabelsDoNotOverlap draws the charts of every trace in testdata
// and of the default workload, and requires that no two pieces of text
// cover each other and that all of it lies on the canvas, measured in the
// glyphs of the widest font a viewer may draw it in.
func TestChartLabelsDoNotOverlap(t *testing.T) {
	t.Parallel()
	for name, args := range chartRuns {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			labels := chartLabels(t, chart(t, args...))
			if len(labels) < 20 {
				t.Fatalf("read %d pieces of text from the chart; want the chart's labels", len(labels))
			}
			for i, a := range labels {
				if b := drawn(a); b.x0 < 0 || b.x1 > svgW || b.y0 < 0 || b.y1 > svgH {
					t.Errorf("%q at (%.0f, %.0f) runs off the %dx%d canvas: x %.0f–%.0f", a.text, a.x, a.y, svgW, svgH, b.x0, b.x1)
				}
				for _, b := range labels[i+1:] {
					if area := drawn(a).overlap(drawn(b)); area > 0 {
						t.Errorf("%q at (%.0f, %.0f) and %q at (%.0f, %.0f) overlap (%.0f px²)", a.text, a.x, a.y, b.text, b.x, b.y, area)
					}
				}
			}
		})
	}
}
