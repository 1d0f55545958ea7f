package idem_test

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// TestOptionsAreSafeToShare: a service builds its options once and hands
// the same slice to every Client it makes, from many goroutines. An Option
// that writes what it captured (WithLogger(nil) resolving its nil in the
// closure did) is a data race that -race reports here.
func TestOptionsAreSafeToShare(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := []idem.Option{idem.WithLogger(nil), idem.WithPrefix("shared:")}
	idemtest.Concurrently(func() { _ = idem.New(rdb, opts...) })
}
