package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// The tests run the built idemctl against redis-server processes they
// start (internal/redistest).

func TestMain(m *testing.M) {
	code := m.Run()
	dbtest.StopShared()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// binary builds idemctl once per test run and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "idemctl-test")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "idemctl")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// result is one run of idemctl.
type result struct {
	code           int
	stdout, stderr string
	maxRSS         int64 // bytes, where the system tells; 0 otherwise
	took           time.Duration
}

func idemctl(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("idemctl %q: %v", args, err)
		}
		r.code = ee.ExitCode()
	}
	r.maxRSS = maxRSS(cmd.ProcessState)
	return r
}

func (r result) mustExit(t *testing.T, code int, stderrHas ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stderrHas {
		if !strings.Contains(r.stderr, s) {
			t.Fatalf("stderr does not say %q:\n%s", s, r.stderr)
		}
	}
}

// rec builds a record in the format of lua/record.lua.
func rec(st byte, fp, own string, n int64, tail string) string {
	return "1" + string(st) + string(rune(len(fp))) + fp + string(rune(len(own))) + own + strconv.FormatInt(n, 10) + ":" + tail
}

func TestStatusForget(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	c := idem.New(rdb)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Do(ctx, "order 1", "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr()

	r := idemctl(t, "-redis", addr, "status", "order 1")
	r.mustExit(t, 0)
	for _, s := range []string{`"order 1"`, "idem:{order 1}", "state:    done", "attempt:  1", "expires:"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("status does not say %q:\n%s", s, r.stdout)
		}
	}
	r = idemctl(t, "-redis", "redis://"+addr+"/0", "-json", "status", "order 1")
	r.mustExit(t, 0)
	var st statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != "done" || st.Attempt != 1 || st.Expires == nil {
		t.Fatalf("status -json: %v\n%s", err, r.stdout)
	}

	// An owner that is gone: in progress, its lease ended.
	rdb.Set(ctx, "idem:{stuck}", rec('p', "", "gone", 3, strconv.Itoa(int(time.Hour.Milliseconds()))), time.Hour)
	r = idemctl(t, "-redis", addr, "status", "stuck")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "in progress") || !strings.Contains(r.stdout, "owner is gone") || !strings.Contains(r.stdout, "attempt 4") {
		t.Fatalf("status of a stuck key:\n%s", r.stdout)
	}

	r = idemctl(t, "-redis", addr, "forget", "order 1")
	r.mustExit(t, 2, "-yes")
	if n := rdb.Exists(ctx, "idem:{order 1}").Val(); n != 1 {
		t.Fatal("forget without -yes deleted the record")
	}
	r = idemctl(t, "-redis", addr, "-yes", "forget", "order 1")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "it was done") || rdb.Exists(ctx, "idem:{order 1}").Val() != 0 {
		t.Fatalf("forget -yes:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", addr, "status", "order 1")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "absent") {
		t.Fatalf("status after forget:\n%s", r.stdout)
	}

	// A record idem cannot read: status fails, naming the problem.
	rdb.Set(ctx, "idem:{bad}", "garbage", time.Hour)
	r = idemctl(t, "-redis", addr, "status", "bad")
	r.mustExit(t, 1, "corrupt record", "unknown record version")
}

