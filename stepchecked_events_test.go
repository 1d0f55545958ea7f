package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// Every reconciliation of a checked step is an EventReconciled naming the
// step and the answer that settled it (applied, not applied after the
// settle time, unknown: parked), before the call's outcome; LogObserver
// logs it at Warn with the step and the check.
func TestStepCheckedReconciledEvents(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		answers []idem.Check // check's answers, in turn; the last repeats
		want    idem.Check   // the reconciliation's result
		outcome idem.EventKind
		logged  string // in LogObserver's record
	}{
		{"applied", []idem.Check{idem.CheckUnknown, idem.CheckApplied}, idem.CheckApplied, idem.EventExecuted, "check=applied"},
		{"not applied", []idem.Check{idem.CheckNotApplied}, idem.CheckNotApplied, idem.EventExecuted, `check="not applied"`},
		{"unknown", []idem.Check{idem.CheckUnknown}, idem.CheckUnknown, idem.EventParked, "check=unknown"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			r := &recorder{}
			var buf syncBuffer
			l := slog.New(slog.NewTextHandler(&buf, nil))
			c := idem.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}), idem.WithLogger(nil),
				idem.WithObserver(r), idem.WithObserver(idem.LogObserver(l)))
			t.Cleanup(func() { _ = c.Close() })
			acts, checks := 0, 0
			act := func(context.Context) (string, error) {
				if acts++; acts == 1 {
					return "", idem.Ambiguous(errTimeout)
				}
				return "ch_again", nil
			}
			check := func(context.Context) (string, idem.Check, error) {
				a := tc.answers[min(checks, len(tc.answers)-1)]
				checks++
				if a == idem.CheckApplied {
					return "ch_1", a, nil
				}
				return "", a, nil
			}
			fn := chargeStep(act, check, idem.SettleAfter(100*time.Millisecond), idem.ReconcileFor(time.Second))
			_, err := idem.Do(context.Background(), c, "k", "", fn)
			if tc.outcome == idem.EventParked != errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("Do: %v, want outcome %v", err, tc.outcome)
			}
			ev := r.take()
			if got, want := kinds(ev), "reconciled,"+tc.outcome.String(); got != want {
				t.Fatalf("events %s, want %s", got, want)
			}
			rec := ev[0]
			if rec.Step != "charge" || rec.Check != tc.want || rec.Kind.Outcome() || rec.Kind.Ran() || rec.Err != nil {
				t.Errorf("reconciled event: step %q, check %v, outcome %v, ran %v, err %v; want step \"charge\", check %v, a step with no error",
					rec.Step, rec.Check, rec.Kind.Outcome(), rec.Kind.Ran(), rec.Err, tc.want)
			}
			if rec.Key != ev[1].Key || rec.Attempt != 1 || rec.Duration <= 0 || rec.Duration > ev[1].Duration {
				t.Errorf("reconciled event: key %q, attempt %d, duration %v; want the outcome's key %q, attempt 1, within the call's %v",
					rec.Key, rec.Attempt, rec.Duration, ev[1].Key, ev[1].Duration)
			}
			line := ""
			for _, s := range strings.Split(buf.String(), "\n") {
				if strings.Contains(s, "idem: reconciled") {
					line = s
				}
			}
			if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "step=charge") || !strings.Contains(line, tc.logged) {
				t.Errorf("LogObserver: %q, want the reconciliation at Warn with step=charge and %s", line, tc.logged)
			}
		})
	}
}
