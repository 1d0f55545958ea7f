package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

// svgElements returns the chart's elements of class class, each as its
// attributes and the text of its title (or its own text).
func svgElements(t *testing.T, svg []byte, class string) []map[string]string {
	t.Helper()
	var out []map[string]string
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
		if !ok {
			continue
		}
		attrs := map[string]string{"element": se.Name.Local}
		for _, a := range se.Attr {
			attrs[a.Name.Local] = a.Value
		}
		if attrs["class"] != class {
			continue
		}
		var inner struct {
			Title string `xml:"title"`
		}
		if err := dec.DecodeElement(&inner, &se); err != nil {
			t.Fatal(err)
		}
		attrs["title"] = inner.Title
		out = append(out, attrs)
	}
}

// TestSVGDrawsTheRecommendedPair: with -tombstones the chart shows the
// recommended pair, a point of its own, and its tombstone window on the
// gaps' time axis, from its retention to the span; without, neither.
func TestSVGDrawsTheRecommendedPair(t *testing.T) {
	t.Parallel()
	plain, two := chart(t), chart(t, "-tombstones")
	if bytes.Equal(plain, two) {
		t.Fatal("the chart with -tombstones is byte for byte the one without")
	}
	// The default run's pair, as the text report recommends it.
	const pair = "WithRetention(41m45s), WithTombstones(56m15s)"
	for _, svg := range [][]byte{plain} {
		if n := len(svgElements(t, svg, "tombstone-window")) + len(svgElements(t, svg, "pair recommended")); n != 0 {
			t.Errorf("the chart without -tombstones draws %d elements of a pair", n)
		}
	}
	win := svgElements(t, two, "tombstone-window")
	if len(win) != 1 {
		t.Fatalf("got %d tombstone windows, want 1", len(win))
	}
	if got := win[0]["title"]; !strings.Contains(got, pair) || !strings.Contains(got, "41m45s to 1h38m") {
		t.Errorf("tombstone window titled %q; want the pair %s, from 41m45s to 1h38m", got, pair)
	}
	pts := svgElements(t, two, "pair recommended")
	if len(pts) != 1 || !strings.Contains(pts[0]["title"], pair) {
		t.Errorf("got pair points %v; want one, of %s", pts, pair)
	}
	var texts []string
	for _, l := range chartLabels(t, two) {
		texts = append(texts, l.text)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"41m45s + 56m15s tombstones (recommended pair)", "tombstones 41m45s–1h38m"} {
		if !strings.Contains(all, want) {
			t.Errorf("the chart with -tombstones has no label %q", want)
		}
	}
}
