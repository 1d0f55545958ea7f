package grpcidem_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// The newcomer's case (issue 34) over gRPC: the client's deadline
// (150 ms) is shorter than the handler (200 ms: a debit, then a
// provider's charge), and it retries with one key every 50 ms. The
// handler goes on after the deadline, its response is stored, and a retry
// gets it: one debit, one charge.
func TestHandlerOutlivesTheDeadline(t *testing.T) {
	eachBackend(t, func(t *testing.T, be *backend) {
		var debits, charges atomic.Int64
		b := &bank{debit: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			debits.Add(1)
			select {
			case <-time.After(200 * time.Millisecond):
				charges.Add(1)
				return mustStruct(map[string]any{"charged": true}), nil
			case <-ctx.Done():
				return nil, status.Error(codes.Unavailable, "gave up")
			}
		}}
		cc := dial(t, serve(t, b, grpcidem.UnaryServerInterceptor(newIdem(t, be), grpcidem.WithLogger(nil))))
		successes, first := 0, -1
		for i := range 10 {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			a := invokeCtx(ctx, cc, methodDebit, "order-1", mustStruct(map[string]any{"amount": 100}))
			cancel()
			switch {
			case a.err == nil && a.resp.GetFields()["charged"].GetBoolValue():
				successes++
				if first < 0 {
					first = i
				}
			case status.Code(a.err) != codes.DeadlineExceeded:
				t.Logf("retry %d: %v", i, a.err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if successes == 0 || debits.Load() != 1 || charges.Load() != 1 {
			t.Fatalf("%d successes in 10 retries, %d debits, %d charges; want a success, one debit and one charge",
				successes, debits.Load(), charges.Load())
		}
		t.Logf("first success at retry %d", first)
	})
}

// A handler bounded by WithHandlerTimeout, not by its caller's deadline.
func TestHandlerTimeout(t *testing.T) {
	eachBackend(t, func(t *testing.T, be *backend) {
		ended := make(chan error, 1)
		ok := make(chan struct{})
		var retried atomic.Bool
		b := &bank{debit: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			if retried.Load() {
				close(ok)
				return mustStruct(nil), nil
			}
			start := time.Now()
			<-ctx.Done()
			ended <- fmt.Errorf("after %v: %w", time.Since(start), context.Cause(ctx))
			return nil, status.Error(codes.Unavailable, "gave up")
		}}
		c := newIdem(t, be)
		cc := dial(t, serve(t, b, grpcidem.UnaryServerInterceptor(c, grpcidem.WithLogger(nil), grpcidem.WithHandlerTimeout(time.Second))))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		a := invokeCtx(ctx, cc, methodDebit, "k", mustStruct(map[string]any{"amount": 1}))
		cancel()
		if status.Code(a.err) != codes.DeadlineExceeded {
			t.Fatalf("the caller got %v; want its own DeadlineExceeded", a.err)
		}
		err := recv(t, ended)
		if !strings.Contains(err.Error(), "WithHandlerTimeout") {
			t.Fatalf("the handler's context ended %v; want by WithHandlerTimeout", err)
		}
		// The Unavailable releases the key; a retry runs the handler again.
		retried.Store(true)
		if a := invoke(cc, methodDebit, "k", 1); a.err != nil {
			t.Fatalf("retry: %v", a.err)
		}
		recv(t, ok)
	})
}

// WithHandlerTimeout must be positive.
func TestHandlerTimeoutInvalid(t *testing.T) {
	c := newIdem(t, &backend{Addr: "127.0.0.1:1"})
	for _, d := range []time.Duration{0, -time.Second} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "WithHandlerTimeout") {
					t.Errorf("WithHandlerTimeout(%v): panicked with %v; want a panic naming it", d, p)
				}
			}()
			grpcidem.UnaryServerInterceptor(c, grpcidem.WithHandlerTimeout(d))
		}()
	}
}
