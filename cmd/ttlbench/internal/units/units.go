// Package units formats the durations and shares that ttlbench prints.
package units

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// ShortDuration formats d without zero units: 1m, 10m, 1h30m, 24h, and
// whole days from 48h up: 7d.
func ShortDuration(d time.Duration) string {
	if d >= 48*time.Hour {
		days := d / (24 * time.Hour)
		s := strconv.FormatInt(int64(days), 10) + "d"
		if rest := d - days*24*time.Hour; rest > 0 {
			s += ShortDuration(rest)
		}
		return s
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Percent formats a share, 0.05 as "5%".
func Percent(x float64) string {
	v := 100 * x
	if v == 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', 3, 64) + "%"
	}
	// Three significant digits, never an exponent: 0.0000643%, not 6.43e-05%.
	v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	decimals := max(0, 2-int(math.Floor(math.Log10(math.Abs(v)))))
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + "%"
}
