package door_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/door"
)

type ctxKey struct{}

// TestDetachOutlivesItsCaller: the caller's cancellation returns at once
// with ok false while do goes on, with the caller's values and without
// its deadline, until the timeout ends its context with the cause.
func TestDetachOutlivesItsCaller(t *testing.T) {
	cause := errors.New("over the handler timeout")
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	finished := make(chan error, 1)
	started := make(chan struct{})
	go func() { <-started; cancel() }()
	o, ok := door.Detach(ctx, 30*time.Second, cause, func(dctx context.Context) ([]byte, error) {
		close(started)
		<-ctx.Done() // the caller's context ended ...
		time.Sleep(10 * time.Millisecond)
		if dctx.Value(ctxKey{}) != "v" {
			finished <- errors.New("the caller's value is lost")
		} else {
			finished <- dctx.Err() // ... and do's has not
		}
		return []byte("late"), nil
	}, nil)
	if ok || o.Res != nil {
		t.Fatalf("Detach with its caller gone: %+v, %v; want ok false", o, ok)
	}
	if err := <-finished; err != nil {
		t.Fatalf("do's context after the caller's ended: %v, want live with the caller's values", err)
	}

	o, ok = door.Detach(context.Background(), 20*time.Millisecond, cause, func(dctx context.Context) ([]byte, error) {
		<-dctx.Done()
		return nil, context.Cause(dctx)
	}, nil)
	if !ok || !errors.Is(o.Err, cause) {
		t.Fatalf("do past the timeout: %+v, %v; want its context ended with the cause", o, ok)
	}
	o, ok = door.Detach(context.Background(), time.Minute, cause, func(context.Context) ([]byte, error) { return []byte("r"), nil }, nil)
	if !ok || string(o.Res) != "r" || o.Err != nil || o.Panicked {
		t.Fatalf("Detach: %+v, %v", o, ok)
	}
}

// TestDetachPanics: a panic while the caller waits is its outcome; one
// after it has gone reaches late, never the caller.
func TestDetachPanics(t *testing.T) {
	o, ok := door.Detach(context.Background(), time.Minute, nil, func(context.Context) ([]byte, error) { panic("boom") }, func(any) {
		t.Error("late called while the caller waited")
	})
	if !ok || !o.Panicked || o.Panic != "boom" {
		t.Fatalf("panic while waiting: %+v, %v", o, ok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	late := make(chan any, 1)
	release := make(chan struct{})
	go func() {
		_, ok := door.Detach(ctx, time.Minute, nil, func(context.Context) ([]byte, error) { <-release; panic("after") }, func(p any) { late <- p })
		if ok {
			t.Error("ok after the caller's context ended")
		}
		close(release)
	}()
	cancel()
	select {
	case p := <-late:
		if p != "after" {
			t.Errorf("late got %v", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the late panic never reached late")
	}
}
