package main

import "testing"

func TestPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		x    float64
		want string
	}{
		{0, "0%"}, {0.05, "5%"}, {0.018, "1.8%"}, {0.00643e-2, "0.00643%"}, {6.43e-7, "0.0000643%"},
		{0.123456, "12.3%"}, {1, "100%"}, {0.99999, "100%"}, {0.0006, "0.06%"},
	} {
		if got := percent(tc.x); got != tc.want {
			t.Errorf("percent(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
}
