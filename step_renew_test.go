package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// A renewal keeps the step checkpoints for the retention, as the record:
// a checkpoint must outlive any takeover that could read it, not expire a
// lease after the last renewal.
func TestRenewalKeepsCheckpointsForTheRetention(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const lease, retention = 600 * time.Millisecond, time.Hour
	c := b.Idem(t, idem.WithLease(lease), idem.WithRetention(retention), idem.WithLogger(nil))
	var ttls []time.Duration
	_, err := c.Do(context.Background(), "k", "", func(ctx context.Context) ([]byte, error) {
		if _, err := idem.Step(ctx, "reserve", func(context.Context) (string, error) { return "r-1", nil }); err != nil {
			return nil, err
		}
		b.MR.SetTTL("idem:{k}:steps", time.Second) // renewals must set it back
		time.Sleep(3 * lease)                      // several renewals (every third of the lease)
		ttls = append(ttls, b.MR.TTL("idem:{k}:steps"), b.MR.TTL("idem:{k}"))
		return []byte("done"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ttls[0] < retention/2 || ttls[1] < retention/2 {
		t.Fatalf("after renewals: the checkpoints expire in %v, the record in %v; want both near the retention %v", ttls[0], ttls[1], retention)
	}
}
