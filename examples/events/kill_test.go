//go:build linux

package main

// A consumer process is killed with SIGKILL in the middle of its handler,
// on a real redis-server. The consumer is this test binary run again as a
// child (TestChildConsumer), told what to do by environment variables; it
// reports on its stdout. Linux only: the child dies with the test
// (Pdeathsig).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	// childEnv, set to a Redis address, makes TestChildConsumer run; the
	// variables with its name as a prefix say which event to stop at, and
	// where.
	childEnv = "EVENTS_TEST_CHILD"
	// childTag starts every line the child reports.
	childTag = "events-child:"
	// killPrefix is the key prefix of the killed consumer's run.
	killPrefix = "kill:"
	// childLease is the killed consumer's lease: its claim holds the event
	// this long after its death. The consumers that take over use a longer
	// one (takeoverLease), so that a loaded machine does not make them lose
	// their own.
	childLease    = time.Second
	takeoverLease = 5 * time.Second
)

// killStream is the stream of the killed consumer's run: the child reads
// five entries at a time, so it has read entries beyond the one it dies in.
func killStream() stream {
	return stream{key: killPrefix + "stream", group: "appliers", batch: 5, block: 100 * time.Millisecond, minIdle: time.Second}
}

// TestChildConsumer is the consumer process of TestConsumerKilledMidHandler.
// It consumes the stream through idem.Do; when it is about to apply the
// event named by childEnv_EVENT (or has just applied it, when childEnv_AFTER
// is "1"), it reports "in handler <event> attempt=<n>" and waits for its
// stdin, which never answers: the test kills it there.
func TestChildConsumer(t *testing.T) {
	addr := os.Getenv(childEnv)
	if addr == "" {
		t.Skip("the consumer process of TestConsumerKilledMidHandler; runs only as its child")
	}
	target, after := os.Getenv(childEnv+"_EVENT"), os.Getenv(childEnv+"_AFTER") == "1"
	rdb := newTestClient(t, addr)
	keys := idem.New(rdb, idem.WithPrefix(killPrefix+"records"), idem.WithLease(childLease))
	defer keys.Close()
	stdin := bufio.NewReader(os.Stdin)
	c := &consumer{name: "child", rdb: rdb, keys: keys, ledger: newLedger(rdb, killPrefix), s: killStream(), stats: new(stats)}
	c.hook = func(ctx context.Context, ev event, applied bool) error {
		if ev.ID != target || applied != after {
			return nil
		}
		a, _ := idem.AttemptFrom(ctx)
		fmt.Printf("%s in handler %s attempt=%d\n", childTag, ev.ID, a.Number)
		_, err := stdin.ReadString('\n')
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Fatalf("the consumer returned %v before the test killed it", c.run(ctx))
}

// child is a running TestChildConsumer.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser // kept open and never written: the child waits on it
	lines  chan string    // the child's reports, without childTag; closed at its exit
	exited chan struct{}  // closed once the child was waited for
	stderr bytes.Buffer   // read only after exited is closed
	err    error          // cmd.Wait's error, after exited is closed
}

// startChild starts a consumer process on the Redis at addr that stops at
// the event target, before applying it or, with after, right after. It is
// killed, if still running, when the test ends.
func startChild(t *testing.T, addr, target string, after bool) *child {
	t.Helper()
	c := &child{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestChildConsumer$", "-test.count=1", "-test.timeout=2m")
	c.cmd.Env = append(os.Environ(), childEnv+"="+addr, childEnv+"_EVENT="+target, fmt.Sprintf("%s_AFTER=%d", childEnv, map[bool]int{true: 1}[after]))
	c.cmd.Stderr = &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), childTag+" "); ok {
				c.lines <- line
			}
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

// expect returns the rest of the child's next report, which must start
// with prefix.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if rest, found := strings.CutPrefix(line, prefix); ok && found {
			return strings.TrimSpace(rest)
		}
		if ok {
			t.Fatalf("the child reported %q, want %q...", line, prefix)
		}
	case <-time.After(30 * time.Second):
	}
	c.kill()
	t.Fatalf("the child did not report %q (%v); its stderr:\n%s", prefix, c.err, c.stderr.String())
	return ""
}

// kill kills the child with SIGKILL, if it still runs, and waits until it
// is gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	for range c.lines {
	}
	<-c.exited
}

// killWorkload returns 24 events, every fourth of them sent twice (the
// duplicate three entries later), and the event the child stops at, one
// of the duplicated ones, in the child's second batch.
func killWorkload() (entries []event, target string) {
	var late []event // duplicates, each due three entries after its event
	var due []int
	for i := 1; i <= 24; i++ {
		ev := event{ID: fmt.Sprintf("evt-%04d", i), Account: fmt.Sprintf("acct-%d", i%3+1), Amount: int64(i)}
		entries = append(entries, ev)
		if i%4 == 0 {
			late, due = append(late, ev), append(due, len(entries)+3)
		}
		for len(due) > 0 && due[0] <= len(entries) {
			entries = append(entries, late[0])
			late, due = late[1:], due[1:]
		}
	}
	return append(entries, late...), "evt-0008"
}

