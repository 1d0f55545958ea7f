package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// The order events, as their field "type" names them. An order's placed
// event is its version 1, its paid event its version 2.
const (
	eventPlaced = "placed"
	eventPaid   = "paid"
)

// orderService is the order service: orders in orders.db, and the events
// of their changes in the same database's outbox, each committed in the
// change's transaction.
type orderService struct {
	db     *sql.DB
	stream string // of the events
}

// serveOrders runs the order service on c.Orders until ctx ends:
//
//	POST /orders            {"order":"o-1","amount":1200} places an order
//	POST /orders/{id}/pay   pays it
//
// both behind httpidem with a required Idempotency-Key, their answers
// committed in the ledger with the change and its event.
func (c child) serveOrders(ctx context.Context, _ *reporter) error {
	db, err := openDB(filepath.Join(c.Dir, "orders.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	// Every process migrates before its first Commit: the ledger reads its
	// database's id there.
	ledger, err := migrateOrders(ctx, db)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis})
	defer rdb.Close()
	keys := idem.New(rdb, idem.WithLedger(ledger), idem.WithPrefix(c.Prefix+"orders"), idem.WithLease(c.Lease), idem.WithLogger(nil))
	defer keys.Close()

	s := &orderService{db: db, stream: c.stream()}
	idempotent := httpidem.New(keys, httpidem.WithRequired(), httpidem.WithMaxBody(1<<10), httpidem.WithLogger(nil))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotent(http.HandlerFunc(s.place)))
	mux.Handle("POST /orders/{id}/pay", idempotent(http.HandlerFunc(s.pay)))
	return serve(ctx, c.Orders, mux)
}

// placeRequest is the body of POST /orders.
type placeRequest struct {
	Order  string `json:"order"`
	Amount int64  `json:"amount"` // in cents
}

// place handles POST /orders: the order row and its placed event, in one
// transaction with httpidem's answer.
func (s *orderService) place(w http.ResponseWriter, r *http.Request) {
	var req placeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Order == "" || req.Amount <= 0 {
		problem(w, http.StatusBadRequest, "invalid order", "want {\"order\": id, \"amount\": cents > 0}")
		return
	}
	s.change(w, r, req.Order, func(ctx context.Context, tx *sql.Tx) (int, error) {
		res, err := tx.ExecContext(ctx, "INSERT OR IGNORE INTO orders (id, amount, status, version) VALUES (?, ?, ?, 1)", req.Order, req.Amount, eventPlaced)
		if err != nil {
			return 0, err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return http.StatusConflict, nil // placed before, under another key
		}
		_, err = idemsql.Publish(ctx, tx, s.stream, map[string]any{"type": eventPlaced, "order": req.Order, "amount": req.Amount, "version": 1})
		return http.StatusCreated, err
	})
}

// pay handles POST /orders/{id}/pay: the order's new status and its paid
// event, in one transaction with httpidem's answer.
func (s *orderService) pay(w http.ResponseWriter, r *http.Request) {
	order := r.PathValue("id")
	s.change(w, r, order, func(ctx context.Context, tx *sql.Tx) (int, error) {
		var amount int64
		err := tx.QueryRowContext(ctx, "UPDATE orders SET status = ?, version = 2 WHERE id = ? AND status = ? RETURNING amount", eventPaid, order, eventPlaced).Scan(&amount)
		if errors.Is(err, sql.ErrNoRows) {
			return http.StatusConflict, nil // unknown, or paid under another key
		}
		if err != nil {
			return 0, err
		}
		_, err = idemsql.Publish(ctx, tx, s.stream, map[string]any{"type": eventPaid, "order": order, "amount": amount, "version": 2})
		return http.StatusOK, err
	})
}

// change runs apply in a transaction, answers with the status it returns,
// and commits that answer through the ledger: the change, its event and the
// answer commit together, or none does. A retry of the request (the client
// lost the answer, or this process was killed) replays the answer, from
// Redis or, when the key's record is gone, from the ledger.
func (s *orderService) change(w http.ResponseWriter, r *http.Request, order string, apply func(context.Context, *sql.Tx) (int, error)) {
	ctx := r.Context()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "database unavailable", err.Error()) // 5xx: not stored, a retry runs again
		return
	}
	defer tx.Rollback()
	status, err := apply(ctx, tx)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "database error", err.Error())
		return
	}
	if status == http.StatusConflict {
		problem(w, status, "order not in a state for this", order)
	} else {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"order": order})
	}
	b, err := httpidem.Recorded(w)
	if err != nil {
		return // nothing commits
	}
	if err := idemsql.Commit(ctx, tx, b); err != nil && !errors.Is(err, idem.ErrRecorded) && !errors.Is(err, idem.ErrConflict) {
		fmt.Fprintf(os.Stderr, "orders service: commit: %v\n", err)
	}
	// Otherwise another attempt committed first (httpidem answers with its
	// response), or nothing committed (httpidem answers 500 and frees the
	// key; the next attempt finds out from the ledger).
}

// migrateOrders creates orders.db's tables, and returns its ledger.
func migrateOrders(ctx context.Context, db *sql.DB) (*idemsql.Ledger, error) {
	ledger := idemsql.New(db, idemsql.SQLite)
	if err := ledger.Migrate(ctx); err != nil {
		return nil, err
	}
	_, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL)")
	return ledger, err
}

// serve serves h on addr until ctx ends.
func serve(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

// problem answers with an RFC 9457 problem+json body.
func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": title, "status": status, "detail": detail})
}

// errStatus is an answer of a status the client did not want.
type errStatus struct {
	status int
	body   string
}

func (e *errStatus) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }
