// kill.go: the suite's kill scenario. A child process (this test binary,
// run again on the one subtest) debits through the ledger and is killed
// with SIGKILL at random points, often right after a COMMIT and before
// Redis hears of it; started again, it takes its keys over. Every key
// must end with one movement and its first commit's receipt.

package ledgertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// Reopener is implemented by a backend that a child process can open
// again: the suite's kill scenario runs only for a Driver with Reopen and
// a Backend with DSN.
type Reopener interface {
	// DSN returns what Driver.Reopen needs to open the backend's database
	// in another process.
	DSN() string
}

// The child's environment.
const (
	childEnv   = "IDEM_LEDGERTEST_CHILD" // the DSN of the backend to reopen
	childRedis = "IDEM_LEDGERTEST_REDIS" // the Redis address
	childKeys  = "IDEM_LEDGERTEST_KEYS"  // how many keys
	childLine  = "ledgertest-child: "    // the prefix of the child's reports
	killKeys   = 20
	killLease  = 500 * time.Millisecond
	maxKills   = 8
)

// childMode reports whether this process is a child of the kill scenario,
// and if so runs it: Exercise then runs nothing else.
func childMode(t *testing.T, d Driver) bool {
	dsn, ok := os.LookupEnv(childEnv)
	if !ok {
		return false
	}
	if d.Reopen == nil {
		t.Fatal("ledgertest: a kill scenario's child, for a Driver without Reopen")
	}
	n, err := strconv.Atoi(os.Getenv(childKeys))
	if err != nil {
		t.Fatal(err)
	}
	b := d.Reopen(t, dsn)
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childRedis)})
	t.Cleanup(func() { rdb.Close() })
	e := &env{t: t, b: b, redis: rdb}
	c := e.clientAt(rdb, "kill", idem.WithLease(killLease), idem.WithRetention(time.Hour))
	out := bufio.NewWriter(os.Stdout)
	report := func(f string, args ...any) {
		fmt.Fprintf(out, childLine+f+"\n", args...)
		out.Flush()
	}
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprint("key-", i)
		for {
			_, err := c.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				a, _ := idem.AttemptFrom(ctx)
				v := []byte(fmt.Sprintf("receipt of %s by pid %d attempt %d", key, os.Getpid(), a.Number))
				if err := e.debit(key, v)(ctx); err != nil {
					return nil, err
				}
				report("committed %s", key) // the parent may kill here: after COMMIT, before Redis
				return v, nil
			})
			if err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond) // in progress (a dead child's lease), or the database
		}
		report("done %s", key)
	}
	report("all done")
	return true
}

// killedChild is the scenario's parent side.
func killedChild(t *testing.T, e *env, d Driver) {
	r, ok := e.b.(Reopener)
	if !ok || d.Reopen == nil {
		t.Skip("the driver has no Reopen, or its backend no DSN: a child process cannot open its database")
	}
	if testing.Short() {
		t.Skip("-short: the kill scenario starts child processes")
	}
	// The child runs this very subtest of the parent's test binary.
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	pattern = pattern[:len(pattern)-1] // the child runs Exercise, not this scenario
	run := strings.Join(pattern, "/")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	finished := false
	kills, afterCommit := 0, 0
	for start := 0; start <= maxKills && !finished; start++ {
		cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), childEnv+"="+r.DSN(), childRedis+"="+e.redis.Options().Addr, childKeys+"="+strconv.Itoa(killKeys))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a random number of reports, the last start excepted.
		killAfter := -1
		if start < maxKills {
			killAfter = 1 + rng.IntN(2*killKeys/3)
		}
		lines := bufio.NewScanner(stdout)
		seen := 0
		killed := false
		for lines.Scan() {
			line, ok := strings.CutPrefix(lines.Text(), childLine)
			if !ok {
				continue
			}
			if line == "all done" {
				finished = true
				continue
			}
			seen++
			// Even starts are killed right after a COMMIT, odd ones at
			// whatever report comes.
			if seen >= killAfter && killAfter > 0 && (strings.HasPrefix(line, "committed") || start%2 == 1) {
				_ = cmd.Process.Kill()
				killed = true
				kills++
				if strings.HasPrefix(line, "committed") {
					afterCommit++
				}
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		err = cmd.Wait()
		if !killed && !finished {
			t.Fatalf("child %d ended without finishing: %v\n%s", start, err, stderr.String())
		}
	}
	if !finished {
		t.Fatalf("the child did not finish its %d keys after %d kills", killKeys, maxKills)
	}
	if kills == 0 || afterCommit == 0 {
		t.Fatalf("%d kills, %d right after a COMMIT: the scenario did not test what it says", kills, afterCommit)
	}
	t.Logf("%d keys, %d kills with SIGKILL, %d of them right after a COMMIT", killKeys, kills, afterCommit)
	// Every key: one movement, the ledger's receipt replayed, and a
	// Client that lost Redis gets the same.
	c := e.clientAt(e.redis, "kill", idem.WithLease(killLease), idem.WithRetention(time.Hour))
	e.flush()
	for i := range killKeys {
		key := fmt.Sprint("key-", i)
		en, ok := e.lookup(key)
		if !ok {
			t.Fatalf("%s: no ledger entry", key)
		}
		if m := e.movements(key); m != 1 {
			t.Fatalf("%s: %d movements; want 1", key, m)
		}
		got, err := c.Do(context.Background(), key, "fp", raw([]byte("again"), e.debit(key, []byte("again"))))
		if err != nil || string(got) != string(en.Value) {
			t.Fatalf("%s after FLUSHALL: %q, %v; want the ledger's %q", key, got, err, en.Value)
		}
		if m := e.movements(key); m != 1 {
			t.Fatalf("%s: %d movements after a retry; want 1", key, m)
		}
	}
}
