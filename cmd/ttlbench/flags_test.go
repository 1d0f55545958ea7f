package main

import (
	"slices"
	"testing"
	"time"
)

func TestPolicies(t *testing.T) {
	t.Parallel()
	got, err := parsePolicies("7d, 1m,1h30m,1.5d,36h,1m,90s,1d")
	if err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	want := []time.Duration{time.Minute, 90 * time.Second, 90 * time.Minute, day, 36 * time.Hour, 7 * day}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (sorted, without repeats)", got, want)
	}
	if got, want := (policiesValue{&got}).String(), "1m,1m30s,1h30m,24h,36h,7d"; got != want {
		t.Errorf("formatted as %q, want %q", got, want)
	}
	for _, bad := range []string{"", ",", "1x", "-1m", "0s", "1d-2h", "d"} {
		if _, err := parsePolicies(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
