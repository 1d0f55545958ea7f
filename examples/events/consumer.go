package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// childEnv, in a process's environment, makes it a consumer process of
// the demo (see consumerMain): the variable holds its settings.
const childEnv = "EVENTS_CONSUMER"

// A child is what a consumer process is told, in childEnv.
type child struct {
	Mode     string // "idem" or "plain"
	Redis    string // address
	DB       string // SQLite file
	Stream   string
	Prefix   string        // of idem's records
	Consumer string        // the consumer's name in the group
	Lease    time.Duration // idem's lease
	Work     time.Duration // how long applying an event takes, besides SQLite
}

const group = "ledger"

// env returns c as the environment variable of a consumer process.
func (c child) env() string {
	b, _ := json.Marshal(c) // plain fields: never fails
	return childEnv + "=" + string(b)
}

// consumerMain runs a consumer process until its stdin closes (the demo
// is done with it, or died), and reports each event it committed on its
// stdout: "committed <event id>". It returns the exit status.
func consumerMain(settings string) int {
	var c child
	if err := json.Unmarshal([]byte(settings), &c); err != nil {
		fmt.Fprintf(os.Stderr, "events consumer: bad %s %q: %v\n", childEnv, settings, err)
		return 2
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	if err := c.run(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "events consumer %s: %v\n", c.Consumer, err)
		return 1
	}
	return 0
}

// run consumes c.Stream until ctx ends.
func (c child) run(ctx context.Context, out io.Writer) error {
	db, err := openDB(c.DB)
	if err != nil {
		return err
	}
	defer db.Close()
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis})
	defer rdb.Close()
	var mu sync.Mutex // guards w
	w := bufio.NewWriter(out)
	say := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
		return w.Flush()
	}
	report := func(ev event) error { return say("committed %s", ev.ID) }
	if c.Mode == "plain" {
		return c.plain(ctx, rdb, db, report)
	}

	ledger := idemsql.New(db, idemsql.SQLite)
	keys := idem.New(rdb, idem.WithLedger(ledger), idem.WithPrefix(c.Prefix), idem.WithLease(c.Lease), idem.WithLogger(nil),
		idem.WithObserver(foundInLedger(func() { _ = say("found") })))
	defer keys.Close()
	consumer := idemstream.New(keys, rdb, c.Stream, group, c.Consumer,
		idemstream.WithKey(func(m redis.XMessage) string { id, _ := m.Values["id"].(string); return id }),
		idemstream.WithFingerprint(func(m redis.XMessage) string { return idem.Fingerprint(m.Values["account"], m.Values["amount"]) }),
		idemstream.WithWorkers(4), idemstream.WithBackoff(10*time.Millisecond, time.Second))
	return consumer.Run(ctx, func(ctx context.Context, m redis.XMessage) error {
		ev, err := parseEvent(m.Values)
		if err != nil {
			return idem.Permanent(err) // no redelivery makes it an event
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := credit(ctx, tx, ev, c.Work); err != nil {
			return err
		}
		// The outcome commits with the credit, or neither does: a
		// consumer killed anywhere leaves the event applied and recorded,
		// or neither. The result is empty: idemstream stores none.
		if err := idemsql.Commit(ctx, tx, []byte(nil)); err != nil {
			return err
		}
		return report(ev)
	})
}

// plain is the consumer without idem, for comparison: apply, commit,
// acknowledge; entries left by a dead consumer are taken over after
// twice the lease, as idemstream does.
func (c child) plain(ctx context.Context, rdb *redis.Client, db *sql.DB, report func(event) error) error {
	if err := rdb.XGroupCreateMkStream(ctx, c.Stream, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return err
	}
	for ctx.Err() == nil {
		msgs, _, err := rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: c.Stream, Group: group, Consumer: c.Consumer,
			MinIdle: 2 * c.Lease, Start: "0-0", Count: 16}).Result()
		if err == nil && len(msgs) == 0 {
			var res []redis.XStream
			res, err = rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: c.Consumer,
				Streams: []string{c.Stream, ">"}, Count: 16, Block: 100 * time.Millisecond}).Result()
			if len(res) > 0 {
				msgs = res[0].Messages
			}
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for _, m := range msgs {
			ev, err := parseEvent(m.Values)
			if err == nil {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := credit(ctx, tx, ev, c.Work); err != nil {
					_ = tx.Rollback()
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				if err := report(ev); err != nil {
					return err
				}
			}
			if err := rdb.XAck(ctx, c.Stream, group, m.ID).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// credit is the business change, in tx: a row of the credits table and
// the account's new balance. Nothing in it stops a second application.
func credit(ctx context.Context, tx *sql.Tx, ev event, work time.Duration) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO credits(event, account, amount) VALUES (?, ?, ?)`, ev.ID, ev.Account, ev.Amount); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO accounts(id, balance) VALUES (?, ?)
		ON CONFLICT(id) DO UPDATE SET balance = balance + excluded.balance`, ev.Account, ev.Amount); err != nil {
		return err
	}
	time.Sleep(work)
	return nil
}

// openDB opens the SQLite file at path, as idemsql's documentation
// says: writers wait for each other, readers do not wait for them.
func openDB(path string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+path+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
}

// An event credits Amount to Account. ID is its stable business id, the
// same in every stream entry that carries it: the idempotency key.
type event struct {
	ID      string
	Account string
	Amount  int64
}

func (e event) values() []any { return []any{"id", e.ID, "account", e.Account, "amount", e.Amount} }

func parseEvent(v map[string]any) (event, error) {
	id, _ := v["id"].(string)
	account, _ := v["account"].(string)
	amount, err := strconv.ParseInt(fmt.Sprint(v["amount"]), 10, 64)
	if id == "" || account == "" || err != nil {
		return event{}, fmt.Errorf("malformed event %v", v)
	}
	return event{ID: id, Account: account, Amount: amount}, nil
}

// foundInLedger returns an Observer that calls found for each call that
// took over a key from a dead attempt and replayed the outcome that
// attempt had committed to the ledger: the event a consumer was killed
// after applying, which is not applied again.
func foundInLedger(found func()) idem.Observer {
	var mu sync.Mutex
	tookOver := map[string]bool{} // by key digest: calls between their takeover and outcome
	return observerFunc(func(_ context.Context, e idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e.Kind == idem.EventTookOver:
			tookOver[e.Key] = true
		case e.Kind == idem.EventLedgerReplayed && tookOver[e.Key]:
			found()
			fallthrough
		case e.Kind.Outcome():
			delete(tookOver, e.Key)
		}
	})
}

// observerFunc adapts a function to an idem.Observer.
type observerFunc func(ctx context.Context, e idem.Event)

// Observe calls f.
func (f observerFunc) Observe(ctx context.Context, e idem.Event) { f(ctx, e) }
