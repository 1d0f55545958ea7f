//go:build linux

package idem_test

// Row 39 of docs/faults.md: a process running three-step operations is
// killed with SIGKILL at random points, restarted, killed again, and so
// on; then one run finishes them all. The middle step charges through a
// fake provider (an httptest server with Stripe-like idempotency: one
// charge per Idempotency-Key). The process is this test binary run again
// as a child (TestChildStepsOwner), which kills itself at the point the
// test names. Linux only.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	// stepsChildEnv, set to a Redis address, makes TestChildStepsOwner
	// run; the variables with its name as a prefix say where the
	// provider is and where to die.
	stepsChildEnv = "IDEM_TEST_STEPS_CHILD"
	stepsChildTag = "idem-steps-child:"
	// stepsLease is the children's lease: a killed child's claim holds
	// its operation this long. At 1 s a child that was not to die lost
	// its lease in a suite run at load average 10 (a renewal has two
	// thirds of the lease to succeed): 3 s.
	stepsLease = 3 * time.Second
	stepsOps   = 4
)

// The points where a child may die, in the order fn passes them. A point
// inside step 1 after its effect is not among them: a crash there runs
// step 1 again (its checkpoint was not written), as it would any effect;
// step 2 shows that window, covered by the provider's idempotency.
var stepsKillPoints = []string{
	"before-reserve",     // fn started, no step yet
	"after-reserve",      // step 1 checkpointed
	"before-charge-call", // inside step 2, before the provider call
	"after-charge-call",  // inside step 2: the provider charged, no checkpoint
	"after-charge",       // step 2 checkpointed
	"after-notify",       // step 3 checkpointed, fn not returned
}

// TestChildStepsOwner is the process of TestStepsKilledAtRandomPoints. It
// runs operations op-1 to op-4 in order, each a Do of three steps:
// reserve (INCR in Redis), charge (POST to the provider with the step's
// key), notify (INCR). It reports each result, and kills itself with
// SIGKILL at the point named by stepsChildEnv_KILL ("op-2 after-reserve").
func TestChildStepsOwner(t *testing.T) {
	t.Parallel()
	addr := os.Getenv(stepsChildEnv)
	if addr == "" {
		t.Skip("the process of TestStepsKilledAtRandomPoints; runs only as its child")
	}
	provider := os.Getenv(stepsChildEnv + "_PROVIDER")
	killOp, killPoint, _ := strings.Cut(os.Getenv(stepsChildEnv+"_KILL"), " ")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := idem.New(rdb, idem.WithPrefix("steps"), idem.WithLease(stepsLease), idem.WithWait(30*time.Second))
	defer c.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections() // the child checks for leaks too
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx := context.Background()
	for i := 1; i <= stepsOps; i++ {
		op := fmt.Sprint("op-", i)
		point := func(p string) {
			if op == killOp && p == killPoint {
				fmt.Printf("%s dying %s %s\n", stepsChildTag, op, p)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // SIGKILL is not delivered later than this
			}
		}
		res, err := idem.Do(ctx, c, op, "fp", func(ctx context.Context) (string, error) {
			point("before-reserve")
			reserved, err := idem.Step(ctx, "reserve", func(ctx context.Context) (string, error) {
				a, _ := idem.AttemptFrom(ctx)
				if err := rdb.Incr(ctx, "effects:reserve:"+op).Err(); err != nil {
					return "", err
				}
				return fmt.Sprint("res#", a.Number), nil
			})
			if err != nil {
				return "", err
			}
			point("after-reserve")
			charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				point("before-charge-call")
				body, err := postCharge(ctx, hc, provider, op)
				if err != nil {
					return "", err
				}
				point("after-charge-call")
				return body, nil
			})
			if err != nil {
				return "", err
			}
			point("after-charge")
			_, err = idem.Step(ctx, "notify", func(ctx context.Context) (struct{}, error) {
				return struct{}{}, rdb.Incr(ctx, "effects:notify:"+op).Err()
			})
			if err != nil {
				return "", err
			}
			point("after-notify")
			return reserved + "/" + charge, nil
		})
		fmt.Printf("%s result %s %q %v\n", stepsChildTag, op, res, err)
	}
	fmt.Printf("%s finished\n", stepsChildTag)
}

// postCharge asks the provider at provider to charge op, with the key of
// the step called "charge" as its Idempotency-Key (from that step's fn), and
// returns the provider's answer: the charge's id.
func postCharge(ctx context.Context, hc *http.Client, provider, op string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider+"/charges", strings.NewReader("op="+op))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", strconv.Quote(idem.StepKey(ctx, "charge")))
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("provider: %d %s %v", resp.StatusCode, body, err)
	}
	return string(body), nil
}

// stepsProvider is a fake payment provider with Stripe-like idempotency:
// the first POST with an Idempotency-Key charges, and every later one with
// that key gets the first one's answer.
type stepsProvider struct {
	mu       sync.Mutex
	byKey    map[string]string         // key -> the charge's id
	requests map[string]int            // key -> requests
	opKeys   map[string]map[string]int // op -> keys it was charged under -> requests
	charges  map[string]int            // op -> charges made
	bad      []string
}

