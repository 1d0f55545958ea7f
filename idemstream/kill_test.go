//go:build linux

package idemstream_test

// Row 40 of docs/faults.md, without a ledger: consumer processes killed
// with SIGKILL at random points of their handlers, and restarted, while
// other consumers go on. The consumer processes are this test binary run
// again as TestChildConsumer, told what to do by environment variables;
// they report each step of their handler on stdout. Linux only: the
// children die with the test (Pdeathsig).

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

const (
	// childEnv, set to a Redis address, makes TestChildConsumer run;
	// childEnv_NAME is its consumer name.
	childEnv = "IDEMSTREAM_TEST_CHILD"
	// childTag starts every line the child reports.
	childTag = "idemstream-child:"
	// killStream and killGroup are the stream and the group of the test.
	killStream, killGroup = "events", "appliers"
	// killWorkers is each consumer's workers: a kill cuts at most this
	// many handlers short.
	killWorkers = 4
)

// killConsumer is the Consumer of the test's processes and of its own.
func killConsumer(t testing.TB, addr, name string) *idemstream.Consumer {
	return idemstream.New(newIdem(t, addr), newClient(t, addr), killStream, killGroup, name,
		idemstream.WithKey(eventKey), idemstream.WithWorkers(killWorkers), idemstream.WithClaimIdle(2*testLease),
		idemstream.WithMaxDeliveries(1000), idemstream.WithBackoff(10*time.Millisecond, 100*time.Millisecond), quiet)
}

// slowApply applies an event between short random pauses, reporting
// before and after the application: a kill lands before it, after it
// (before Do stored the outcome), or after the outcome was stored.
func slowApply(a *applier, report func(string)) idemstream.Handler {
	return func(ctx context.Context, m redis.XMessage) error {
		at, _ := idem.AttemptFrom(ctx)
		report(fmt.Sprintf("applying %s attempt=%d", eventKey(m), at.Number))
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		if err := a.apply(ctx, m); err != nil {
			return err
		}
		report(fmt.Sprintf("applied %s attempt=%d", eventKey(m), at.Number))
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return nil
	}
}

// TestChildConsumer is a consumer process of TestConsumersKilled: it
// consumes until it is killed.
func TestChildConsumer(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		t.Skip("a consumer process of TestConsumersKilled; runs only as its child")
	}
	c := killConsumer(t, addr, os.Getenv(childEnv+"_NAME"))
	report := func(s string) { fmt.Printf("%s %s\n", childTag, s) }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Fatalf("the consumer returned (%v) before the test killed it", c.Run(ctx, slowApply(newApplier(newClient(t, addr), "app"), report)))
}

// runChild starts a consumer process named name and kills it with SIGKILL
// once it has reported after lines steps of its handlers, or after 30
// seconds. It returns the last line reported.
func runChild(t *testing.T, addr, name string, after int) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildConsumer$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), childEnv+"="+addr, childEnv+"_NAME="+name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A child that stops reporting is killed all the same.
	timer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	sc := bufio.NewScanner(stdout)
	last, n := "", 0
	for n < after && sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), childTag+" "); ok {
			last, n = line, n+1
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if n < after {
		// It found too little work (a loaded machine started it late), or
		// it failed: the end state tells.
		t.Logf("consumer %s ended after %d steps, before its kill after %d: %s", name, n, after, stderr.String())
	}
	return last
}

// TestConsumersKilled: while a consumer of this process works through the
// stream, consumer processes are killed with SIGKILL at random steps of
// their handlers, eight times, and started again, under the same name or
// a new one. Every event is applied; none is left pending or
// dead-lettered. Without a ledger, an event whose consumer died after
// applying it and before its outcome was stored is applied again by the
// attempt that takes over (the handler must reconcile, or use the ledger:
// examples/events): each application is by an attempt of its own, and
// there are no more such events than the kills could cut short.
func TestConsumersKilled(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	rdb := newClient(t, addr)
	const kills, perKill = 8, 150 // events produced before each kill
	const events = kills * perKill
	rng := rand.New(rand.NewPCG(7, 8))
	a := newApplier(rdb, "app")
	// The steady consumer is slow, so that the children find work; it
	// also takes over what they leave.
	slow := slowApply(a, func(string) { time.Sleep(100 * time.Millisecond) })
	steady := start(t, idemstream.New(newIdem(t, addr), newClient(t, addr), killStream, killGroup, "steady",
		idemstream.WithKey(eventKey), idemstream.WithClaimIdle(2*testLease), idemstream.WithMaxDeliveries(1000),
		idemstream.WithBackoff(10*time.Millisecond, 100*time.Millisecond), quiet), slow)

	var last string
	entries := 0
	for i := range kills {
		var chunk []int
		for ev := i * perKill; ev < (i+1)*perKill; ev++ {
			chunk = append(chunk, ev)
			if rng.IntN(10) == 0 {
				chunk = append(chunk, ev)
			}
		}
		ids := produce(t, rdb, killStream, chunk)
		last, entries = ids[len(ids)-1], entries+len(chunk)
		name := fmt.Sprintf("child-%d", i/2) // each name twice: a restart takes its entries back
		t.Logf("%s killed after: %s", name, runChild(t, addr, name, 1+rng.IntN(60)))
	}
	// A fast consumer helps the steady one finish.
	fast := start(t, killConsumer(t, addr, "fast"), slowApply(a, func(string) {}))
	drained(t, rdb, killStream, killGroup, last, 3*time.Minute)
	for _, r := range []*running{steady, fast} {
		if err := r.stop(t); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}

	counts := a.counts(t)
	twice := 0
	for ev := range events {
		id := eventID(ev)
		n := counts[id]
		switch {
		case n == 0:
			t.Errorf("%s never applied", id)
		case n > 1:
			twice++
			at := a.attempts(t, id)
			seen := map[string]bool{}
			for _, s := range strings.Split(strings.TrimSuffix(at, ","), ",") {
				if seen[s] {
					t.Errorf("%s applied twice by attempt %s (attempts %s): two owners at once", id, s, at)
				}
				seen[s] = true
			}
		}
	}
	if twice > kills*killWorkers {
		t.Errorf("%d events applied more than once; %d kills of %d workers cut at most %d handlers short", twice, kills, killWorkers, kills*killWorkers)
	}
	if n := pending(t, rdb, killStream, killGroup); n != 0 {
		t.Errorf("XPENDING: %d entries pending, want 0", n)
	}
	if dl := deadLetters(t, rdb, killStream+":dead"); len(dl) != 0 {
		t.Errorf("dead-lettered %v, want none", dl)
	}
	t.Logf("%d entries for %d events; %d events applied twice, by a takeover after a kill (no ledger)", entries, events, twice)
}
