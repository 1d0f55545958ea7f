package idem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// stallLedger's Lookup finds nothing, slowly, while Redis refuses every
// command: the lease cannot be renewed during the lookup.
type stallLedger struct {
	mr    *miniredis.Miniredis
	stall time.Duration
}

func (l *stallLedger) Lookup(context.Context, string) (idem.Entry, bool, error) {
	l.mr.SetError("LOADING Redis is loading the dataset in memory")
	time.Sleep(l.stall)
	return idem.Entry{}, false, nil
}

func (l *stallLedger) MaxKeyLen() int { return 0 }

// A lookup so slow that less than a renewal period of the lease is left
// when it returns: fn does not start (ErrLeaseLost), for it could not be
// renewed in time to act under its lease. Lease 3 s (renewed every 1 s);
// the lookup takes 2.4 s, leaving about half a renewal period.
func TestLedgerSlowLookupLeavesTooLittleLease(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	const lease = 3 * time.Second
	l := &stallLedger{mr: b.MR, stall: 2400 * time.Millisecond}
	c := b.Idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true), idem.WithLease(lease),
		idem.WithStoreTimeout(100*time.Millisecond), idem.WithLogger(nil))
	var ran atomic.Bool
	_, err := c.Do(context.Background(), "k", "", func(context.Context) ([]byte, error) {
		ran.Store(true)
		return []byte("acted"), nil
	})
	b.MR.SetError("")
	if ran.Load() {
		t.Fatalf("fn ran with less than a renewal period of its lease left after the lookup (Do: %v)", err)
	}
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: %v; want ErrLeaseLost, fn not run", err)
	}
}
