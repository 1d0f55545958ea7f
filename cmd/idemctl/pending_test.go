package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The index as lua/record.lua ("The index") documents it, written here
// independently of idem: sorted sets at <prefix>:{<tag>}:pending, 1024 of
// them off Cluster, bucket b's tag the first base-36 number whose CRC-16
// falls in slot b; members the keys, scores when they are due in server
// ms, parkedDue when parked.
const (
	singleBuckets = 1024
	pendingSuffix = "}:pending"
	parkedDue     = 1 << 52
)

// slotTags returns, for each of the 16384 slots, the first base-36 number
// whose CRC-16 falls in it.
var slotTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	for n, left := 0, len(tags); left > 0; n++ {
		t := strconv.FormatInt(int64(n), 36)
		if s := crc16(t) % 16384; tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return &tags
})

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// indexed writes an unfinished registered operation the way idem's
// scripts leave it (lua/record.lua: the record, its stored input, its
// checkpoints, its index entry), independently of them.
type indexed struct {
	key, name  string
	record     string
	recoveries byte
	steps      map[string]string
	due        float64 // the index's score
}

func (ix indexed) write(t *testing.T, ctx context.Context, rdb *redis.Client) {
	t.Helper()
	rk := recordKey("idem", ix.key)
	in := "1" + string(rune(len(ix.name))) + ix.name + string(rune(ix.recoveries)) + "\xc4\x03abc"
	bucket := "idem:{" + slotTags()[int(crc16(ix.key)%16384)%singleBuckets] + pendingSuffix
	pipe := rdb.TxPipeline()
	pipe.Set(ctx, rk, ix.record, time.Hour)
	pipe.Set(ctx, rk+":in", in, time.Hour)
	for f, v := range ix.steps {
		pipe.HSet(ctx, rk+":steps", f, v)
	}
	pipe.ZAdd(ctx, bucket, redis.Z{Score: ix.due, Member: ix.key})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// idemctlEnv runs idemctl with env added to its environment.
func idemctlEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// pending lists the index's entries, due first, each with its operation,
// state, attempt, recoveries, steps done and next recovery; parked ones as
// parked; keys by their digest unless -raw, keyed with IDEMCTL_KEY_SECRET
// when it is set.
func TestPending(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) float64 { return float64(now.Add(d).UnixMilli()) }
	hour := strconv.Itoa(int(time.Hour.Milliseconds()))
	for _, ix := range []indexed{
		{key: "pay-released", name: "debit", record: rec('r', "", "owner-a", 2, hour), recoveries: 1,
			steps: map[string]string{"reserve": "dvalue"}, due: ms(40 * time.Second)},
		{key: "pay-parked", name: "debit", record: rec('r', "", "owner-b", 6, hour), recoveries: 5,
			steps: map[string]string{"reserve": "dvalue", "ship": "dvalue", parkedField: "k"}, due: parkedDue},
		{key: "pay-overdue", name: "refund", record: rec('p', "", "owner-c", 1, hour), due: ms(-20 * time.Second)},
	} {
		ix.write(t, ctx, rdb)
	}
	// A plain Do's record is not in the index.
	c := idem.New(rdb, idem.WithLogger(nil))
	defer c.Close()
	if _, err := c.Do(ctx, "plain-1", "", func(context.Context) ([]byte, error) { return nil, context.Canceled }); err == nil {
		t.Fatal("plain-1: want its error")
	}

	r := idemctl(t, "-redis", srv.Addr(), "-raw", "-json", "pending")
	r.mustExit(t, 0)
	var got pendingJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("pending -json: %v\n%s", err, r.stdout)
	}
	if got.Unfinished != 2 || got.Parked != 1 || len(got.Operations) != 3 || got.Limited {
		t.Fatalf("pending -json: %+v", got)
	}
	first, second, third := got.Operations[0], got.Operations[1], got.Operations[2]
	if first.Key != "pay-overdue" || first.Operation != "refund" || first.State != "in progress" || first.Attempt != 1 || first.NextRecovery == nil {
		t.Errorf("first (the overdue one): %+v", first)
	}
	if second.Key != "pay-released" || second.Operation != "debit" || second.State != "released" || second.Attempt != 2 ||
		second.Recoveries != 1 || second.StepsDone != 1 || second.Parked || second.AgeMS == nil {
		t.Errorf("second (the released one): %+v", second)
	}
	if third.Key != "pay-parked" || !third.Parked || third.NextRecovery != nil || third.StepsDone != 2 || third.Recoveries != 5 {
		t.Errorf("third (the parked one): %+v", third)
	}

	r = idemctl(t, "-redis", srv.Addr(), "pending")
	r.mustExit(t, 0)
	for _, want := range []string{"2 unfinished and 1 parked", "OPERATION", "refund", "debit", "released", "idemctl retry KEY", "is a Recover loop running where \"refund\" is registered?"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("pending does not say %q:\n%s", want, r.stdout)
		}
	}
	for _, key := range []string{"pay-released", "pay-parked", "pay-overdue", "plain-1"} {
		if strings.Contains(r.stdout, key) {
			t.Errorf("pending without -raw prints the key %q:\n%s", key, r.stdout)
		}
	}

	secret := "a-secret-of-the-services-16+"
	r = idemctlEnv(t, []string{keySecretEnv + "=" + secret}, "-redis", srv.Addr(), "-json", "pending")
	r.mustExit(t, 0)
	got = pendingJSON{}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	want := idem.EventKeyDigest([]byte(secret), "pay-overdue")
	if got.DigestSecret != "env" || got.Operations[0].KeyDigest != want || got.Operations[0].Key != "" {
		t.Errorf("with %s: got %+v, want digest %s and no key", keySecretEnv, got.Operations[0], want)
	}

	r = idemctl(t, "-redis", srv.Addr(), "-limit", "1", "-json", "pending")
	r.mustExit(t, 0)
	got = pendingJSON{}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.Operations) != 1 || !got.Limited {
		t.Errorf("pending -limit 1: %v %+v", err, got)
	}
	idemctl(t, "-redis", srv.Addr(), "-limit", "0", "pending").mustExit(t, 2, "-limit 0")
	idemctl(t, "-redis", srv.Addr(), "-raw", "status", "x").mustExit(t, 2, "-raw is pending's")
	idemctl(t, "-redis", srv.Addr(), "pending", "x").mustExit(t, 2, "takes no arguments")
}

