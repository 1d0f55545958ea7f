package main

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
)

// resolve refuses what it cannot do before it touches Redis (no -step,
// both or neither of -not-applied and -value, no -yes, a value of no
// scalar type, resolve's flags on other commands), and -not-applied makes
// the next call act once more.
func TestResolve(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := idem.New(srv.Client(t), idem.WithLogger(nil))
	defer c.Close()
	ctx := context.Background()
	var acts atomic.Int64
	up := false
	fn := func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge",
			func(context.Context) (string, error) {
				acts.Add(1)
				if !up {
					return "", idem.Ambiguous(errors.New("timeout"))
				}
				return "ch_new", nil
			},
			func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil },
			idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
	}
	if _, err := idem.Do(ctx, c, "pay-1", "", fn); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("pay-1: %v, want parked", err)
	}
	addr := srv.Addr()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"resolve", "pay-1", "-not-applied", "-yes"}, "needs the parked step's name"},
		{[]string{"resolve", "pay-1", "-step", "charge", "-yes"}, "one of -not-applied"},
		{[]string{"resolve", "pay-1", "-step", "charge", "-not-applied", "-value", `"x"`, "-yes"}, "one of -not-applied"},
		{[]string{"resolve", "pay-1", "-step", "charge", "-not-applied"}, "add -yes"},
		{[]string{"resolve", "pay-1", "-step", "charge", "-value", `{"id":1}`, "-yes"}, "a JSON string, number or boolean"},
		{[]string{"resolve", "pay-1", "-step", "charge", "-value", `"a" "b"`, "-yes"}, "more than one JSON value"},
		{[]string{"status", "pay-1", "-step", "charge"}, "are resolve's"},
	} {
		r := idemctl(t, append([]string{"-redis", addr}, tc.args...)...)
		r.mustExit(t, 2, tc.say)
	}
	if st, err := c.Status(ctx, "pay-1"); err != nil || st.State != idem.StateParked {
		t.Fatalf("after refused resolves: %+v, %v; want still parked", st, err)
	}
	r := idemctl(t, "-redis", addr, "resolve", "pay-1", "-step", "other", "-not-applied", "-yes")
	r.mustExit(t, 1, "not parked")

	r = idemctl(t, "-redis", addr, "-json", "resolve", "pay-1", "-step", "charge", "-not-applied", "-yes")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `"resolved": "not_applied"`) {
		t.Errorf("resolve -json printed %q", r.stdout)
	}
	up = true
	if v, err := idem.Do(ctx, c, "pay-1", "", fn); err != nil || v != "ch_new" || acts.Load() != 2 {
		t.Fatalf("after resolve -not-applied: %q, %v, act ran %d times; want ch_new after 2", v, err, acts.Load())
	}
}
