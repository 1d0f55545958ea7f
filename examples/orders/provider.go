package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem/httpidem"
)

// serveProvider runs the fake payment provider on c.Provider until ctx
// ends. POST /charges {"order":"o-1","amount":1200}, with an
// Idempotency-Key, charges once per key, as real providers do: a request
// with a key seen before gets the first charge's id back, charges nothing,
// and says "replayed" to the demo. Every charge is a row of provider.db.
func (c child) serveProvider(ctx context.Context, out *reporter) error {
	db, err := openDB(filepath.Join(c.Dir, "provider.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrateProvider(ctx, db); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		key := strings.Trim(r.Header.Get(httpidem.HeaderIdempotencyKey), `"`)
		var req placeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || key == "" || req.Order == "" {
			problem(w, http.StatusBadRequest, "invalid charge", "want an Idempotency-Key and {\"order\": id, \"amount\": cents}")
			return
		}
		ctx := r.Context()
		res, err := db.ExecContext(ctx, "INSERT OR IGNORE INTO charges (key, orderid, amount) VALUES (?, ?, ?)", key, req.Order, req.Amount)
		if err != nil {
			problem(w, http.StatusServiceUnavailable, "database error", err.Error())
			return
		}
		var id int64
		if err := db.QueryRowContext(ctx, "SELECT id FROM charges WHERE key = ?", key).Scan(&id); err != nil {
			problem(w, http.StatusServiceUnavailable, "database error", err.Error())
			return
		}
		if n, _ := res.RowsAffected(); n == 0 {
			out.say("replayed %s", req.Order)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(charge{ID: id})
	})
	return serve(ctx, c.Provider, mux)
}

// charge is the provider's answer.
type charge struct {
	ID int64 `json:"id"`
}

// migrateProvider creates provider.db's table.
func migrateProvider(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, orderid TEXT NOT NULL, amount INTEGER NOT NULL)")
	return err
}
