package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// The index of unfinished registered operations (idem.Register), as idem's
// lua/record.lua ("The index") writes it: sorted sets at
// <prefix>:{<tag>}:pending, one per hash slot on a cluster and
// singleBuckets elsewhere, bucket b's tag the first base-36 number whose
// CRC-16 falls in slot b; each member is an operation's key, its score the
// server time in ms at which it is due for recovery, parkedDue when it is
// parked. The stored input at <record>:in starts with "1", the length of
// the operation's name (one byte), the name, and the count of recoveries
// since a caller last claimed it (one byte).
const (
	singleBuckets = 1024
	pendingSuffix = "}:pending"
	parkedDue     = 1 << 52
)

// keySecretEnv names the environment variable that holds the services'
// idem.WithEventKeySecret, so that pending's key digests match their logs.
const keySecretEnv = "IDEMCTL_KEY_SECRET"

// pendingJSON is pending's -json output.
type pendingJSON struct {
	Buckets    int       `json:"buckets"`
	Now        time.Time `json:"now"` // the server's
	Unfinished int       `json:"unfinished"`
	Parked     int       `json:"parked"`
	// RetentionMS is the retention that ages are computed with
	// (-retention, or idem's default).
	RetentionMS int64 `json:"retention_ms"`
	// DigestSecret says whose secret the key digests are keyed with:
	// "env" (IDEMCTL_KEY_SECRET, the services' own) or "random".
	DigestSecret string      `json:"digest_secret"`
	Operations   []pendingOp `json:"operations"`
}

// pendingOp is one entry of the index.
type pendingOp struct {
	KeyDigest  string     `json:"key_digest"`
	Key        string     `json:"key,omitempty"` // -raw only
	Operation  string     `json:"operation"`     // "" when its input is gone
	State      string     `json:"state"`
	Step       string     `json:"step,omitempty"` // the parked checked step
	Attempt    int64      `json:"attempt"`
	Recoveries int        `json:"recoveries"`
	AgeMS      *int64     `json:"age_ms,omitempty"` // since the last claim: the retention less the TTL left
	LeaseEnds  *time.Time `json:"lease_ends,omitempty"`
	StepsDone  int64      `json:"steps_done"`
	// NextRecovery is when a Recover loop takes the operation over; nil
	// when it is parked (Parked).
	NextRecovery *time.Time `json:"next_recovery,omitempty"`
	Parked       bool       `json:"parked"`
	due          int64      // the score, ms
	raw          string     // the key, whether or not -raw prints it
}

// slotTags returns, for each of the 16384 slots, the first base-36 number
// whose CRC-16 falls in it, as idem computes its buckets' tags.
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

