package idem_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests cause many.
	redis.SetLogger(quietLogger{})
	// The scripts are embedded here, out of idemtest's reach.
	idemtest.ScriptSource = idem.ScriptSource
	idemtest.SetParallel(4)
	goleak.VerifyTestMain(m)
}

// observerFunc adapts a function to an idem.Observer.
type observerFunc func(ctx context.Context, e idem.Event)

func (f observerFunc) Observe(ctx context.Context, e idem.Event) { f(ctx, e) }