func TestBadInput(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	addr := srv.Addr()
	closed := redistest.RefusedAddr(t)

	for _, tc := range []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"no command", []string{"-redis", addr}, 2, []string{"no command given"}},
		{"unknown command", []string{"-redis", addr, "frobnicate"}, 2, []string{`unknown command "frobnicate"`, "idemctl -h"}},
		{"unknown flag", []string{"-redis", addr, "-colour", "stats"}, 2, []string{"flag provided but not defined: -colour"}},
		{"missing key", []string{"-redis", addr, "status"}, 2, []string{"status needs a KEY"}},
		{"empty key", []string{"-redis", addr, "status", ""}, 2, []string{"the KEY is empty"}},
		{"extra argument", []string{"-redis", addr, "status", "a", "b"}, 2, []string{"one KEY"}},
		{"argument to stats", []string{"-redis", addr, "stats", "x"}, 2, []string{"takes no arguments"}},
		{"address without port", []string{"-redis", "localhost", "check"}, 2, []string{`-redis "localhost"`, "host:port"}},
		{"bad URL", []string{"-redis", "redis://127.0.0.1:notaport", "check"}, 2, []string{"-redis"}},
		{"several addresses without -cluster", []string{"-redis", addr + "," + addr, "check"}, 2, []string{"-cluster"}},
		{"bad prefix", []string{"-redis", addr, "-prefix", "a{b", "stats"}, 2, []string{"-prefix"}},
		{"unreachable", []string{"-redis", closed, "status", "k"}, 1, []string{"connection refused"}},
		{"unreachable check", []string{"-redis", closed, "check"}, 1, []string{"cannot reach", "connection refused"}},
		{"help", []string{"-h"}, 0, []string{"Exit status", "forget KEY"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := idemctl(t, tc.args...)
			r.mustExit(t, tc.code, tc.says...)
			if tc.code == 2 && r.stdout != "" {
				t.Fatalf("bad input printed to stdout:\n%s", r.stdout)
			}
		})
	}
}

