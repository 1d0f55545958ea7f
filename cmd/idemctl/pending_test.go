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

// pending lists an unfinished registered operation with its name, state,
// steps and next recovery, and a parked one as parked; retry un-parks it,
// and refuses a key that is not parked.
func TestPendingAndRetry(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := idem.New(srv.Client(t), idem.WithLogger(nil), idem.WithRecoverAfter(20*time.Millisecond), idem.WithMaxRecoveries(1))
	defer c.Close()
	ctx := context.Background()
	op := idem.Register(c, "charge", func(ctx context.Context, in int) (int, error) {
		if _, err := idem.Step(ctx, "reserve", func(context.Context) (int, error) { return in, nil }); err != nil {
			return 0, err
		}
		return 0, errors.New("transient")
	})
	for _, k := range []string{"pay-1", "pay-2"} {
		if _, err := op.Do(ctx, k, 1); err == nil {
			t.Fatal("want the transient error")
		}
	}
	rctx, stop := context.WithTimeout(ctx, 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- c.Recover(rctx) }()
	for {
		if st, _ := c.Status(ctx, "pay-1"); st.State == idem.StateParked {
			break
		}
		if rctx.Err() != nil {
			t.Fatal("pay-1 not parked within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	// pay-2 is parked too, or about to be: un-park the first only.
	r := idemctl(t, "-redis", srv.Addr(), "-json", "-raw", "pending")
	r.mustExit(t, 0)
	var got struct {
		Pending []pendingJSON `json:"pending"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("pending -json: %v\n%s", err, r.stdout)
	}
	var one *pendingJSON
	for i, p := range got.Pending {
		if p.Key == "pay-1" {
			one = &got.Pending[i]
		}
	}
	if one == nil || one.Name != "charge" || one.State != "parked" || one.Steps != 1 || one.NextRecovery != nil || one.Recoveries != 1 || one.KeyDigest == "" {
		t.Fatalf("pending: %+v\n%s", one, r.stdout)
	}
	r = idemctl(t, "-redis", srv.Addr(), "pending")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "charge") || !strings.Contains(r.stdout, "parked (idemctl retry KEY)") || strings.Contains(r.stdout, "pay-1") {
		t.Fatalf("pending without -raw:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", srv.Addr(), "retry", "pay-1")
	r.mustExit(t, 0)
	if st, _ := c.Status(ctx, "pay-1"); st.State != idem.StateReleased {
		t.Fatalf("after retry: %v", st.State)
	}
	r = idemctl(t, "-redis", srv.Addr(), "retry", "pay-1")
	r.mustExit(t, 1, "not parked")
	r = idemctl(t, "-redis", srv.Addr(), "retry", "nope")
	r.mustExit(t, 1, "no such record")
	r = idemctl(t, "-redis", srv.Addr(), "-raw", "stats")
	r.mustExit(t, 2, "pending's")
}
