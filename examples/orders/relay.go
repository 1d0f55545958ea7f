package main

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// relayPause is how long the relay waits after each batch's XADDs, before
// it deletes the batch's rows: a slow database, so that the demo can kill
// the relay in between (see xaddReporter).
const relayPause = 50 * time.Millisecond

// relay moves orders.db's outbox to the stream until ctx ends: one relay,
// as SQLite has one writer.
func (c child) relay(ctx context.Context, out *reporter) error {
	db, err := openDB(filepath.Join(c.Dir, "orders.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis})
	defer rdb.Close()
	rdb.AddHook(xaddReporter{out: out})
	return idemsql.New(db, idemsql.SQLite).Relay(ctx, rdb, idemsql.WithRelayBatch(20), idemsql.WithRelayPoll(20*time.Millisecond))
}

// xaddReporter says "xadded" after each pipeline of XADDs, and waits
// relayPause: a relay killed then has added its batch to the stream but
// not deleted its rows, and its successor adds them again.
type xaddReporter struct{ out *reporter }

func (xaddReporter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (xaddReporter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h xaddReporter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && len(cmds) > 0 && strings.EqualFold(cmds[0].Name(), "xadd") {
			h.out.say("xadded %d", len(cmds))
			time.Sleep(relayPause)
		}
		return err
	}
}