func (p *stepsProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	op, _ := strings.CutPrefix(string(body), "op=")
	key, err := strconv.Unquote(r.Header.Get("Idempotency-Key"))
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || key == "" {
		p.bad = append(p.bad, fmt.Sprintf("%s: Idempotency-Key %q", op, r.Header.Get("Idempotency-Key")))
		http.Error(w, "no key", http.StatusBadRequest)
		return
	}
	p.requests[key]++
	if p.opKeys[op] == nil {
		p.opKeys[op] = map[string]int{}
	}
	p.opKeys[op][key]++
	id, ok := p.byKey[key]
	if !ok {
		p.charges[op]++
		id = fmt.Sprintf("ch_%s_%d", op, p.charges[op])
		p.byKey[key] = id
	}
	_, _ = io.WriteString(w, id)
}

// stepsPlan returns kills of a run over stepsOps operations: each an
// operation and a point that the child reaches, as the children run the
// operations in order (earlier ones finish first), and a step whose fn
// ran to its checkpoint is not run again.
func stepsPlan(rng *rand.Rand, kills int) [][2]string {
	type state struct{ charged bool } // step 2 checkpointed
	ops := make([]state, stepsOps+1)
	var plan [][2]string
	op := 1
	for len(plan) < kills && op <= stepsOps {
		op += rng.IntN(2) // stay on the operation, or move to the next
		if op > stepsOps {
			break
		}
		var reachable []string
		for _, p := range stepsKillPoints {
			inCharge := p == "before-charge-call" || p == "after-charge-call"
			if !inCharge || !ops[op].charged {
				reachable = append(reachable, p)
			}
		}
		p := reachable[rng.IntN(len(reachable))]
		if p == "after-charge" || p == "after-notify" {
			ops[op].charged = true
		}
		plan = append(plan, [2]string{fmt.Sprint("op-", op), p})
	}
	return plan
}

func TestStepsKilledAtRandomPoints(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("IDEM_STEPS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (IDEM_STEPS_SEED=%d reruns this plan)", seed, seed)
	plan := stepsPlan(rand.New(rand.NewPCG(seed, 39)), 6)
	t.Logf("kills: %v", plan)

	srv := redistest.Start(t, redistest.Config{})
	p := &stepsProvider{byKey: map[string]string{}, requests: map[string]int{}, opKeys: map[string]map[string]int{}, charges: map[string]int{}}
	ps := httptest.NewServer(p)
	defer ps.Close()

	results := map[string]map[string]bool{} // op -> results reported
	killedInCharge := map[string]bool{}     // ops killed after the provider charged, before the checkpoint
	run := func(kill string) {
		t.Helper()
		child := idemtest.StartChild(t, "TestChildStepsOwner", stepsChildTag,
			stepsChildEnv+"="+srv.Addr(), stepsChildEnv+"_PROVIDER="+ps.URL, stepsChildEnv+"_KILL="+kill)
		var died, finished bool
		for line := range child.Reports() {
			f := strings.Fields(line)
			switch {
			case f[0] == "dying":
				died = true
			case f[0] == "finished":
				finished = true
			case f[0] == "result" && len(f) >= 4 && f[3] == "<nil>":
				if results[f[1]] == nil {
					results[f[1]] = map[string]bool{}
				}
				results[f[1]][f[2]] = true
			default:
				t.Errorf("the child reported %q", line)
			}
		}
		stderr, err := child.Exited(t)
		ws, _ := child.State().Sys().(syscall.WaitStatus)
		switch {
		case kill != "" && (!died || !ws.Signaled() || ws.Signal() != syscall.SIGKILL):
			t.Fatalf("the child to kill at %q: died=%v, exit %v\n%s", kill, died, err, stderr)
		case kill == "" && (!finished || err != nil):
			t.Fatalf("the last child: finished=%v, exit %v\n%s", finished, err, stderr)
		}
	}
	for _, k := range plan {
		run(k[0] + " " + k[1])
		if k[1] == "after-charge-call" {
			killedInCharge[k[0]] = true
		}
	}
	run("")

	rdb := srv.Client(t)
	ctx := context.Background()
	keys := map[string]string{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.bad {
		t.Error("provider: " + b)
	}
	for i := 1; i <= stepsOps; i++ {
		op := fmt.Sprint("op-", i)
		if n, err := rdb.Get(ctx, "effects:reserve:"+op).Int(); n != 1 {
			t.Errorf("%s: step reserve's effect happened %d times (%v), want 1", op, n, err)
		}
		if n, err := rdb.Get(ctx, "effects:notify:"+op).Int(); n != 1 {
			t.Errorf("%s: step notify's effect happened %d times (%v), want 1", op, n, err)
		}
		if n := p.charges[op]; n != 1 {
			t.Errorf("%s: the provider charged %d times, want 1", op, n)
		}
		if len(p.opKeys[op]) != 1 {
			t.Errorf("%s: the provider saw keys %v, want one on every attempt", op, p.opKeys[op])
		}
		for k, n := range p.opKeys[op] {
			if other, dup := keys[k]; dup {
				t.Errorf("%s and %s share the provider key %q", op, other, k)
			}
			keys[k] = op
			if killedInCharge[op] && n < 2 {
				t.Errorf("%s: killed after the provider charged, yet the provider saw the key %d times", op, n)
			}
		}
		if len(results[op]) != 1 {
			t.Errorf("%s: results %v, want one", op, results[op])
		}
		for r := range results[op] {
			if !strings.Contains(r, "ch_"+op+"_1") {
				t.Errorf("%s: result %s is not the provider's one charge", op, r)
			}
		}
	}
}
