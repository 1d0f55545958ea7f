package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/examples/internal/demoredis"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// config is one run's workload.
type config struct {
	orders    int           // orders placed
	paid      float64       // share of them paid
	consumers int           // payment consumer processes
	kills     int           // processes killed with SIGKILL (and started again)
	lease     time.Duration // idem's lease (WithLease)
	seed      uint64        // seeds the amounts, the payments and the kills
	timeout   time.Duration // how long the run may take
}

// defaultConfig returns the workload of a plain `go run ./orders` (in
// examples/).
func defaultConfig() config {
	return config{orders: 200, paid: 0.8, consumers: 2, kills: 12, lease: time.Second, seed: 1, timeout: 2 * time.Minute}
}

// validate reports the first setting out of range, named by its flag.
func (c config) validate() error {
	switch {
	case c.orders < 1:
		return fmt.Errorf("-orders %d: must be at least 1", c.orders)
	case c.paid < 0 || c.paid > 1:
		return fmt.Errorf("-paid %v: must be between 0 and 1", c.paid)
	case c.consumers < 1:
		return fmt.Errorf("-consumers %d: must be at least 1", c.consumers)
	case c.kills < 0:
		return fmt.Errorf("-kills %d: must not be negative", c.kills)
	case c.lease < 10*time.Millisecond:
		return fmt.Errorf("-lease %v: must be at least 10ms", c.lease)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: must be positive", c.timeout)
	}
	return nil
}

// report is what a run did, counted from the databases, the stream and the
// processes' lines.
type report struct {
	cfg config

	orders, paid int // in orders.db
	published    int // events in orders.db's changes: a placed one per order, a paid one per payment
	entries      int // in the stream
	relayedTwice int // events in more than one entry

	applied      int // rows in payments.db's applied table
	appliedTwice int // events with more than one
	neverApplied int // published events with none
	outOfOrder   int // orders whose events were applied in another order than their versions'
	held         int // tries of an event that AdvanceInOrder held back (ErrGap)
	stale        int // events refused as stale (ErrStale)

	charges       int // rows in provider.db
	replayed      int // requests the provider answered from a charge made before
	doubleCharged int // orders charged more than once
	wrongCharges  int // paid orders not charged once, and orders charged but not paid

	deadLetters int64          // entries in the dead-letter stream
	pending     int64          // entries left unacknowledged
	kills       map[string]int // by role
}

// ok reports whether every event was applied once, in order, and every
// paid order charged once.
func (r report) ok() bool {
	return r.appliedTwice == 0 && r.neverApplied == 0 && r.outOfOrder == 0 && r.doubleCharged == 0 && r.wrongCharges == 0 &&
		r.deadLetters == 0 && r.pending == 0 && r.orders == r.cfg.orders
}

// run runs the demo on the Redis at addr ("" for an embedded miniredis).
func run(ctx context.Context, cfg config, addr string) (report, error) {
	rep := report{cfg: cfg, kills: map[string]int{}}
	if err := cfg.validate(); err != nil {
		return rep, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return rep, err
		}
		defer mr.Close()
		defer demoredis.FollowWallClock(mr)()
		addr = mr.Addr()
	}
	dir, err := os.MkdirTemp("", "idem-orders-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	base := child{Redis: addr, Dir: dir, Prefix: demoredis.RunPrefix("orders"), Lease: cfg.lease}
	defer demoredis.Cleanup(rdb, base.Prefix)
	if base.Orders, err = freeAddr(); err != nil {
		return rep, err
	}
	if base.Provider, err = freeAddr(); err != nil {
		return rep, err
	}
	dbs, err := openDatabases(ctx, dir)
	if err != nil {
		return rep, err
	}
	defer dbs.close()
	if err := rdb.XGroupCreateMkStream(ctx, base.stream(), group, "0").Err(); err != nil {
		return rep, err
	}

	d := &demo{cfg: cfg, base: base, rdb: rdb, procs: map[string]*proc{}, xadded: make(chan struct{}), charged: make(chan string), rng: mrand.New(mrand.NewPCG(cfg.seed, 2))}
	defer d.stopAll()
	names := []string{roleOrders, roleRelay, roleProvider}
	for i := range cfg.consumers {
		names = append(names, fmt.Sprintf("%s-%d", rolePayments, i))
	}
	for _, name := range names {
		if err := d.start(name); err != nil {
			return rep, err
		}
	}
	clientDone := make(chan error, 1)
	go func() { clientDone <- d.client(ctx) }()
	if err := d.killSome(ctx, names, rep.kills); err != nil {
		return rep, err
	}
	if err := <-clientDone; err != nil {
		return rep, fmt.Errorf("client: %w", err)
	}
	if err := d.drained(ctx, dbs.orders); err != nil {
		return rep, err
	}
	d.stopAll()
	rep.held, rep.stale, rep.replayed = int(d.held.Load()), int(d.stale.Load()), int(d.replayed.Load())
	return rep, d.count(ctx, dbs, &rep)
}

