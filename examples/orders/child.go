package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// childEnv, in a process's environment, makes it one of the demo's
// processes (see childMain): the variable holds its settings.
const childEnv = "ORDERS_CHILD"

// The roles of the demo's processes.
const (
	roleOrders   = "orders"   // the order service: HTTP, orders.db, the outbox
	roleRelay    = "relay"    // the outbox's relay: orders.db to the stream
	rolePayments = "payments" // a payment consumer: the stream, payments.db, the provider
	roleProvider = "provider" // the fake payment provider: HTTP, provider.db
)

// group is the payment consumers' group on the stream of order events.
const group = "payments"

// A child is what a process of the demo is told, in childEnv.
type child struct {
	Role     string
	Name     string        // the process's name: its role, and a number for consumers
	Redis    string        // address
	Dir      string        // the directory of the SQLite files
	Prefix   string        // of every Redis key the run writes
	Orders   string        // the order service's address
	Provider string        // the provider's address
	Lease    time.Duration // idem's lease
}

// stream returns the name of the Redis Stream of the order events.
func (c child) stream() string { return c.Prefix + "orders" }

// env returns c as the environment variable of a child process.
func (c child) env() string {
	b, _ := json.Marshal(c) // plain fields: never fails
	return childEnv + "=" + string(b)
}

// childMain runs a process of the demo until its stdin closes (the demo is
// done with it, or died). The process tells the demo what it does with
// lines on its stdout (see say). It returns the exit status.
func childMain(settings string) int {
	var c child
	if err := json.Unmarshal([]byte(settings), &c); err != nil {
		fmt.Fprintf(os.Stderr, "orders child: bad %s %q: %v\n", childEnv, settings, err)
		return 2
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	out := &reporter{w: bufio.NewWriter(os.Stdout)}
	var err error
	switch c.Role {
	case roleOrders:
		err = c.serveOrders(ctx, out)
	case roleRelay:
		err = c.relay(ctx, out)
	case rolePayments:
		err = c.consume(ctx, out)
	case roleProvider:
		err = c.serveProvider(ctx, out)
	default:
		err = fmt.Errorf("unknown role %q", c.Role)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "orders %s: %v\n", c.Name, err)
		return 1
	}
	return 0
}

// A reporter writes a child's lines to the demo, one at a time.
type reporter struct {
	mu sync.Mutex // guards w
	w  *bufio.Writer
}

// say writes one line, at once: the process may be killed right after.
func (r *reporter) say(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.w, format+"\n", args...)
	_ = r.w.Flush()
}

// sqliteOptions make SQLite's writers, in this process and the others, wait
// for each other instead of failing with "database is locked" (see
// idemsql's package doc).
const sqliteOptions = "_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

// openDB opens the SQLite file at path.
func openDB(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?"+sqliteOptions)
	if err != nil {
		return nil, err
	}
	// Writers queue in the pool rather than in SQLite's busy handler.
	db.SetMaxOpenConns(1)
	return db, nil
}