// stats counts neither the stored inputs of registered operations nor the
// buckets of their index as records, and counts an operation parked by
// its recoveries as parked.
func TestStatsRegistered(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rdb := srv.Client(t)
	ctx := context.Background()
	hour := strconv.Itoa(int(time.Hour.Milliseconds()))
	indexed{key: "pay-1", name: "debit", record: rec('r', "", "owner-a", 2, hour), due: 1}.write(t, ctx, rdb)
	indexed{key: "pay-2", name: "debit", record: rec('r', "", "owner-b", 6, hour), recoveries: 5,
		steps: map[string]string{parkedField: "k"}, due: parkedDue}.write(t, ctx, rdb)
	r := idemctl(t, "-redis", srv.Addr(), "-json", "stats")
	r.mustExit(t, 0)
	var got tally
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("stats -json: %v\n%s", err, r.stdout)
	}
	if got.Records != 2 || got.ByState[stReleased] != 1 || got.ByState[stParked] != 1 || got.ByState[stUnreadable] != 0 {
		t.Fatalf("stats: %d records by state %v, want released 1, parked 1", got.Records, got.ByState)
	}
}

// pending lists an unfinished registered operation with its name, state,
// steps and next recovery, and a parked one as parked; retry un-parks it,
// and refuses a key that is not parked.
func TestPendingAndRetry(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := idem.New(srv.Client(t), idem.WithLogger(nil), idem.WithRecoverAfter(20*time.Millisecond), idem.WithMaxRecoveries(1))
	defer c.Close()
	ctx := context.Background()
	op := idem.Register(c, "charge", func(ctx context.Context, in int) (int, error) {
		if _, err := idem.Step(ctx, "reserve", func(context.Context) (int, error) { return in, nil }); err != nil {
			return 0, err
		}
		return 0, errors.New("transient")
	})
	for _, k := range []string{"pay-1", "pay-2"} {
		if _, err := op.Do(ctx, k, 1); err == nil {
			t.Fatal("want the transient error")
		}
	}
	rctx, stop := context.WithTimeout(ctx, 20*time.Second)
	done := make(chan error, 1)
	go func() { done <- c.Recover(rctx) }()
	for {
		if st, _ := c.Status(ctx, "pay-1"); st.State == idem.StateParked {
			break
		}
		if rctx.Err() != nil {
			t.Fatal("pay-1 not parked within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
	// pay-2 is parked too, or about to be: un-park the first only.
	r := idemctl(t, "-redis", srv.Addr(), "-json", "-raw", "pending")
	r.mustExit(t, 0)
	var got pendingJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("pending -json: %v\n%s", err, r.stdout)
	}
	var one *pendingOp
	for i, p := range got.Operations {
		if p.Key == "pay-1" {
			one = &got.Operations[i]
		}
	}
	if one == nil || one.Operation != "charge" || one.State != "parked" || one.StepsDone != 1 || one.NextRecovery != nil || !one.Parked || one.Recoveries != 1 || one.KeyDigest == "" {
		t.Fatalf("pending: %+v\n%s", one, r.stdout)
	}
	r = idemctl(t, "-redis", srv.Addr(), "pending")
	r.mustExit(t, 0)
	if !strings.Contains(r.stdout, "charge") || !strings.Contains(r.stdout, "never: parked, idemctl retry KEY runs it again") || strings.Contains(r.stdout, "pay-1") {
		t.Fatalf("pending without -raw:\n%s", r.stdout)
	}
	r = idemctl(t, "-redis", srv.Addr(), "retry", "pay-1", "-yes")
	r.mustExit(t, 0)
	if st, _ := c.Status(ctx, "pay-1"); st.State != idem.StateReleased {
		t.Fatalf("after retry: %v", st.State)
	}
	r = idemctl(t, "-redis", srv.Addr(), "retry", "pay-1", "-yes")
	r.mustExit(t, 1, "not parked")
	r = idemctl(t, "-redis", srv.Addr(), "retry", "nope", "-yes")
	r.mustExit(t, 1, "no such record")
	r = idemctl(t, "-redis", srv.Addr(), "-raw", "stats")
	r.mustExit(t, 2, "pending's")
}
