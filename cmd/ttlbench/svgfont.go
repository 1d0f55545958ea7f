package main

// Glyph widths of the chart's text. The SVG asks for Helvetica, Arial or
// sans-serif; a viewer without the first two (a Linux desktop, a CI
// runner) draws DejaVu Sans, which is the widest of the three, so the
// layout measures text in its advance widths: a label that clears its
// neighbours in DejaVu Sans clears them in Helvetica and Arial too.

// dejaVuSans and dejaVuSansBold are the advance widths, in thousandths
// of an em, of the printable ASCII characters (space to tilde), read from
// DejaVuSans.ttf and DejaVuSans-Bold.ttf (version 2.37).
var dejaVuSans = [95]uint16{
	318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337,
	636, 636, 636, 636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531,
	1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656, 557, 863, 748, 787,
	603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500,
	500, 613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612,
	635, 635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838,
}

var dejaVuSansBold = [95]uint16{
	348, 456, 521, 838, 696, 1002, 872, 306, 457, 457, 523, 838, 380, 415, 380, 365,
	696, 696, 696, 696, 696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 580,
	1000, 774, 762, 734, 830, 683, 683, 821, 837, 372, 372, 775, 637, 995, 837, 850,
	733, 850, 770, 720, 682, 812, 774, 1103, 771, 724, 725, 457, 365, 457, 838, 500,
	500, 675, 716, 593, 716, 678, 435, 716, 712, 343, 343, 665, 343, 1042, 712, 687,
	716, 716, 493, 595, 478, 712, 652, 924, 645, 652, 582, 712, 365, 712, 838,
}

// dejaVuOther holds the widths, regular and bold, of the other characters
// the chart prints.
var dejaVuOther = map[rune][2]uint16{
	8211: {500, 500}, // –
	215:  {838, 838}, // ×
	8804: {838, 838}, // ≤
	183:  {318, 380}, // ·
	8217: {318, 380}, // ’
}

// textWidth returns the width in pixels of s drawn at size pixels, bold
// or not. A character the tables lack counts as a whole em.
func textWidth(s string, size int, bold bool) float64 {
	var w float64
	for _, c := range s {
		em := uint16(1000)
		switch o, ok := dejaVuOther[c]; {
		case c >= ' ' && c <= '~' && bold:
			em = dejaVuSansBold[c-' ']
		case c >= ' ' && c <= '~':
			em = dejaVuSans[c-' ']
		case ok && bold:
			em = o[1]
		case ok:
			em = o[0]
		}
		w += float64(em)
	}
	return w * float64(size) / 1000
}
