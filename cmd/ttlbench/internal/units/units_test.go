package units

import (
	"testing"
	"time"
)

func TestShortDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Minute:                  "1m",
		10 * time.Minute:             "10m",
		90 * time.Minute:             "1h30m",
		24 * time.Hour:               "24h",
		36 * time.Hour:               "36h",
		48 * time.Hour:               "2d",
		7 * 24 * time.Hour:           "7d",
		7*24*time.Hour + time.Hour:   "7d1h",
		1500 * time.Millisecond:      "1.5s",
		time.Minute + 30*time.Second: "1m30s",
	} {
		if got := ShortDuration(d); got != want {
			t.Errorf("ShortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		x    float64
		want string
	}{
		{0, "0%"}, {0.05, "5%"}, {0.018, "1.8%"}, {0.00643e-2, "0.00643%"}, {6.43e-7, "0.0000643%"},
		{0.123456, "12.3%"}, {1, "100%"}, {0.99999, "100%"}, {0.0006, "0.06%"},
	} {
		if got := Percent(tc.x); got != tc.want {
			t.Errorf("Percent(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
}
