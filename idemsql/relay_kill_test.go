package idemsql_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/internal/servertest"
	"github.com/idem-go/idem/idemstream"
	"github.com/idem-go/idem/ledgertest"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/redis/go-redis/v9"
)

// The environment of TestChildRelay, set by TestKilledRelay.
const (
	relayChildEnv   = "IDEMSQL_RELAY_CHILD"       // "1" in the child
	relayChildPause = "IDEMSQL_RELAY_CHILD_PAUSE" // n > 0: pause after the n-th XADD pipeline
	relayKills      = 5
	relayEvents     = 200
	relayChildBatch = 20
)

// A relay in a child process is killed with SIGKILL between its XADDs and
// the DELETE of their rows, several times; each time it is started again.
// At the end the outbox is empty, every event reached the stream at least
// once (some twice: the killed batches), and an idemstream consumer that
// commits through the ledger applies each exactly once.
func TestKilledRelay(t *testing.T) {
	for _, be := range servertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			t.Parallel()
			db, dsn := be.Open(t)
			o := &outboxDB{name: be.Name, db: db, ledger: idemsql.New(db, dialects[be.Name]), redis: dbtest.StartRedis(t)}
			if err := o.ledger.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			o.ctx = idemsql.NewContext(context.Background(), o.ledger)
			ids := o.publish(t, "payments", 0, relayEvents, 10)
			rdb := o.redis.Client(t)
			for run := 0; run <= relayKills; run++ {
				last := run == relayKills
				cmd := exec.Command(os.Args[0], "-test.run=^TestChildRelay$", "-test.count=1")
				// Each run relays again the batch that the run before was
				// killed in, and is killed in the next: five different
				// batches are relayed twice.
				pause := "2"
				if last {
					pause = "0"
				}
				cmd.Env = append(os.Environ(), relayChildEnv+"=1", relayChildPause+"="+pause,
					childBackend+"="+be.Name, childDSN+"="+dsn, childRedis+"="+o.redis.Addr())
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				if last {
					ledgertest.WaitUntil(t, "an empty outbox", func() bool { return o.outboxRows(t) == 0 })
				} else {
					lines := bufio.NewScanner(out)
					for lines.Scan() && lines.Text() != "xadded" {
					}
				}
				_ = cmd.Process.Kill() // SIGKILL
				_ = cmd.Wait()
			}
			msgs := ledgertest.StreamEntries(t, rdb, "payments")
			seen := ledgertest.CountIDs(msgs, idemsql.EventIDField)
			twice := 0
			for _, id := range ids {
				switch n := seen[id]; {
				case n == 0:
					t.Errorf("%s: lost", id)
				case n > 1:
					twice++
				}
			}
			// Each kill leaves a batch added and not deleted: a batch's
			// worth of entries more. Count entries, not events relayed
			// twice: the server may not have ended a killed relay's
			// session yet when the next claims, which then skips the dead
			// one's locked rows and relays them in its second batch, killed
			// again: one batch three times, one fewer event twice.
			if extra := len(msgs) - len(ids); extra < relayKills*relayChildBatch {
				t.Errorf("%d entries for %d events: %d more, want at least %d (a batch per kill)", len(msgs), len(ids), extra, relayKills*relayChildBatch)
			}
			t.Logf("%d events, %d entries, %d relayed twice or more", len(ids), len(msgs), twice)
			applied := consumeOnce(t, o, rdb, len(msgs))
			for _, id := range ids {
				if applied[id] != 1 {
					t.Errorf("%s: applied %d times, want 1", id, applied[id])
				}
			}
		})
	}
}

// consumeOnce consumes stream "payments" with idemstream, each handler
// inserting a row and committing through the ledger, until all n entries
// are acknowledged; it returns, by event id, how many rows each has.
func consumeOnce(t *testing.T, o *outboxDB, rdb *redis.Client, n int) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := o.db.ExecContext(ctx, "CREATE TABLE kill_applied (event_id varchar(100) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreateMkStream(ctx, "payments", "charges", "0").Err(); err != nil {
		t.Fatal(err)
	}
	keys := idem.New(rdb, idem.WithLedger(o.ledger), idem.WithLogger(nil))
	defer keys.Close()
	key := func(m redis.XMessage) string { id, _ := m.Values[idemsql.EventIDField].(string); return id }
	c := idemstream.New(keys, rdb, "payments", "charges", "c1", idemstream.WithLogger(nil), idemstream.WithKey(key))
	handler := func(ctx context.Context, m redis.XMessage) error {
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rebind(o.name, "INSERT INTO kill_applied (event_id) VALUES (?)"), key(m)); err != nil {
			_ = tx.Rollback()
			return err
		}
		return idemsql.Commit(ctx, tx, []byte(nil))
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(rctx, handler) })
	waitFor(t, ctx, func() bool { return pendingAndLag(t, rdb) == 0 })
	stop()
	wg.Wait()
	rows, err := o.db.QueryContext(ctx, "SELECT event_id FROM kill_applied")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	applied := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		applied[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return applied
}

// TestChildRelay is the process TestKilledRelay kills: it relays the
// outbox in batches of relayChildBatch; with the pause set, it prints
// "xadded" after each pipeline of XADDs succeeded and waits there, before
// the DELETE, for the kill.
func TestChildRelay(t *testing.T) {
	if os.Getenv(relayChildEnv) != "1" {
		t.Skip("the child process of TestKilledRelay")
	}
	be := backendNamed(os.Getenv(childBackend))
	db := be.Reopen(t, os.Getenv(childDSN))
	l := idemsql.New(db, dialects[be.Name])
	rdb := redisClient(t, os.Getenv(childRedis))
	if n, _ := strconv.Atoi(os.Getenv(relayChildPause)); n > 0 {
		rdb.AddHook(&pauseAfterXAdd{at: n})
	}
	ctx, cancel := context.WithTimeout(context.Background(), childDeadline)
	defer cancel()
	err := l.Relay(ctx, rdb, idemsql.WithRelayBatch(relayChildBatch), idemsql.WithRelayPoll(10*time.Millisecond))
	t.Fatalf("Relay returned %v before the kill", err)
}

// pauseAfterXAdd prints "xadded" after the at-th pipeline of XADDs, and
// waits. Relay's batches run one after the other: n needs no lock.
type pauseAfterXAdd struct {
	at, n int
}

func (*pauseAfterXAdd) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*pauseAfterXAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (p *pauseAfterXAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil || len(cmds) == 0 || !strings.EqualFold(cmds[0].Name(), "xadd") {
			return err
		}
		if p.n++; p.n == p.at {
			fmt.Println("xadded")
			time.Sleep(time.Minute) // the parent kills us here
		}
		return err
	}
}