// demo is a run's processes and what they said.
type demo struct {
	cfg  config
	base child // the settings of every process but its role and name
	rdb  *redis.Client
	rng  *mrand.Rand // for the kills, in run's goroutine

	mu    sync.Mutex // guards procs
	procs map[string]*proc

	held, stale, replayed atomic.Int64  // lines of gap, stale, replayed
	xadded                chan struct{} // a relay's XADDs went out (see relayPause)
	charged               chan string   // a consumer, by name, got a charge (see chargePause)
}

// proc is a running process.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser // closed to stop it
	done  chan struct{}  // its stdout closed
}

// start starts the process called name: its role, and for consumers a
// number.
func (d *demo) start(name string) error {
	c := d.base
	c.Name = name
	c.Role, _, _ = strings.Cut(name, "-")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), c.env())
	cmd.Stderr = os.Stderr
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			word, _, _ := strings.Cut(sc.Text(), " ")
			switch word {
			case "gap":
				d.held.Add(1)
			case "stale":
				d.stale.Add(1)
			case "replayed":
				d.replayed.Add(1)
			case "xadded":
				select {
				case d.xadded <- struct{}{}:
				default: // no kill waits for it
				}
			case "charged":
				select {
				case d.charged <- name:
				default:
				}
			}
		}
	}()
	d.mu.Lock()
	d.procs[name] = p
	d.mu.Unlock()
	return nil
}

// kill kills the process called name with SIGKILL (TerminateProcess on
// Windows), waits for it, and starts it again.
func (d *demo) kill(name string) error {
	d.mu.Lock()
	p := d.procs[name]
	d.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
	return d.start(name)
}

// killSome kills cfg.kills processes, one every 100 to 400ms, each role in
// turn: the relay right after its XADDs (before it deleted their rows), a
// consumer right after the provider charged (before the step's
// checkpoint), the others wherever they are.
func (d *demo) killSome(ctx context.Context, names []string, kills map[string]int) error {
	roles := []string{roleRelay, rolePayments, roleOrders, roleProvider}
	for k := range d.cfg.kills {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(100+d.rng.IntN(300)) * time.Millisecond):
		}
		role := roles[k%len(roles)]
		name := role
		switch role {
		case rolePayments:
			select {
			case name = <-d.charged:
			case <-time.After(5 * time.Second): // nothing to charge: any consumer
				name = names[3+d.rng.IntN(d.cfg.consumers)]
			}
		case roleRelay:
			select {
			case <-d.xadded:
			case <-time.After(5 * time.Second): // nothing to relay: kill it anyway
			}
		}
		if err := d.kill(name); err != nil {
			return err
		}
		kills[role]++
	}
	return nil
}

// stopAll closes every process's stdin, which ends it, and waits for it;
// one that does not end within ten seconds is killed.
func (d *demo) stopAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, p := range d.procs {
		_ = p.stdin.Close()
		t := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
		<-p.done
		_ = p.cmd.Wait()
		t.Stop()
		delete(d.procs, name)
	}
}

