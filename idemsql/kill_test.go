package idemsql_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// The environment of TestChildDebiter, set by TestKilledDebiter.
const (
	childEnv      = "IDEMSQL_CHILD"       // "1" in the child
	childBackend  = "IDEMSQL_CHILD_DB"    // postgres or sqlite
	childDSN      = "IDEMSQL_CHILD_DSN"   // the bank's database
	childRedis    = "IDEMSQL_CHILD_REDIS" // the Redis address
	childOps      = "IDEMSQL_CHILD_OPS"   // how many operations
	childLease    = time.Second
	killOps       = 40
	kills         = 6
	maxKillDelay  = 300 * time.Millisecond
	childDeadline = 2 * time.Minute
)

// amountOf is operation i's amount: all differ, so a balance shows which
// were applied.
func amountOf(i int) int64 { return int64(1) << (i % 20) * int64(i+1) }

// A process that debits through the ledger is killed with SIGKILL at
// random points, half of the kills right after a commit and before Do
// stored the outcome in Redis; each time it is started again and runs its
// operations from the first. Its fn has no reconcile code: it applies the
// change and commits the outcome, nothing else. At the end every operation
// is applied exactly once, and no operation committed twice; and after a
// commit, fn did not run again: the takeover's lookup found the outcome.
func TestKilledDebiter(t *testing.T) {
	eachBank(t, func(t *testing.T, b *bank) {
		seed := time.Now().UnixNano()
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(uint64(seed), 0))
		commits := map[string]int{}
		var rerunAfterCommit []string // ops whose fn started again after their commit
		var killedAfterCommit, killedElsewhere int
		for run := 0; ; run++ {
			last := run == kills
			afterCommit := run%2 == 0
			delay := time.Duration(rng.Int64N(int64(maxKillDelay)))
			cmd := exec.Command(os.Args[0], "-test.run=^TestChildDebiter$", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"=1", childBackend+"="+b.name, childDSN+"="+b.dsn,
				childRedis+"="+b.redis.Addr(), childOps+"="+strconv.Itoa(killOps))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				_, _ = io.Copy(io.Discard, out)
			}()
			var timer <-chan time.Time
			var output strings.Builder // the child's lines other than the protocol's
			deadline := time.After(childDeadline)
			killed, finished := false, false
		read:
			for {
				select {
				case line, ok := <-lines:
					if !ok {
						break read
					}
					if op, ok := strings.CutPrefix(line, "fn "); ok && commits[op] > 0 {
						rerunAfterCommit = append(rerunAfterCommit, op)
					}
					if op, ok := strings.CutPrefix(line, "committed "); ok {
						commits[op]++
						if !last && afterCommit && !killed {
							_ = cmd.Process.Kill()
							killed = true
							killedAfterCommit++
						}
					}
					if line == "started" && !last && !afterCommit {
						timer = time.After(delay)
					}
					switch {
					case line == "all done":
						finished = true
					case line == "started", strings.HasPrefix(line, "fn "), strings.HasPrefix(line, "committed "):
					default:
						output.WriteString(line + "\n")
					}
				case <-timer:
					if !killed {
						_ = cmd.Process.Kill()
						killed = true
						killedElsewhere++
					}
				case <-deadline:
					_ = cmd.Process.Kill()
					t.Fatalf("run %d: the child did not finish in %v; stderr:\n%s", run, childDeadline, stderr.String())
				}
			}
			werr := cmd.Wait()
			if (last || !killed) && (werr != nil || !finished) {
				t.Fatalf("run %d: %v, finished %v; output:\n%s%s", run, werr, finished, output.String(), stderr.String())
			}
			if last {
				break
			}
			if finished {
				// Killed too late: it had finished all its operations.
				t.Logf("run %d finished before its kill", run)
			}
		}
		t.Logf("%d kills right after a commit, %d at random points (up to %v)", killedAfterCommit, killedElsewhere, maxKillDelay)
		if killedAfterCommit < kills/2 {
			t.Errorf("only %d kills fell between a commit and the Redis completion, want %d", killedAfterCommit, kills/2)
		}
		var want int64
		for i := range killOps {
			op := "op-" + strconv.Itoa(i)
			want += amountOf(i)
			if n := b.movements(t, op); n != 1 {
				t.Errorf("%s applied %d times, want 1", op, n)
			}
			if n := commits[op]; n != 1 {
				t.Errorf("%s committed %d times, want 1 (a takeover after a commit must find it in the ledger)", op, n)
			}
		}
		if n := b.balance(t); n != opening-want {
			t.Errorf("balance %d, want %d", n, opening-want)
		}
		if len(rerunAfterCommit) > 0 {
			t.Errorf("fn ran again after its commit for %v: the takeover's lookup should have found the outcome", rerunAfterCommit)
		}
		if n := b.rows(t); n != killOps {
			t.Errorf("%d ledger rows, want %d", n, killOps)
		}
	})
}

// TestChildDebiter is the process TestKilledDebiter kills: it runs the
// debits one after the other, printing "fn OP" when fn starts, "committed
// OP" right after each
// commit (and pausing a little before fn returns, so that a kill lands
// between the commit and the Redis completion), and "all done" at the end.
func TestChildDebiter(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("the child process of TestKilledDebiter")
	}
	ctx := context.Background()
	be := backendNamed(os.Getenv(childBackend))
	db := be.Reopen(t, os.Getenv(childDSN))
	b := &bank{name: be.Name, db: db, dialect: dialects[be.Name]}
	b.ledger = idemsql.New(db, b.dialect)
	rdb := redisClient(t, os.Getenv(childRedis))
	c := b.clientOn(t, rdb, idem.WithLease(childLease), idem.WithWait(time.Minute))
	n, _ := strconv.Atoi(os.Getenv(childOps))
	fmt.Println("started")
	for i := range n {
		op := "op-" + strconv.Itoa(i)
		debit := b.debit(op, amountOf(i))
		_, err := idem.Do(ctx, c, op, fingerprint(op, amountOf(i)), func(ctx context.Context) (Receipt, error) {
			fmt.Println("fn", op)
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			r, err := debit(ctx)
			if err == nil {
				fmt.Println("committed", op)
				time.Sleep(20 * time.Millisecond) // between the commit and the completion
			}
			return r, err
		})
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	fmt.Println("all done")
}
