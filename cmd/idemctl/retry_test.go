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

// An operation registered with idem.Register that fails transiently is
// listed by pending, and a plain Do's is not; once its recoveries parked
// it, status and pending say parked, retry (with -yes) un-parks it, and
// the next Recover finishes it.
func TestPendingRetryRegistered(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	c := idem.New(rdb, idem.WithRecoverAfter(50*time.Millisecond), idem.WithMaxRecoveries(1), idem.WithLogger(nil))
	defer c.Close()
	ctx := context.Background()
	var healthy bool // read by fn in Recover's goroutine only after the loop below stopped
	debit := idem.Register(c, "debit", func(ctx context.Context, amount int) (string, error) {
		if !healthy {
			return "", errors.New("provider down")
		}
		return "debited", nil
	})
	if _, err := debit.Do(ctx, "pay-1", 12); err == nil {
		t.Fatal("pay-1: want the transient error")
	}
	if _, err := c.Do(ctx, "plain-1", "", func(context.Context) ([]byte, error) { return nil, errors.New("down") }); err == nil {
		t.Fatal("plain-1: want the transient error")
	}
	addr := srv.Addr()
	r := idemctl(t, "-redis", addr, "-raw", "-json", "pending")
	r.mustExit(t, 0)
	var got pendingJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Operations) != 1 || got.Operations[0].Key != "pay-1" || got.Operations[0].Operation != "debit" ||
		got.Operations[0].State != "released" || got.Operations[0].Parked || got.Operations[0].NextRecovery == nil {
		t.Fatalf("pending: %+v", got.Operations)
	}

	// One recovery, which fails too: parked.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Recover(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.Status(ctx, "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateParked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pay-1 is %v after 30s, want parked", st.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done

	r = idemctl(t, "-redis", addr, "status", "pay-1")
	r.mustExit(t, 0)
	for _, want := range []string{"state:    parked", "its recoveries did not finish it", "idemctl retry KEY"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status does not say %q:\n%s", want, r.stdout)
		}
	}
	r = idemctl(t, "-redis", addr, "-raw", "pending")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "0 unfinished and 1 parked") || !strings.Contains(r.stdout, `"pay-1"`) || !strings.Contains(r.stdout, "never: parked") {
		t.Errorf("pending of the parked operation:\n%s", r.stdout)
	}

	idemctl(t, "-redis", addr, "retry", "pay-1").mustExit(t, 2, "-yes")
	idemctl(t, "-redis", addr, "retry", "plain-1", "-yes").mustExit(t, 1, "not parked")
	r = idemctl(t, "-redis", addr, "retry", "pay-1", "-yes")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `retried key "pay-1"`) {
		t.Errorf("retry:\n%s", r.stdout)
	}
	if st, err := c.Status(ctx, "pay-1"); err != nil || st.State == idem.StateParked {
		t.Fatalf("pay-1 after retry: %v %v", st.State, err)
	}
	healthy = true
	rctx, cancel = context.WithCancel(ctx)
	go func() { done <- c.Recover(rctx) }()
	defer func() { cancel(); <-done }()
	deadline = time.Now().Add(30 * time.Second)
	for {
		v, st, err := debit.Result(ctx, "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateDone {
			if v != "debited" {
				t.Fatalf("pay-1: %q", v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pay-1 is %v after 30s, want done", st.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r = idemctl(t, "-redis", addr, "pending")
	r.mustExit(t, 0)
	if !strings.HasPrefix(r.stdout, "0 unfinished and 0 parked") {
		t.Errorf("pending once finished:\n%s", r.stdout)
	}
}
