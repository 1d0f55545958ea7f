// Package demoredis holds what the examples' demos do with Redis beside
// idem: an embedded miniredis whose keys expire on the wall clock, and a
// key prefix of a run's own, deleted at its end, for a shared server.
package demoredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// RunPrefix returns a key prefix unique to this run of the demo called
// name, so that a run on a shared Redis touches only keys of its own:
// "idem-<name>-<8 hex digits>:".
func RunPrefix(name string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails (crypto/rand documents it)
	return "idem-" + name + "-" + hex.EncodeToString(b) + ":"
}

// Cleanup deletes the keys under prefix, within ten seconds.
func Cleanup(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

// FollowWallClock makes m's keys expire as a real Redis's would: miniredis
// counts TTLs down only when told to (FastForward), and without that a
// killed process's claims would never end. It returns the function that
// stops it.
func FollowWallClock(m *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
