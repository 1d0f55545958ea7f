package idemstream_test

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/internal/idemtest"
)

// TestOptionsAreSafeToShare: a service builds its options once and hands
// the same slice to every New it calls, from many goroutines. An Option
// that writes what it captured (WithLogger(nil) resolving its nil in the
// closure did) is a data race that -race reports here.
func TestOptionsAreSafeToShare(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	keys := idem.New(rdb, idem.WithLogger(nil))
	t.Cleanup(func() { _ = keys.Close(); _ = rdb.Close() })
	opts := []idemstream.Option{idemstream.WithLogger(nil)}
	idemtest.Concurrently(func() { _ = idemstream.New(keys, rdb, "s", "g", "c", opts...) })
}
