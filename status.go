// status.go: State, Status and Forget: an operator's view of one key's
// record.

package idem

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// State is the state of a key's record.
type State int

// The states of a record.
const (
	// StateAbsent: no record; the next Do runs fn as attempt 1.
	StateAbsent State = iota
	// StateInProgress: an attempt holds or held the lease.
	StateInProgress
	// StateDone: a result is stored and replayed.
	StateDone
	// StateFailed: a permanent error is stored and replayed.
	StateFailed
	// StateReleased: the last attempt failed transiently; the next Do runs
	// fn again with the next attempt number.
	StateReleased
	// StateParked: a checked step (StepChecked) could not be settled, and
	// the operation is parked until an operator resolves the step
	// (Status.Step names it; Resolve, ResolveNotApplied): every Do of the
	// key returns an error matching ErrUnknownOutcome and ErrParked, and
	// no attempt runs the step's act or check. Or (Status.Step "") a
	// registered operation that WithMaxRecoveries recoveries did not
	// finish: every Do returns an error matching ErrParked without running
	// fn, and Recover leaves it, until Retry (or Forget).
	StateParked
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateInProgress:
		return "in progress"
	case StateDone:
		return "done"
	case StateFailed:
		return "failed"
	case StateReleased:
		return "released"
	case StateParked:
		return "parked"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Status describes a key's record, with times from the Redis server's clock.
type Status struct {
	// State is the record's state.
	State State
	// Attempt is the latest attempt number (0 when absent).
	Attempt int64
	// LeaseEnds is when the latest attempt's lease ends or ended, for a
	// record in progress or released (zero otherwise). While State is
	// StateInProgress, the next caller takes over after it.
	LeaseEnds time.Time
	// Expires is when the record will be deleted (zero when absent).
	Expires time.Time
	// Tombstone reports, for an absent record, that a tombstone of the key
	// is left (WithTombstones, by this Client or any other): the key was
	// used, its retention ended, and a call gets ErrLateRetry (with a
	// ledger, the ledger's outcome when it holds one).
	Tombstone bool
	// Step names the parked step, for StateParked ("" otherwise).
	Step string
}

// Status reports the state of key's record without changing it.
func (c *Client) Status(ctx context.Context, key string) (Status, error) {
	if err := c.checkCall(ctx, key); err != nil {
		return Status{}, err
	}
	v, err := c.status(ctx, key, false)
	if err != nil {
		return Status{}, fmt.Errorf("idem: status of key %q: %w", key, err)
	}
	st, err := parseStatus(key, v)
	if err != nil {
		return Status{}, err
	}
	return c.parked(ctx, key, st)
}

// parked returns st as StateParked when key's operation is unfinished (in
// progress or released) and one of its checked steps is parked: one more
// read, of its checkpoints, for unfinished records only.
func (c *Client) parked(ctx context.Context, key string, st Status) (Status, error) {
	if st.State != StateInProgress && st.State != StateReleased {
		return st, nil
	}
	cps, err := c.rdb.HGetAll(ctx, c.recordKey(key)+stepsSuffix).Result()
	if err != nil {
		return Status{}, fmt.Errorf("idem: status of key %q: reading its steps: %w", key, err)
	}
	names := make([]string, 0, 1)
	for name, v := range cps {
		if len(v) > 0 && v[0] == stepParked {
			names = append(names, name)
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		st.State, st.Step = StateParked, names[0]
	} else if cps[parkedField] == "k" {
		st.State = StateParked // by its recoveries (WithMaxRecoveries)
	}
	return st, nil
}

// status runs lua/status.lua for key; withRecord asks for a finished
// record itself too (Result). The tombstones it looks in are every
// Client's, whether or not this one leaves any.
func (c *Client) status(ctx context.Context, key string, withRecord bool) ([]any, error) {
	rk := c.recordKey(key)
	keys := []string{rk, c.tomb.base(c.cfg.prefix, rk)}
	if withRecord {
		return statusScript.Run(ctx, c.rdb, keys, tombstoneField(rk), "1").Slice()
	}
	return statusScript.Run(ctx, c.rdb, keys, tombstoneField(rk)).Slice()
}

func parseStatus(key string, v []any) (Status, error) {
	bad := func(why string) (Status, error) {
		return Status{}, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, why)
	}
	if len(v) == 2 {
		if why, ok := v[1].(string); ok && v[0] == string(replyBadRecord) {
			return bad(why)
		}
	}
	if len(v) != 6 && len(v) != 7 {
		return bad("unexpected status reply")
	}
	now, ok1 := v[0].(int64)
	pttl, ok2 := v[1].(int64)
	st, ok3 := v[2].(string)
	n, ok4 := v[3].(int64)
	lu, ok5 := v[4].(int64)
	tomb, ok6 := v[5].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || tomb != 0 && tomb != 1 || tomb == 1 && st != "" {
		return bad("unexpected status reply")
	}
	switch {
	case st == "" && (pttl != -2 || n != 0 || lu != 0):
		return bad("inconsistent reply for an absent record")
	case st == "":
		return Status{Tombstone: tomb == 1}, nil
	case pttl < -1 || n < 1 || lu < 0 || (lu != 0 && (st == string(recordDone) || st == string(recordFailed))):
		return bad("inconsistent status reply")
	}
	var s Status
	switch st {
	case string(recordInProgress):
		s.State = StateInProgress
	case string(recordDone):
		s.State = StateDone
	case string(recordFailed):
		s.State = StateFailed
	case string(recordReleased):
		s.State = StateReleased
	default:
		return bad(fmt.Sprintf("unknown state %q", st))
	}
	s.Attempt = n
	if lu > 0 {
		s.LeaseEnds = time.UnixMilli(lu)
	}
	if pttl >= 0 {
		s.Expires = time.UnixMilli(now + pttl)
	}
	return s, nil
}

// Forget deletes key's record, whatever its state, its steps' checkpoints
// (see Step) and its tombstones (WithTombstones), left by any Client,
// whatever its span and whether or not this Client leaves tombstones
// itself: the next Do runs fn as attempt 1, from its first step. It is an operator's escape hatch (a
// stuck or wrong record); forgetting a key whose operation ran lets a
// retry run it again. Waiters of a forgotten in-progress key see
// ErrExpired.
func (c *Client) Forget(ctx context.Context, key string) error {
	if err := c.checkCall(ctx, key); err != nil {
		return err
	}
	rk := c.recordKey(key)
	err := forgetScript.Run(ctx, c.rdb, []string{rk, rk + stepsSuffix, c.tomb.base(c.cfg.prefix, rk), rk + inputSuffix, c.pendingKey(rk)}, tombstoneField(rk), key).Err()
	if err != nil {
		return fmt.Errorf("idem: forget key %q: %w", key, err)
	}
	return nil
}
