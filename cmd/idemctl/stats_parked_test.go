package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
)

// stats counts a parked operation (a checked step's outcome unknown) as
// parked, not as released: it runs again only once an operator resolves
// it, whatever the next call does.
func TestStatsParked(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := idem.New(srv.Client(t), idem.WithLogger(nil))
	defer c.Close()
	ctx := context.Background()
	parks := func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge",
			func(context.Context) (string, error) { return "", idem.Ambiguous(errors.New("timeout")) },
			func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil },
			idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
	}
	if _, err := idem.Do(ctx, c, "pay-1", "", parks); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("pay-1: %v, want parked", err)
	}
	boom := errors.New("boom")
	if _, err := c.Do(ctx, "pay-2", "", func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("pay-2: %v, want boom (released)", err)
	}
	if _, err := c.Do(ctx, "pay-3", "", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}

	r := idemctl(t, "-redis", srv.Addr(), "-json", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("stats -json: %v\n%s", err, r.stdout)
	}
	if got.Records != 3 || got.ByState[stParked] != 1 || got.ByState[stReleased] != 1 || got.ByState[stDone] != 1 {
		t.Fatalf("stats by state %v of %d records, want parked 1, released 1, done 1", got.ByState, got.Records)
	}
	r = idemctl(t, "-redis", srv.Addr(), "stats")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "parked") || !strings.Contains(r.stdout, "idemctl resolve") {
		t.Fatalf("stats does not show the parked operation:\n%s", r.stdout)
	}
}
