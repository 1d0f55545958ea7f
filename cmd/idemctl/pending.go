package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// pendingJSON is one unfinished registered operation in pending's -json
// output.
type pendingJSON struct {
	Key          string     `json:"key,omitempty"` // with -raw only
	KeyDigest    string     `json:"key_digest"`    // idem.EventKeyDigest, with -key-secret
	Name         string     `json:"name"`          // the operation's (idem.Register); "" when its input is gone
	State        string     `json:"state"`
	Attempt      int64      `json:"attempt"`
	Age          string     `json:"age,omitempty"` // since its last claim or renewal, with -retention
	LeaseEnds    *time.Time `json:"lease_ends,omitempty"`
	Steps        int64      `json:"steps"`                   // its checkpoints (and checked steps' intents)
	Recoveries   int        `json:"recoveries"`              // since a caller last claimed it (idem.WithMaxRecoveries)
	NextRecovery *time.Time `json:"next_recovery,omitempty"` // when a Recover loop takes it over; none when parked
}

// parkedField is the parked marker's field in a record's checkpoints.
var parkedField = strings.Repeat("!", 257)

// maxPending bounds what pending lists.
const maxPending = 10000

// pending lists the unfinished registered operations that the index holds
// (idem's Client.Pending), parked ones too, each with its record's state.
func pending(ctx context.Context, o options, rdb redis.UniversalClient, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	list, err := c.Pending(ctx, maxPending)
	if err != nil {
		return err
	}
	rows := make([]pendingJSON, 0, len(list))
	for _, p := range list {
		st, err := c.Status(ctx, p.Key)
		if err != nil {
			return err
		}
		fields, err := rdb.HKeys(ctx, recordKey(o.prefix, p.Key)+":steps").Result()
		if err != nil {
			return err
		}
		var steps int64
		for _, f := range fields {
			if f != "" && f != parkedField { // neither the bytes' count nor the parked marker
				steps++
			}
		}
		r := pendingJSON{KeyDigest: idem.EventKeyDigest([]byte(o.keySecret), p.Key), Name: p.Name,
			State: st.State.String(), Attempt: st.Attempt, Steps: steps, Recoveries: p.Recoveries}
		if o.raw {
			r.Key = p.Key
		}
		if !st.LeaseEnds.IsZero() {
			t := st.LeaseEnds.UTC()
			r.LeaseEnds = &t
		}
		if o.retention > 0 && !st.Expires.IsZero() {
			r.Age = (o.retention - time.Until(st.Expires)).Round(time.Second).String()
		}
		if !p.Parked {
			t := p.Due.UTC()
			r.NextRecovery = &t
		}
		rows = append(rows, r)
	}
	if out.json {
		return out.object(map[string]any{"pending": rows, "truncated": len(list) == maxPending})
	}
	out.printf("%d unfinished registered operations\n", len(rows))
	for _, r := range rows {
		who := r.KeyDigest
		if o.raw {
			who = fmt.Sprintf("%q", r.Key)
		}
		next := "parked (idemctl retry KEY)"
		if r.NextRecovery != nil {
			next = "recovery due " + r.NextRecovery.Format(time.RFC3339)
		}
		lease := "-"
		if r.LeaseEnds != nil {
			lease = r.LeaseEnds.Format(time.RFC3339)
		}
		age := r.Age
		if age == "" {
			age = "-"
		}
		out.printf("%s  %s  %s  attempt %d  age %s  lease end %s  steps %d  recoveries %d  %s\n",
			who, r.Name, r.State, r.Attempt, age, lease, r.Steps, r.Recoveries, next)
	}
	return nil
}

// retry un-parks arg's operation (idem's Client.Retry): the next Recover
// sweep, or the next call with the key, runs it again.
func retry(ctx context.Context, o options, rdb redis.UniversalClient, arg string, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	key := o.key(arg)
	if err := c.Retry(ctx, key); err != nil {
		return err
	}
	out.printf("un-parked key %q: the next recovery (or call with the key) runs its operation again\n", key)
	return out.object(map[string]any{"key": key, "retried": true})
}