// TestConsumerKilledMidHandler kills a consumer process with SIGKILL while
// its handler holds an event, before it applied it to the ledger or just
// after, and shows from the ledger that every event is applied exactly
// once: the dead consumer's entries go to the other consumers (XAUTOCLAIM),
// whose idem.Do takes its claim over once its lease ended, as attempt 2,
// which finds the event in the ledger if the dead attempt applied it; and
// the events the producer sent twice are applied once.
func TestConsumerKilledMidHandler(t *testing.T) {
	for _, after := range []bool{false, true} {
		name := map[bool]string{false: "before-applying", true: "after-applying"}[after]
		t.Run(name, func(t *testing.T) { testConsumerKilled(t, after) })
	}
}

func testConsumerKilled(t *testing.T, after bool) {
	srv := redistest.Start(t, redistest.Config{})
	ctx := context.Background()
	admin := newTestClient(t, srv.Addr())
	l := newLedger(admin, killPrefix)
	s := killStream()
	entries, target := killWorkload()
	last, err := produce(ctx, admin, s, entries)
	if err != nil {
		t.Fatal(err)
	}

	ch := startChild(t, srv.Addr(), target, after)
	if got, want := ch.expect(t, "in handler"), target+" attempt=1"; got != want {
		t.Fatalf("the child's handler holds %q, want %q", got, want)
	}
	ch.kill()

	// What the dead consumer left: the event applied or not, its claim in
	// progress, and the entries it read but did not acknowledge.
	applied, err := l.applications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := applied[target], map[bool]int{true: 1}[after]; got != want {
		t.Fatalf("the dead consumer applied %s %d times, want %d", target, got, want)
	}
	records := idem.New(admin, idem.WithPrefix(killPrefix+"records"))
	defer records.Close()
	if st, err := records.Status(ctx, target); err != nil || st.State != idem.StateInProgress || st.Attempt != 1 {
		t.Fatalf("the dead consumer's record of %s: %+v, %v; want in progress, attempt 1", target, st, err)
	}
	left, err := admin.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.key, Group: s.group, Consumer: "child", Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) < 2 {
		t.Fatalf("the dead consumer left %d entries unacknowledged, want its event and more of its batch", len(left))
	}

	// Two consumers in this process take over.
	var st stats
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		rdb := newTestClient(t, srv.Addr())
		wg.Go(func() {
			keys := idem.New(rdb, idem.WithPrefix(killPrefix+"records"), idem.WithLease(takeoverLease))
			defer keys.Close()
			c := &consumer{name: fmt.Sprint("live-", i+1), rdb: rdb, keys: keys, ledger: newLedger(rdb, killPrefix), s: s, stats: &st}
			errs[i] = c.run(runCtx)
		})
	}
	err = waitAcked(ctx, admin, s, last, time.Minute)
	stop()
	wg.Wait()
	if err := errors.Join(append(errs, err)...); err != nil {
		t.Fatal(err)
	}

	// Every event applied exactly once, the duplicated ones too.
	if applied, err = l.applications(ctx); err != nil {
		t.Fatal(err)
	}
	var wrong []string
	dups := 0
	seen := make(map[string]bool)
	for _, ev := range entries {
		if seen[ev.ID] {
			dups++
		} else if n := applied[ev.ID]; n != 1 {
			wrong = append(wrong, fmt.Sprintf("%s %d times", ev.ID, n))
		}
		seen[ev.ID] = true
	}
	if len(wrong) > 0 || len(applied) != len(seen) {
		t.Errorf("the ledger applied %s, and %d events in all; want each of the %d events once", strings.Join(wrong, ", "), len(applied), len(seen))
	}
	res, err := tally(ctx, l, entries)
	if err != nil {
		t.Fatal(err)
	}
	if !res.exactlyOnce() || dups == 0 {
		t.Errorf("ledger: %+v after %d duplicate entries; want every event applied once and every balance right", res, dups)
	}
	if got := int(st.reclaimed.Load()); got < len(left) {
		t.Errorf("the live consumers took %d entries over, want at least the %d the dead one left", got, len(left))
	}

	// The event was taken over: a later attempt recorded its outcome, and
	// found the event in the ledger exactly when the dead one had applied
	// it (an attempt after 2 follows one that died or failed while live,
	// and may find it either way).
	final, err := records.Status(ctx, target)
	if err != nil || final.State != idem.StateDone || final.Attempt < 2 {
		t.Fatalf("the record of %s: %+v, %v; want done by attempt 2 or later", target, final, err)
	}
	var ev event
	for _, e := range entries {
		if e.ID == target {
			ev = e
		}
	}
	got, err := idem.Do(ctx, records, target, idem.Fingerprint(ev.Account, ev.Amount), func(context.Context) (Applied, error) {
		t.Error("fn ran for an event whose outcome is recorded")
		return Applied{}, nil
	})
	if err != nil || got.Event != target || got.Attempt != final.Attempt {
		t.Fatalf("replay of %s: %+v, %v; want its outcome, from attempt %d", target, got, err, final.Attempt)
	}
	if got.Attempt == 2 && got.Reconciled != after {
		t.Errorf("attempt 2 found the event in the ledger: %v, want %v", got.Reconciled, after)
	}
	if after && !got.Reconciled {
		t.Errorf("the attempt that recorded %s applied it again, though the dead attempt had", target)
	}
}
