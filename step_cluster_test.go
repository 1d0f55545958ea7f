package idem_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
)

// Steps on a Redis Cluster, with WithReplicas: keys over many slots (braces
// included), each operation's checkpoints in its record's slot, written
// through the master's pipelines with WAIT, resumed by the next attempt.
func TestStepsOnCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster of six redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 1)
	cc := cl.Client(t)
	c := idem.New(cc, idem.WithReplicas(1, 2*time.Second))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var runs stepRuns
	var fail atomic.Bool
	keys := []string{"{", "}", "a{b}c"}
	for i := range 30 {
		keys = append(keys, fmt.Sprint("debit-", i))
	}
	fail.Store(true)
	for _, k := range keys {
		if _, err := idem.Do(ctx, c, k, "fp", debitSteps(&runs, &fail)); err == nil {
			t.Fatalf("key %q: attempt 1 succeeded", k)
		}
		rs := cc.ClusterKeySlot(ctx, idem.RecordKey(c, k)).Val()
		if ss := cc.ClusterKeySlot(ctx, idem.RecordKey(c, k)+":steps").Val(); ss != rs {
			t.Fatalf("key %q: record slot %d, checkpoints' %d", k, rs, ss)
		}
	}
	fail.Store(false)
	for _, k := range keys {
		got, err := idem.Do(ctx, c, k, "fp", debitSteps(&runs, &fail))
		if want := "res#1 125 true ch#1 true"; err != nil || got != want {
			t.Fatalf("key %q: attempt 2: got %q, %v; want %q", k, got, err, want)
		}
		if r, n := runs.count(k, "reserve"), runs.count(k, "notify"); r != 1 || n != 2 {
			t.Fatalf("key %q: reserve ran %d times, notify %d; want 1 and 2", k, r, n)
		}
	}
}
