package notify_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the reconnection tests cause some.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}
