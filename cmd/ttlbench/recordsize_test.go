package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/ttlbench/internal/traffic"
	"github.com/idem-go/idem/internal/redistest"
)

// TestRecordSize stores a finished record as the README and -h describe
// it (a UUID key, a fingerprint, a 100-byte result, idem's default prefix)
// through the library on a real redis-server, and checks that its key and
// value take the bytes the fast engine counts for it, and that MEMORY
// USAGE gives the figure the help and the README state (measured with
// Redis 7.0.15; other versions are only logged).
func TestRecordSize(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{}) // skips without redis-server, unless IDEM_REQUIRE_REDIS=1
	rdb := srv.Client(t)
	ctx := context.Background()
	c := idem.New(rdb)
	defer c.Close()
	const key = "5f0c7a8e-2b1d-4c3e-9f6a-0123456789ab"
	if _, err := c.Do(ctx, key, idem.Fingerprint("debit", 100), func(context.Context) ([]byte, error) {
		return []byte(strings.Repeat("r", 100)), nil
	}); err != nil {
		t.Fatal(err)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %q, %v; want the one record", keys, err)
	}
	val, err := rdb.Get(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	payload := int64(len(keys[0]) + len(val))
	plan := &traffic.Plan{KeyLen: []uint16{uint16(len(key))}, FP: []uint64{1}}
	sizes := newRecordSizes(24*time.Hour, options{Lease: 30 * time.Second, ResultSize: 100})
	if got := sizes.of(plan, 0, 0, true); got != payload {
		t.Errorf("the fast engine counts %d bytes for the record; its key and value hold %d", got, payload)
	}
	if payload != recordPayload {
		t.Errorf("key and value hold %d bytes; the help says %d", payload, recordPayload)
	}
	mem, err := rdb.MemoryUsage(ctx, keys[0], 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	info, _ := rdb.Info(ctx, "server").Result()
	t.Logf("MEMORY USAGE %d bytes, key and value %d (%s)", mem, payload, redisVersion(info))
	if redisVersion(info) == "7.0.15" && mem != recordMemory {
		t.Errorf("MEMORY USAGE %d bytes on Redis 7.0.15; the help and the README say %d", mem, recordMemory)
	}
}

// redisVersion reads redis_version from INFO server.
func redisVersion(info string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown version"
}
