package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemstream"
	"github.com/redis/go-redis/v9"
)

// chargePause is how long a charge's answer takes to come back from the
// provider: a slow network, so that the demo can kill a consumer after the
// provider charged and before the step's checkpoint. The next attempt runs
// the step again, with the same key, and the provider replays its charge.
const chargePause = 50 * time.Millisecond

// An event is an order event as the stream carries it.
type event struct {
	ID      string // idemsql.EventIDField: the same in every entry of one event
	Type    string // eventPlaced or eventPaid
	Order   string
	Amount  int64
	Version int64
}

func parseEvent(v map[string]any) (event, error) {
	str := func(k string) string { s, _ := v[k].(string); return s }
	ev := event{ID: str(idemsql.EventIDField), Type: str("type"), Order: str("order")}
	amount, err1 := strconv.ParseInt(str("amount"), 10, 64)
	version, err2 := strconv.ParseInt(str("version"), 10, 64)
	if ev.ID == "" || ev.Order == "" || (ev.Type != eventPlaced && ev.Type != eventPaid) || err1 != nil || err2 != nil {
		return event{}, fmt.Errorf("malformed event %v", v)
	}
	ev.Amount, ev.Version = amount, version
	return ev, nil
}

// payments is a payment consumer: it applies the order events to
// payments.db, and charges paid orders with the provider.
type payments struct {
	db       *sql.DB
	provider *http.Client
	url      string // of the provider's POST /charges
	out      *reporter
}

// consume runs a payment consumer until ctx ends.
func (c child) consume(ctx context.Context, out *reporter) error {
	db, err := openDB(filepath.Join(c.Dir, "payments.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	ledger, err := migratePayments(ctx, db)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithLedger(ledger), idem.WithPrefix(c.Prefix+"payments"),
		idem.WithLease(c.Lease), idem.WithLogger(nil))
	defer keys.Close()
	// The transport sends each request with its step's key (idem.StepKey),
	// the same in every attempt of the event's operation: the provider
	// charges once, however often the step runs.
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	p := &payments{db: db, provider: &http.Client{Transport: httpidem.NewTransport(tr), Timeout: 10 * time.Second},
		url: "http://" + c.Provider + "/charges", out: out}
	// The key is the default, the entry's idemsql.EventIDField: an event
	// relayed twice is applied once. An ErrGap holds an entry back until
	// the event before it is applied, which may wait for a killed
	// consumer's lease to end: short pauses between tries, and a delivery
	// limit high enough that a held event is retried, not dead-lettered.
	consumer := idemstream.New(keys, rdb, c.stream(), group, c.Name,
		idemstream.WithWorkers(2), idemstream.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		idemstream.WithMaxDeliveries(1000), idemstream.WithLogger(nil))
	return consumer.Run(ctx, p.handle)
}

// handle applies one event, in one transaction: the order's version moves
// to the event's (AdvanceInOrder), the event's change is made, the paid
// event's charge is made once (a step, with its key sent to the provider),
// and the outcome commits in the ledger.
func (p *payments) handle(ctx context.Context, m redis.XMessage) error {
	ev, err := parseEvent(m.Values)
	if err != nil {
		return idem.Permanent(err) // no redelivery makes it an event
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	switch err := idemsql.AdvanceInOrder(ctx, tx, "order/"+ev.Order, ev.Version); {
	case errors.Is(err, idemsql.ErrGap):
		// An earlier event of the order is not applied yet: this one
		// comes back later.
		p.out.say("gap %s %d", ev.Order, ev.Version)
		return err
	case errors.Is(err, idemsql.ErrStale):
		p.out.say("stale %s %d", ev.Order, ev.Version)
		return err // permanent: acknowledged, not applied
	case err != nil:
		return err
	}
	switch ev.Type {
	case eventPlaced:
		_, err = tx.ExecContext(ctx, "INSERT INTO payments (orderid, amount, status) VALUES (?, ?, 'due')", ev.Order, ev.Amount)
	case eventPaid:
		var c charge
		if c, err = idem.Step(ctx, "charge", func(ctx context.Context) (charge, error) { return p.charge(ctx, ev) }); err == nil {
			_, err = tx.ExecContext(ctx, "UPDATE payments SET status = 'charged', charge = ? WHERE orderid = ?", c.ID, ev.Order)
		}
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO applied (event, orderid, version) VALUES (?, ?, ?)", ev.ID, ev.Order, ev.Version); err != nil {
		return err
	}
	if err := idemsql.Commit(ctx, tx, []byte(nil)); err != nil {
		return err
	}
	p.out.say("applied %s %d", ev.Order, ev.Version)
	return nil
}

// charge asks the provider to charge ev's order.
func (p *payments) charge(ctx context.Context, ev event) (charge, error) {
	body, _ := json.Marshal(placeRequest{Order: ev.Order, Amount: ev.Amount}) // plain fields: never fails
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.provider.Do(req)
	if err != nil {
		return charge{}, err // the provider may have charged: the next try sends the same key
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return charge{}, &errStatus{status: resp.StatusCode, body: string(b)}
	}
	var c charge
	if err := json.Unmarshal(b, &c); err != nil {
		return charge{}, err
	}
	p.out.say("charged %s", ev.Order)
	time.Sleep(chargePause)
	return c, nil
}

// migratePayments creates payments.db's tables: the ledger's (with the
// entity versions), the payments, and a row per event applied, which the
// demo counts. It returns the ledger.
func migratePayments(ctx context.Context, db *sql.DB) (*idemsql.Ledger, error) {
	ledger := idemsql.New(db, idemsql.SQLite)
	if err := ledger.Migrate(ctx); err != nil {
		return nil, err
	}
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS payments (orderid TEXT PRIMARY KEY, amount INTEGER NOT NULL, status TEXT NOT NULL, charge INTEGER)",
		"CREATE TABLE IF NOT EXISTS applied (seq INTEGER PRIMARY KEY AUTOINCREMENT, event TEXT NOT NULL, orderid TEXT NOT NULL, version INTEGER NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	return ledger, nil
}