func TestCheckCommand(t *testing.T) {
	good := redistest.Start(t, redistest.Config{AppendOnly: true})
	r := idemctl(t, "-redis", good.Addr(), "check")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "ok: no problems") || !strings.Contains(r.stdout, "maxmemory-policy noeviction") {
		t.Fatalf("check of a healthy server:\n%s", r.stdout)
	}

	bad := redistest.Start(t, redistest.Config{MaxMemoryPolicy: "volatile-ttl"})
	r = idemctl(t, "-redis", bad.Addr(), "check")
	r.mustExit(t, 1, "check found 1 problems")
	if !strings.Contains(r.stdout, "PROBLEM: maxmemory-policy is volatile-ttl") || !strings.Contains(r.stdout, "note: appendonly no") {
		t.Fatalf("check of a misconfigured server:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", bad.Addr(), "-json", "check")
	r.mustExit(t, 1)
	var out struct {
		OK      bool               `json:"ok"`
		Servers []idem.ServerCheck `json:"servers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.OK || len(out.Servers) != 1 || len(out.Servers[0].Problems) != 1 {
		t.Fatalf("check -json: %v\n%s", err, r.stdout)
	}
}

// populate writes n records in the states stats tells apart, and a few
// keys it must skip or cannot read; it returns the counts stats should
// report.
func populate(t *testing.T, rdb *redis.Client, n int) (want map[string]int64, retried int64) {
	t.Helper()
	ctx := context.Background()
	want = map[string]int64{}
	day := 24 * time.Hour
	mark := strconv.FormatInt((day - 30*time.Second).Milliseconds(), 10)
	pipe := rdb.Pipeline()
	payload := strings.Repeat("r", 100)
	for i := range n {
		key := fmt.Sprintf("idem:{order-%d}", i)
		attempt := int64(1 + i%7/5) // attempts 1 and 2
		var v string
		ttl := day - time.Duration(i%1000)*time.Minute
		switch i % 100 {
		case 0, 1, 2:
			v = rec('f', "fingerprint-----", "owner-token-----", attempt, "permanent: card declined")
			want[stFailed]++
		case 3, 4:
			v = rec('p', "fingerprint-----", "owner-token-----", attempt, mark) // lease live (30s)
			ttl = day
			want[stInProgress]++
		case 5:
			v = rec('p', "fingerprint-----", "owner-token-----", attempt, strconv.FormatInt(day.Milliseconds(), 10)) // lease ended
			want[stLeaseEnded]++
		case 6, 7:
			v = rec('r', "fingerprint-----", "owner-token-----", attempt, mark)
			want[stReleased]++
		default:
			body := payload
			if i == 4242 {
				body = strings.Repeat("B", 200_000) // the biggest record
			}
			v = rec('d', "fingerprint-----", "owner-token-----", attempt, body)
			want[stDone]++
		}
		if attempt > 1 {
			retried++
		}
		pipe.Set(ctx, key, v, ttl)
		if pipe.Len() == 1000 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not idem's, or not readable: a hash under the prefix, keys outside it.
	pipe.HSet(ctx, "idem:{a-hash}", "f", "v")
	want[stUnreadable]++
	// The checkpoints of idem.Step beside a record are not records.
	pipe.HSet(ctx, "idem:{order-0}:steps", "charge", "d\xa2ok")
	pipe.Set(ctx, "other:{x}", "x", 0)
	pipe.Set(ctx, "idemx", "x", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return want, retried
}

func TestStats100k(t *testing.T) {
	if testing.Short() {
		t.Skip("a keyspace of 100,000 records: skipped in -short")
	}
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	const n = 100_000
	want, retried := populate(t, rdb, n)

	r := idemctl(t, "-redis", srv.Addr(), "-json", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	t.Logf("stats of %d records took %v, max RSS %.1f MiB", n+1, r.took, float64(r.maxRSS)/(1<<20))
	if got.Records != n+1 {
		t.Fatalf("%d records, want %d", got.Records, n+1)
	}
	for _, s := range stateOrder {
		if got.ByState[s] != want[s] {
			t.Errorf("%s: %d, want %d", s, got.ByState[s], want[s])
		}
	}
	if got.Retried != retried || got.MaxAttempt != 2 {
		t.Errorf("attempts above 1: %d (highest %d), want %d (2)", got.Retried, got.MaxAttempt, retried)
	}
	if len(got.Biggest) != 10 || got.Biggest[0].Key != "idem:{order-4242}" || got.Biggest[0].Bytes < 200_000 {
		t.Errorf("biggest: %+v", got.Biggest)
	}
	if got.NoTTL != 1 || got.Memory.Sampled < 5000 || got.Memory.Sampled > 10001 || got.Memory.P50 < 100 {
		t.Errorf("records without a TTL %d, want 1 (the hash); memory %+v", got.NoTTL, got.Memory)
	}
	var inBuckets int64
	for _, b := range got.TTLBuckets {
		inBuckets += b.Count
	}
	if inBuckets != n { // and the hash, which has no TTL
		t.Errorf("TTL buckets hold %d records, want %d: %+v", inBuckets, n, got.TTLBuckets)
	}
	// Bounded memory: the scan keeps counts, samples and the top records,
	// not the keyspace. A generous bound, far below what holding the
	// records' heads would take on top of the runtime.
	if r.maxRSS > 200<<20 {
		t.Errorf("max RSS %.1f MiB", float64(r.maxRSS)/(1<<20))
	}

	// The human output, and the same counts.
	r = idemctl(t, "-redis", srv.Addr(), "-top", "3", "stats")
	r.mustExit(t, 0)
	for _, s := range []string{"100001 records under idem:{...}", "lease ended", "owner is gone", "attempts above 1: " + strconv.FormatInt(retried, 10), `"idem:{order-4242}"`, "MEMORY USAGE of"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stats does not say %q:\n%s", s, r.stdout)
		}
	}
	if strings.Contains(r.stderr, "scanned") {
		t.Errorf("a progress line on a pipe: %q", r.stderr)
	}
}

func TestStatsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster of three redis-server processes: skipped in -short")
	}
	cl := redistest.StartCluster(t, 3, 0)
	cc := cl.Client(t)
	c := idem.New(cc)
	defer c.Close()
	ctx := context.Background()
	for i := range 300 {
		if _, err := c.Do(ctx, fmt.Sprint("k", i), "", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	r := idemctl(t, "-cluster", "-redis", strings.Join(cl.Addrs(), ","), "-json", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.Records != 300 || got.ByState[stDone] != 300 || got.Servers != 3 {
		t.Fatalf("cluster stats: %d records (%d done) on %d servers", got.Records, got.ByState[stDone], got.Servers)
	}
	r = idemctl(t, "-cluster", "-redis", cl.Addrs()[0], "status", "k7")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "done") {
		t.Fatalf("cluster status:\n%s", r.stdout)
	}
	r = idemctl(t, "-cluster", "-redis", "redis://"+cl.Addrs()[0], "check")
	r.mustExit(t, 0)
	if strings.Count(r.stdout, "Redis 7") != 3 && strings.Count(r.stdout, "Redis ") != 3 {
		t.Fatalf("cluster check should list 3 masters:\n%s", r.stdout)
	}
}

func TestParseRecord(t *testing.T) {
	day := strconv.FormatInt((24 * time.Hour).Milliseconds(), 10)
	for _, tc := range []struct {
		head       string
		whole      bool
		pttl       int64
		state      string
		attemptWas int64
	}{
		{rec('d', "fp", "own", 3, "result"), true, 1000, stDone, 3},
		{rec('f', "", "own", 1, "msg"), true, 1000, stFailed, 1},
		{rec('p', "fp", "own", 2, "1000"), true, 5000, stInProgress, 2},
		{rec('p', "fp", "own", 2, "1000"), true, 1000, stLeaseEnded, 2},
		{rec('p', "fp", "own", 2, day), true, -1, stInProgress, 2},
		{rec('r', "fp", "own", 4, "10"), true, 5000, stReleased, 4},
		{rec('r', "fp", "own", 4, "10"), false, 5000, stUnreadable, 0},
		{rec('p', "fp", "own", 0, "10"), true, 5000, stUnreadable, 0},
		{rec('x', "fp", "own", 1, "10"), true, 5000, stUnreadable, 0},
		{"2d...", true, 5000, stUnreadable, 0},
		{"1d\x05ab", true, 5000, stUnreadable, 0},
		{"1d\x00\x00:x", true, 5000, stUnreadable, 0},
		{"1d\x00\x00-1:x", true, 5000, stUnreadable, 0},
		{"", true, 5000, stUnreadable, 0},
	} {
		st, n := parseRecord(tc.head, tc.whole, tc.pttl)
		if st != tc.state || n != tc.attemptWas {
			t.Errorf("parseRecord(%q): %s %d, want %s %d", tc.head, st, n, tc.state, tc.attemptWas)
		}
	}
}

// Flags go where users type them: after the command and its key too.
func TestFlagsAfterTheCommand(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	c := idem.New(rdb, idem.WithPrefix("app"))
	defer c.Close()
	ctx := context.Background()
	for _, k := range []string{"order-1", "-dash"} {
		if _, err := c.Do(ctx, k, "", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	addr := srv.Addr()

	r := idemctl(t, "status", "order-1", "-redis", addr, "-prefix", "app")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "state:    done") {
		t.Fatalf("status with flags after the key:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", addr, "status", "-json", "order-1", "-prefix=app")
	r.mustExit(t, 0)
	var st statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != "done" {
		t.Fatalf("status with flags around the key: %v\n%s", err, r.stdout)
	}
	r = idemctl(t, "forget", "order-1", "-redis", addr, "-prefix", "app")
	r.mustExit(t, 2, "-yes")
	r = idemctl(t, "forget", "order-1", "-yes", "-redis", addr, "-prefix", "app")
	r.mustExit(t, 0)
	if rdb.Exists(ctx, "app:{order-1}").Val() != 0 {
		t.Fatalf("forget KEY -yes left the record:\n%s", r.stdout)
	}
	// -- ends the flags: a key that starts with '-'.
	r = idemctl(t, "-redis", addr, "-prefix", "app", "status", "--", "-dash")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, `"-dash"`) || !strings.Contains(r.stdout, "done") {
		t.Fatalf("status -- -dash:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", addr, "status", "-dash")
	r.mustExit(t, 2, "flag provided but not defined: -dash")
	r = idemctl(t, "stats", "-redis", addr, "-scope", "alice")
	r.mustExit(t, 2, "-scope")
}

// An HTTP request's record is under its principal's scope: -scope finds
// it, and status without it names where the records of the key are.
func TestScopeAndElsewhere(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	c := idem.New(rdb)
	defer c.Close()
	other := idem.New(rdb, idem.WithPrefix("other"))
	defer other.Close()
	addr := srv.Addr()
	post := func(h http.Handler, principal, key string) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{"amount":1}`))
		req.Header.Set(httpidem.HeaderIdempotencyKey, key)
		req.Header.Set("Authorization", principal)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			t.Fatalf("POST: %d %s", w.Code, w.Body)
		}
	}
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	scoped := httpidem.New(c, httpidem.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }))(created)
	post(scoped, "alice", "k-1")
	post(scoped, "bob's", "k-1")
	post(httpidem.New(c)(created), "", "k-2")
	if _, err := other.Do(context.Background(), "k-1", "", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}

	r := idemctl(t, "status", "k-1", "-scope", "alice", "-redis", addr)
	r.mustExit(t, 0)
	for _, s := range []string{`"5:alicek-1"`, "idem:{5:alicek-1}", `scope:    "alice"`, "state:    done"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("status -scope alice does not say %q:\n%s", s, r.stdout)
		}
	}
	r = idemctl(t, "status", "k-2", "-scope", "", "-redis", addr)
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "state:    done") {
		t.Fatalf("status -scope '' of a request without WithScope:\n%s", r.stdout)
	}

	// Without -scope: absent here, and the records of k-1 elsewhere named.
	r = idemctl(t, "status", "k-1", "-redis", addr)
	r.mustExit(t, 1, "no record of \"k-1\" here, but 3 under another scope or prefix", "-scope PRINCIPAL")
	for _, s := range []string{"state:    absent", "idem:{5:alicek-1}", "idemctl status k-1 -scope alice",
		`idemctl status k-1 -scope 'bob'\''s'`, "other:{k-1}", "idemctl status k-1 -prefix other"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("status of a key stored elsewhere does not say %q:\n%s", s, r.stdout)
		}
	}
	r = idemctl(t, "status", "k-1", "-redis", addr, "-json")
	r.mustExit(t, 1)
	var st statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != "absent" || len(st.Elsewhere) != 3 {
		t.Fatalf("status -json of a key stored elsewhere: %v\n%s", err, r.stdout)
	}
	r = idemctl(t, "status", "k-2", "-redis", addr)
	r.mustExit(t, 1, "-scope ''")
	if !strings.Contains(r.stdout, "idemctl status k-2 -scope ''") {
		t.Fatalf("status of a request's key stored without WithScope:\n%s", r.stdout)
	}
	// A key of its own: absent, and nothing to say.
	r = idemctl(t, "status", "k-3", "-redis", addr)
	r.mustExit(t, 0)
	if strings.Contains(r.stdout, "scope or prefix") {
		t.Fatalf("status of a key nowhere:\n%s", r.stdout)
	}

	r = idemctl(t, "forget", "k-1", "-yes", "-redis", addr)
	r.mustExit(t, 1, "no record of \"k-1\" here")
	if !strings.Contains(r.stdout, "idemctl forget k-1 -scope alice -yes") {
		t.Fatalf("forget of a key stored elsewhere:\n%s", r.stdout)
	}
	r = idemctl(t, "forget", "k-1", "-yes", "-scope", "alice", "-redis", addr)
	r.mustExit(t, 0)
	if n := rdb.Exists(context.Background(), "idem:{5:alicek-1}").Val(); n != 0 || !strings.Contains(r.stdout, "forgot") {
		t.Fatalf("forget -scope alice:\n%s", r.stdout)
	}
}
