package idem_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestSuiteBesideBusyGoroutines: FAULTS.md row 34, a slow machine. Part of
// the suite, tests whose promises involve time (waiters woken or polling,
// budgets, leases renewed, lost, taken over, a hanging renewal, claims
// whose outcome is unknown, a panicking owner), runs in this process
// beside twice as many busy goroutines as there are processors, which take
// the CPU from the tests' own goroutines (timers, the hub, renewals) as a
// loaded CI machine does. They must pass as they do alone: timings in tests
// have margins; speed lives in the benchmarks. (Run first, it found five
// tests whose leases or deadlines of 60 to 200ms left no margin.)
func TestSuiteBesideBusyGoroutines(t *testing.T) {
	// Not parallel: it loads every CPU on purpose, to slow the tests it runs.
	if testing.Short() {
		t.Skip("-short: keeps the CPU busy for about a minute")
	}
	n := 2 * runtime.GOMAXPROCS(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rounds atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-stop:
					rounds.Add(int64(x))
					return
				default:
				}
				for i := range 100_000 {
					x += i & 1
				}
			}
		}()
	}
	// A cleanup, not a defer: the tests below are parallel, and run after
	// this function returns; the cleanup runs after they end.
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		t.Logf("%d busy goroutines ran %d rounds beside the tests", n, rounds.Load())
	})
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"TestReplayRunsFnOnce", TestReplayRunsFnOnce},
		{"TestDuplicatesWaitForTheResult", TestDuplicatesWaitForTheResult},
		{"TestConflict", TestConflict},
		{"TestWaiterContextCancelled", TestWaiterContextCancelled},
		{"TestWaitBudgetEnds", TestWaitBudgetEnds},
		{"TestLostPublishEndsByPolling", TestLostPublishEndsByPolling},
		{"TestNotificationInTheSubscribeGap", TestNotificationInTheSubscribeGap},
		{"TestReleaseHandsOverToAWaiter", TestReleaseHandsOverToAWaiter},
		{"TestPanicWakesWaiters", TestPanicWakesWaiters},
		{"TestGoexitInFnReleases", TestGoexitInFnReleases},
		{"TestCrashedOwnerTakenOver", TestCrashedOwnerTakenOver},
		{"TestStaleOwnerLosesLease", TestStaleOwnerLosesLease},
		{"TestLeaseLossCancelsFn", TestLeaseLossCancelsFn},
		{"TestLeaseRenewedWhileFnRuns", TestLeaseRenewedWhileFnRuns},
		{"TestManyLeasesRenewed", TestManyLeasesRenewed},
		{"TestHangingRenewalEndsFnContext", TestHangingRenewalEndsFnContext},
		{"TestClaimOutcomeUnknown", TestClaimOutcomeUnknown},
		{"TestEventWaitedAndInProgress", TestEventWaitedAndInProgress},
		{"TestFnDeadlineIsTheCallers", TestFnDeadlineIsTheCallers},
	} {
		t.Run(tc.name, tc.test)
	}
}
