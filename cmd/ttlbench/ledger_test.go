package main

import (
	"strings"
	"testing"
	"time"
)

func TestAdviseLedger(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		longest, retention, want time.Duration
	}{
		{0, 0, day}, // no retry: a day
		{98 * time.Minute, 98 * time.Minute, day}, // twice the gap is under a day
		{12 * time.Hour, time.Hour, day},          // twice the gap is a day exactly
		{12*time.Hour + time.Millisecond, time.Hour, 2 * day},
		{10 * time.Hour, 30 * time.Hour, 2 * day}, // the retention sets it
		{68*time.Hour + 22*time.Minute, 68*time.Hour + 30*time.Minute, 6 * day},
	} {
		if got := adviseLedger(tc.longest, tc.retention, 7*day).Age; got != tc.want {
			t.Errorf("longest gap %s, retention %s: got %s, want %s", tc.longest, tc.retention, got, tc.want)
		}
	}
}

// TestLedgerPruneReported: the webhook trace's longest retry gap is
// 2d20h22m, so its ledger rows are kept twice that, rounded up to 6 days,
// in the text and in -json.
func TestLedgerPruneReported(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCmd(t, webhookArgs...)
	if code != exitOK {
		t.Fatalf("exit code %d: %s", code, stderr)
	}
	for _, want := range []string{
		"ledger rows (idemsql, idempgx): keep 6d, Prune(ctx, time.Now().Add(-6*24*time.Hour))",
		"twice the longest retry gap (2 × 2d20h22m)",
		"the longest gap is half or more of the 5d15h26m the trace covers",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the report lacks %q:\n%s", want, stdout)
		}
	}
	code, stdout, stderr = runCmd(t, append([]string{"-json"}, webhookArgs...)...)
	if code != exitOK {
		t.Fatalf("-json: exit code %d: %s", code, stderr)
	}
	_, sum := readJSON(t, stdout)
	if got, want := sum.Summary.LedgerPruneMS, (6 * 24 * time.Hour).Milliseconds(); got != want || sum.Summary.LedgerPrune != "6d" {
		t.Errorf("-json: ledger_prune %q, ledger_prune_ms %d; want 6d, %d", sum.Summary.LedgerPrune, got, want)
	}
}
