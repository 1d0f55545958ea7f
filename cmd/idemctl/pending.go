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
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// keySecretEnv names the environment variable that holds the services'
// idem.WithEventKeySecret, so that pending's key digests match their logs.
const keySecretEnv = "IDEMCTL_KEY_SECRET"

// parkedField is idem's PARKED (lua/record.lua): the field of a record's
// checkpoints that marks its operation parked, not a step done (nor is
// the field "", their bytes' count).
var parkedField = strings.Repeat("!", 257)

// pendingJSON is pending's -json output.
type pendingJSON struct {
	Now        time.Time `json:"now"` // the server's
	Unfinished int       `json:"unfinished"`
	Parked     int       `json:"parked"`
	// Limited says that -limit cut the list short.
	Limited bool `json:"limited"`
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
	raw          string     // the key, whether or not -raw prints it
}

// pending lists the unfinished and parked registered operations from
// idem's index of them (Client.Pending: its buckets in one pipeline, no
// SCAN), each with what its record says, due first, parked last.
func pending(ctx context.Context, o options, rdb redis.UniversalClient, out *printer) error {
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	c := client(o, rdb)
	defer c.Close()
	list, err := c.Pending(ctx, o.limit+1)
	if err != nil {
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
	j := pendingJSON{Now: now.UTC(), RetentionMS: retention.Milliseconds(), DigestSecret: how, Operations: []pendingOp{}}
	if len(list) > o.limit {
		list, j.Limited = list[:o.limit], true
	}
	for _, p := range list {
		op := pendingOp{KeyDigest: idem.EventKeyDigest(secret, p.Key), Operation: p.Name, Recoveries: p.Recoveries, Parked: p.Parked, raw: p.Key}
		if o.raw {
			op.Key = p.Key
		}
		if !p.Parked {
			t := p.Due.UTC()
			op.NextRecovery = &t
		}
		j.Operations = append(j.Operations, op)
	}
	if err := describePending(ctx, c, o, rdb, j.Operations, retention); err != nil {
		return err
	}
	slices.SortStableFunc(j.Operations, func(a, b pendingOp) int {
		if a.Parked || b.Parked {
			return cmpBool(a.Parked, b.Parked)
		}
		return a.NextRecovery.Compare(*b.NextRecovery)
	})
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
// TTL and its steps' checkpoints.
func describePending(ctx context.Context, c *idem.Client, o options, rdb redis.UniversalClient, ops []pendingOp, retention time.Duration) error {
	if len(ops) == 0 {
		return nil
	}
	type cmds struct {
		pttl  *redis.DurationCmd
		steps *redis.StringSliceCmd
	}
	cs := make([]cmds, len(ops))
	pipe := rdb.Pipeline()
	for i, op := range ops {
		rk := recordKey(o.prefix, op.raw)
		cs[i] = cmds{
			pttl:  pipe.PTTL(ctx, rk),
			steps: pipe.HKeys(ctx, rk+":steps"),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !isPerKey(err) {
		return err
	}
	for i := range ops {
		op, cs := &ops[i], cs[i]
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
		if st.State == idem.StateParked {
			op.Parked, op.NextRecovery = true, nil
		}
	}
	return nil
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// printPending prints j as a table.
func printPending(out *printer, o options, j pendingJSON, now time.Time) {
	out.printf("%d unfinished and %d parked registered operations under the prefix %q\n", j.Unfinished, j.Parked, o.prefix)
	if j.Limited {
		out.printf("only the first %d that the index lists (-limit)\n", o.limit)
	}
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
