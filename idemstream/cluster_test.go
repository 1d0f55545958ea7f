package idemstream_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/internal/redistest"
)

// TestCluster: on a Redis Cluster of three masters, with the stream, its
// dead-letter stream and idem's records in slots of their own, two
// consumers apply every event once, producer duplicates included.
func TestCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, 0)
	rdb := cl.Client(t)
	var events []int
	for ev := range 300 {
		events = append(events, ev)
		if ev%10 == 0 {
			events = append(events, ev)
		}
	}
	ids := produce(t, rdb, "events", events)
	a := newApplier(rdb, "{app}")
	for _, name := range []string{"c1", "c2"} {
		keys := idem.New(cl.Client(t), idem.WithLease(testLease), idem.WithLogger(nil))
		t.Cleanup(func() { _ = keys.Close() })
		c := idemstream.New(keys, cl.Client(t), "events", "appliers", name, idemstream.WithKey(eventKey), idemstream.WithWorkers(4), quiet)
		start(t, c, a.apply)
	}
	drained(t, rdb, "events", "appliers", ids[len(ids)-1], 2*time.Minute)
	counts := a.counts(t)
	for ev := range 300 {
		if n := counts[eventID(ev)]; n != 1 {
			t.Errorf("%s applied %d times, want 1", eventID(ev), n)
		}
	}
	if n := pending(t, rdb, "events", "appliers"); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
}