// pending lists the index of unfinished registered operations: every
// bucket read in one pipeline (no SCAN), then each entry's record.
func pending(ctx context.Context, o options, rdb redis.UniversalClient, out *printer) error {
	n := singleBuckets
	if o.cluster {
		n = 16384
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	pipe := rdb.Pipeline()
	zs := make([]*redis.ZSliceCmd, n)
	for b := range n {
		zs[b] = pipe.ZRangeWithScores(ctx, o.prefix+":{"+slotTags()[b]+pendingSuffix, 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	secret, how := []byte(os.Getenv(keySecretEnv)), "env"
	if len(secret) == 0 {
		secret, how = make([]byte, 32), "random"
		_, _ = rand.Read(secret)
	}
	retention := o.retention
	if retention == 0 {
		retention = 24 * time.Hour // idem's default (idem.WithRetention)
	}
	j := pendingJSON{Buckets: n, Now: now.UTC(), RetentionMS: retention.Milliseconds(), DigestSecret: how, Operations: []pendingOp{}}
	for _, z := range zs {
		for _, m := range z.Val() {
			key, _ := m.Member.(string)
			op := pendingOp{KeyDigest: idem.EventKeyDigest(secret, key), due: int64(m.Score), raw: key}
			if o.raw {
				op.Key = key
			}
			j.Operations = append(j.Operations, op)
		}
	}
	if err := describePending(ctx, o, rdb, j.Operations, retention); err != nil {
		return err
	}
	slices.SortStableFunc(j.Operations, func(a, b pendingOp) int { return int(a.due - b.due) })
	for _, op := range j.Operations {
		if op.Parked {
			j.Parked++
		} else {
			j.Unfinished++
		}
	}
	if out.json {
		return out.object(j)
	}
	printPending(out, o, j, now)
	return nil
}

// describePending fills in each entry from its record (idem's Status), its
// stored input's header, its TTL and its steps' checkpoints.
func describePending(ctx context.Context, o options, rdb redis.UniversalClient, ops []pendingOp, retention time.Duration) error {
	if len(ops) == 0 {
		return nil
	}
	type cmds struct {
		head  *redis.StringCmd
		pttl  *redis.DurationCmd
		steps *redis.StringSliceCmd
	}
	cs := make([]cmds, len(ops))
	pipe := rdb.Pipeline()
	for i, op := range ops {
		rk := recordKey(o.prefix, op.raw)
		cs[i] = cmds{
			head:  pipe.GetRange(ctx, rk+":in", 0, 257),
			pttl:  pipe.PTTL(ctx, rk),
			steps: pipe.HKeys(ctx, rk+":steps"),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	c := client(o, rdb)
	defer c.Close()
	for i := range ops {
		op, cs := &ops[i], cs[i]
		op.Operation, op.Recoveries = parseInputHead(cs.head.Val())
		if d := cs.pttl.Val(); d > 0 {
			age := (retention - d).Milliseconds()
			op.AgeMS = &age
		}
		for _, f := range cs.steps.Val() {
			if f != "" && f != parkedField {
				op.StepsDone++
			}
		}
		st, err := c.Status(ctx, op.raw)
		if err != nil && !errors.Is(err, idem.ErrCorrupt) {
			return err
		}
		op.State, op.Step, op.Attempt = st.State.String(), st.Step, st.Attempt
		if err != nil {
			op.State = "unreadable"
		}
		if st.State == idem.StateInProgress && !st.LeaseEnds.IsZero() {
			t := st.LeaseEnds.UTC()
			op.LeaseEnds = &t
		}
		op.Parked = op.due >= parkedDue || st.State == idem.StateParked
		if !op.Parked {
			t := time.UnixMilli(op.due).UTC()
			op.NextRecovery = &t
		}
	}
	return nil
}

// parseInputHead reads the operation's name and its recoveries from the
// head of a stored input; "" when there is none.
func parseInputHead(h string) (name string, recoveries int) {
	if len(h) < 3 || h[0] != '1' || len(h) < 3+int(h[1]) {
		return "", 0
	}
	n := int(h[1])
	return h[2 : 2+n], int(h[2+n])
}

// parkedField is idem's PARKED (lua/record.lua): the field of a record's
// checkpoints that marks its operation parked, not a step done (nor is
// the field "", their bytes' count).
var parkedField = strings.Repeat("!", 257)

// printPending prints j as a table.
func printPending(out *printer, o options, j pendingJSON, now time.Time) {
	out.printf("%d unfinished and %d parked registered operations, in the %d buckets of the index under %q\n",
		j.Unfinished, j.Parked, j.Buckets, o.prefix)
	if len(j.Operations) == 0 {
		return
	}
	how := "-retention"
	if o.retention == 0 {
		how = "idem's default: give -retention if the Clients use another"
	}
	out.printf("ages: since the last claim, for a retention of %v (%s)\n", time.Duration(j.RetentionMS)*time.Millisecond, how)
	switch {
	case o.raw:
	case j.DigestSecret == "env":
		out.printf("keys: by their digest with %s, as the services' events and logs name them (-raw: the keys)\n", keySecretEnv)
	default:
		out.printf("keys: by a digest of this run only (set %s to the services' idem.WithEventKeySecret to match their logs; -raw: the keys)\n", keySecretEnv)
	}
	out.printf("\n")
	tw := tabwriter.NewWriter(out.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOPERATION\tSTATE\tATTEMPT\tRECOVERIES\tAGE\tLEASE ENDS\tSTEPS DONE\tNEXT RECOVERY")
	for _, op := range j.Operations {
		key := op.KeyDigest
		if o.raw {
			key = strconv.Quote(op.Key)
		}
		name := op.Operation
		if name == "" {
			name = "-"
		}
		state := op.State
		if op.Step != "" {
			state += " at " + op.Step
		}
		age := "-"
		if op.AgeMS != nil {
			age = roundAgo(time.Duration(*op.AgeMS) * time.Millisecond)
		}
		lease := "-"
		if op.LeaseEnds != nil {
			if d := op.LeaseEnds.Sub(now); d > 0 {
				lease = "in " + roundAgo(d)
			} else {
				lease = roundAgo(-d) + " ago"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", key, name, state, op.Attempt, op.Recoveries, age, lease, op.StepsDone, nextRecovery(op, now))
	}
	_ = tw.Flush()
}

// nextRecovery says when a Recover loop takes op over, or what it waits
// for.
func nextRecovery(op pendingOp, now time.Time) string {
	switch {
	case op.Parked && op.Step != "":
		return "never: its step waits for idemctl resolve"
	case op.Parked:
		return "never: parked, idemctl retry KEY runs it again"
	case op.NextRecovery == nil:
		return "-"
	}
	d := op.NextRecovery.Sub(now)
	if d > 0 {
		return "in " + roundAgo(d)
	}
	return "due " + roundAgo(-d) + " ago (is a Recover loop running where " + strconv.Quote(op.Operation) + " is registered?)"
}

// roundAgo rounds d for a table: to the second, or to the millisecond
// under one.
func roundAgo(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
