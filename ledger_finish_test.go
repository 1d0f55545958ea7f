package idem_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

// A failure the ledger holds for other parameters is a conflict, not a
// replay of that failure: the call with other parameters is another
// operation, and must not be told it was declined.
func TestLedgerFailedEntryOfOtherParameters(t *testing.T) {
	t.Parallel()
	idemtest.EachBackend(t, func(t *testing.T, b *idemtest.Backend) {
		ctx := context.Background()
		l := newMemLedger()
		c := b.Idem(t, idem.WithLedger(l), idem.WithLedgerLookups(true), idem.WithLogger(nil))
		declined := errors.New("card declined")
		if _, err := c.Do(ctx, "k", "debit 100", func(ctx context.Context) ([]byte, error) {
			return nil, commitFailure(ctx, l, declined)
		}); !errors.Is(err, declined) {
			t.Fatalf("owner: %v", err)
		}
		b.Do(t, "DEL", "idem:{k}") // Redis lost the record
		_, err := c.Do(ctx, "k", "debit 999", l.fnFails(t))
		var se *idem.StoredError
		if !errors.Is(err, idem.ErrConflict) || errors.As(err, &se) {
			t.Fatalf("other parameters, the ledger holding a failure: %v; want ErrConflict, not the failure", err)
		}
	})
}

// failScript fails every EVALSHA of one script, and lets the rest through.
type failScript struct {
	sha   string
	on    atomic.Bool
	fails atomic.Int64
}

func (f *failScript) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (f *failScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); f.on.Load() && len(args) > 1 && strings.EqualFold(args[0].(string), "evalsha") && args[1] == f.sha {
			f.fails.Add(1)
			err := errors.New("LOADING Redis is loading the dataset in memory")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (f *failScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// When the record of a ledger's outcome cannot be written to Redis, the
// claim is given back at once: the next caller takes over without waiting
// for the lease, finds the row and finishes the record. Lease 1 minute,
// WithWait(0): the next caller would get ErrInProgress if the claim were
// kept.
func TestLedgerRecordNotWrittenReleasesTheClaim(t *testing.T) {
	t.Parallel()
	b := idemtest.Miniredis(t)
	ctx := context.Background()
	l := newMemLedger()
	f := &failScript{sha: idemtest.ScriptSHA(t, "complete")}
	rdb := b.Client(t)
	rdb.AddHook(f)
	opts := []idem.Option{idem.WithLedger(l), idem.WithLease(time.Minute), idem.WithWait(0),
		idem.WithPipelines(0), idem.WithStoreTimeout(200 * time.Millisecond), idem.WithLogger(nil)}
	c := idem.New(rdb, opts...)
	t.Cleanup(func() { c.Close() })
	got, err := c.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
		err := commit(ctx, l, []byte("done"))
		f.on.Store(true)
		return []byte("done"), err
	})
	f.on.Store(false)
	if f.fails.Load() == 0 {
		t.Fatal("the completion was not attempted")
	}
	if string(got) != "done" {
		t.Fatalf("owner: %q, %v; want the committed outcome", got, err)
	}
	if err := c.Close(); err != nil { // waits for the release under way
		t.Fatal(err)
	}
	next := b.Idem(t, opts[:1]...)
	got, err = next.Do(ctx, "k", "fp", l.fnFails(t))
	if err != nil || string(got) != "done" {
		t.Fatalf("the next caller: %q, %v; want the ledger's outcome at once, the claim given back", got, err)
	}
}