// client places cfg.orders orders and pays some, four at a time, each
// request retried with its Idempotency-Key until it gets its answer: the
// order service is killed now and then.
func (d *demo) client(ctx context.Context) error {
	rng := mrand.New(mrand.NewPCG(d.cfg.seed, 1))
	type order struct {
		id     string
		amount int64
		pay    bool
	}
	work := make(chan order)
	go func() {
		defer close(work)
		for i := range d.cfg.orders {
			o := order{id: fmt.Sprintf("o-%d", i), amount: 100 + rng.Int64N(10_000), pay: rng.Float64() < d.cfg.paid}
			select {
			case work <- o:
			case <-ctx.Done():
				return
			}
		}
	}()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + d.base.Orders
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for o := range work {
				body, _ := json.Marshal(placeRequest{Order: o.id, Amount: o.amount}) // plain fields: never fails
				if err := post(ctx, hc, url+"/orders", "place-"+o.id, body, http.StatusCreated); err != nil {
					errs <- err
					return
				}
				if o.pay {
					if err := post(ctx, hc, url+"/orders/"+o.id+"/pay", "pay-"+o.id, nil, http.StatusOK); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// post sends a POST with key until it gets an answer: want, or another
// that is final. It tries again after an error or an answer that asks for
// it (5xx, or 409 with Retry-After: the key in progress, maybe held by a
// process that was killed, until its lease ends).
func post(ctx context.Context, hc *http.Client, url, key string, body []byte, want int) error {
	var last any
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set(httpidem.HeaderIdempotencyKey, key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err == nil {
			last = resp.Status
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			last = resp.Status + " " + string(b)
			switch {
			case resp.StatusCode == want:
				return nil
			case resp.StatusCode < 500 && (resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") == ""):
				return fmt.Errorf("POST %s: %w", url, &errStatus{status: resp.StatusCode, body: string(b)})
			}
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("POST %s: %w (last: %v)", url, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// drained waits until the outbox is empty and the group has delivered and
// acknowledged every entry of the stream.
func (d *demo) drained(ctx context.Context, orders *sql.DB) error {
	for {
		var rows int
		err := orders.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_ledger_outbox").Scan(&rows)
		if err == nil && rows == 0 {
			var groups []redis.XInfoGroup
			var last []redis.XMessage
			if groups, err = d.rdb.XInfoGroups(ctx, d.base.stream()).Result(); err == nil {
				last, err = d.rdb.XRevRangeN(ctx, d.base.stream(), "+", "-", 1).Result()
			}
			if err == nil && len(groups) == 1 && len(last) == 1 && groups[0].LastDeliveredID == last[0].ID && groups[0].Pending == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not every event relayed and acknowledged within -timeout %v (outbox rows %d, %v)", d.cfg.timeout, rows, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// count fills rep in from the databases and the stream.
func (d *demo) count(ctx context.Context, dbs *databases, rep *report) error {
	if err := dbs.orders.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(*) FILTER (WHERE status = ?) FROM orders", eventPaid).Scan(&rep.orders, &rep.paid); err != nil {
		return err
	}
	rep.published = rep.orders + rep.paid
	msgs, err := d.rdb.XRange(ctx, d.base.stream(), "-", "+").Result()
	if err != nil {
		return err
	}
	rep.entries = len(msgs)
	relayed := map[string]int{}
	for _, m := range msgs {
		id, _ := m.Values[idemsql.EventIDField].(string)
		if relayed[id]++; relayed[id] == 2 {
			rep.relayedTwice++
		}
	}
	unrelayed := max(rep.published-len(relayed), 0)

	applied := map[string]int{}
	versions := map[string][]int64{} // by order, in the order applied
	err = scan(ctx, dbs.payments, "SELECT event, orderid, version FROM applied ORDER BY seq", func(r *sql.Rows) error {
		var ev, order string
		var v int64
		err := r.Scan(&ev, &order, &v)
		applied[ev]++
		versions[order] = append(versions[order], v)
		return err
	})
	if err != nil {
		return err
	}
	for id, n := range applied {
		rep.applied += n
		if n > 1 {
			rep.appliedTwice++
		}
		delete(relayed, id)
	}
	rep.neverApplied = len(relayed) + unrelayed
	for _, vs := range versions {
		for i, v := range vs {
			if v != int64(i+1) {
				rep.outOfOrder++
				break
			}
		}
	}

	charged := map[string]int{}
	err = scan(ctx, dbs.provider, "SELECT orderid FROM charges", func(r *sql.Rows) error {
		var order string
		err := r.Scan(&order)
		charged[order]++
		rep.charges++
		return err
	})
	if err != nil {
		return err
	}
	err = scan(ctx, dbs.orders, "SELECT id, status FROM orders", func(r *sql.Rows) error {
		var order, status string
		err := r.Scan(&order, &status)
		n := charged[order]
		if n > 1 {
			rep.doubleCharged++
		}
		if (status == eventPaid) != (n == 1) {
			rep.wrongCharges++
		}
		delete(charged, order)
		return err
	})
	if err != nil {
		return err
	}
	rep.wrongCharges += len(charged) // orders the service never had

	if rep.deadLetters, err = d.rdb.XLen(ctx, d.base.stream()+":dead").Result(); err != nil {
		return err
	}
	p, err := d.rdb.XPending(ctx, d.base.stream(), group).Result()
	if err != nil {
		return err
	}
	rep.pending = p.Count
	return nil
}

// scan calls row for every row of query.
func scan(ctx context.Context, db *sql.DB, query string, row func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := row(rows); err != nil {
			rows.Close()
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}

// databases are the demo's own handles on the three SQLite files.
type databases struct {
	orders, payments, provider *sql.DB
}

// openDatabases creates the three databases and their tables.
func openDatabases(ctx context.Context, dir string) (*databases, error) {
	dbs := &databases{}
	for _, db := range []struct {
		to      **sql.DB
		file    string
		migrate func(context.Context, *sql.DB) error
	}{
		{&dbs.orders, "orders.db", func(ctx context.Context, db *sql.DB) error { _, err := migrateOrders(ctx, db); return err }},
		{&dbs.payments, "payments.db", func(ctx context.Context, db *sql.DB) error { _, err := migratePayments(ctx, db); return err }},
		{&dbs.provider, "provider.db", migrateProvider},
	} {
		var err error
		if *db.to, err = openDB(filepath.Join(dir, db.file)); err == nil {
			err = db.migrate(ctx, *db.to)
		}
		if err != nil {
			dbs.close()
			return nil, fmt.Errorf("%s: %w", db.file, err)
		}
	}
	return dbs, nil
}

func (dbs *databases) close() {
	for _, db := range []*sql.DB{dbs.orders, dbs.payments, dbs.provider} {
		if db != nil {
			db.Close()
		}
	}
}

// freeAddr returns a loopback address with a free port, for a process that
// listens on it and, once killed, its successor.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
