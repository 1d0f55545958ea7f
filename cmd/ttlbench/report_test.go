package main

import (
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		label, unit string
		n, total    int64
		elapsed     time.Duration
		want        []string
	}{
		{"replaying", "requests", 1_200_000, 4_800_000, 2 * time.Second,
			[]string{" 25%", "replaying: 1.2M/4.8M requests", "600k requests/s", "6s left"}},
		{"reading big.csv.gz", "bytes", 3 << 20, 12 << 20, time.Second,
			[]string{" 25%", "reading big.csv.gz: 3.0 MiB/12.0 MiB", "3.0 MiB/s", "3s left"}},
		{"reading stdin", "bytes", 5 << 20, 0, 2 * time.Second, []string{"reading stdin: 5.0 MiB", "2.5 MiB/s"}},
		{"bootstrap", "", 0, 0, 3 * time.Second, []string{"bootstrap… 3s"}},
		{"", "", 1, 2, time.Second, nil},
	} {
		got := progressLine(tc.label, tc.unit, tc.n, tc.total, tc.elapsed)
		if tc.want == nil && got != "" {
			t.Errorf("no phase: got %q, want nothing", got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%q lacks %q", got, w)
			}
		}
	}
}
