package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemsql"
	_ "modernc.org/sqlite" // the "sqlite" driver
)

// openingBalance is what every account holds when it is first used, in
// cents.
const openingBalance = 100_000

// sqliteOptions make SQLite's writers wait for each other instead of
// failing with "database is locked" (see idemsql's package doc).
const sqliteOptions = "_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

// A debit is the record of one debit.
type debit struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`  // in cents
	Balance int64  `json:"balance"` // after the debit, in cents
}

// bank is the service's database: the accounts, their debits, and the
// ledger in which the debit handler commits its response with the debit
// (idemsql), so that a retry never debits twice, even after Redis lost
// the key's record.
type bank struct {
	db     *sql.DB
	ledger *idemsql.Ledger
	delay  time.Duration // how long a debit takes
}

// openBank opens (or creates) the SQLite database at path.
func openBank(ctx context.Context, path string, delay time.Duration) (*bank, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?"+sqliteOptions)
	if err != nil {
		return nil, err
	}
	// One connection: writers queue in the pool instead of in SQLite's
	// busy handler (see idemsql's package doc).
	db.SetMaxOpenConns(1)
	b := &bank{db: db, ledger: idemsql.New(db, idemsql.SQLite), delay: delay}
	if err := b.create(ctx); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return b, nil
}

// create makes the tables, if they are not there yet.
func (b *bank) create(ctx context.Context) error {
	if err := b.ledger.Migrate(ctx); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)",
		"CREATE TABLE IF NOT EXISTS debits (n INTEGER PRIMARY KEY AUTOINCREMENT, account TEXT NOT NULL, amount INTEGER NOT NULL, balance INTEGER NOT NULL)",
	} {
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// errInsufficientFunds is the refusal of a debit larger than the balance:
// a final answer, committed and replayed like a success.
var errInsufficientFunds = errors.New("insufficient funds")

// debit takes amount from account in tx, and returns the debit.
func (b *bank) debit(ctx context.Context, tx *sql.Tx, account string, amount int64) (debit, error) {
	time.Sleep(b.delay)
	if _, err := tx.ExecContext(ctx, "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?, ?)", account, openingBalance); err != nil {
		return debit{}, err
	}
	var bal int64
	if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", account).Scan(&bal); err != nil {
		return debit{}, err
	}
	if amount > bal {
		return debit{}, fmt.Errorf("%w: %d cents asked, %d held", errInsufficientFunds, amount, bal)
	}
	d := debit{Account: account, Amount: amount, Balance: bal - amount}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE id = ?", d.Balance, account); err != nil {
		return debit{}, err
	}
	var n int64
	if err := tx.QueryRowContext(ctx, "INSERT INTO debits (account, amount, balance) VALUES (?, ?, ?) RETURNING n", account, amount, d.Balance).Scan(&n); err != nil {
		return debit{}, err
	}
	d.ID = fmt.Sprintf("d-%d", n)
	return d, nil
}

// Account returns an account's balance and its debits.
func (b *bank) Account(ctx context.Context, account string) (balance int64, debits []debit, err error) {
	err = b.db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", account).Scan(&balance)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return openingBalance, nil, nil
	case err != nil:
		return 0, nil, err
	}
	rows, err := b.db.QueryContext(ctx, "SELECT n, amount, balance FROM debits WHERE account = ? ORDER BY n", account)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		d := debit{Account: account}
		var n int64
		if err := rows.Scan(&n, &d.Amount, &d.Balance); err != nil {
			return 0, nil, err
		}
		d.ID = fmt.Sprintf("d-%d", n)
		debits = append(debits, d)
	}
	return balance, debits, rows.Err()
}

// service is the HTTP API of the debit service.
type service struct {
	bank   *bank
	logger *slog.Logger
}

// routes returns the service's handler: POST /debits behind httpidem (a key
// is required, and scoped by the caller), GET /accounts/{id} without it.
func (s *service) routes(keys *idem.Client) http.Handler {
	idempotent := httpidem.New(keys,
		httpidem.WithRequired(),
		httpidem.WithScope(caller),
		httpidem.WithMaxBody(4<<10),
		httpidem.WithLogger(s.logger))
	mux := http.NewServeMux()
	mux.Handle("POST /debits", idempotent(http.HandlerFunc(s.debit)))
	mux.HandleFunc("GET /accounts/{id}", s.account)
	return mux
}

// errNoCaller is the scope's refusal of a request without credentials.
var errNoCaller = errors.New("send Authorization: Bearer <name>")

// caller returns the principal of a request, which scopes its key. A real
// service would verify a token here; this demo takes the bearer token as
// the caller's name.
func caller(r *http.Request) (string, error) {
	name, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || name == "" {
		return "", errNoCaller
	}
	return name, nil
}

// debitRequest is the body of POST /debits.
type debitRequest struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"` // in cents
}

// debitResponse is the body of a successful POST /debits.
type debitResponse struct {
	debit
	// Attempt is the idem attempt that ran the handler: above 1 when an
	// earlier attempt failed or its owner died.
	Attempt int64 `json:"attempt"`
}

// debit handles POST /debits. It debits the account and commits its answer
// (errors included: a 402 is final too) in one transaction, through the
// ledger: httpidem replays that answer to every retry, and when Redis lost
// the key's record, the commit meets the ledger's row, the transaction
// rolls back, and httpidem answers with the committed response instead.
func (s *service) debit(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req debitRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "invalid body", err.Error()) // no change to commit: stored as is
		return
	}
	if req.Account == "" || req.Amount <= 0 {
		problem(w, http.StatusBadRequest, "invalid debit", "account must be set and amount positive (in cents)")
		return
	}
	tx, err := s.bank.db.BeginTx(ctx, nil)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "database unavailable", err.Error()) // 5xx: not stored, a retry runs again
		return
	}
	defer tx.Rollback()
	a, _ := idem.AttemptFrom(ctx)
	d, err := s.bank.debit(ctx, tx, req.Account, req.Amount)
	switch {
	case errors.Is(err, errInsufficientFunds):
		problem(w, http.StatusPaymentRequired, "insufficient funds", err.Error())
	case err != nil:
		problem(w, http.StatusServiceUnavailable, "database error", err.Error())
		return
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/debits/"+d.ID)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(debitResponse{debit: d, Attempt: a.Number})
	}
	// The response, as httpidem stores it, commits with the debit.
	b, err := httpidem.Recorded(w)
	if err != nil {
		s.logger.ErrorContext(ctx, "httpdebit: response not recordable", "err", err)
		return // nothing commits; httpidem stores what was written
	}
	switch err := idemsql.Commit(ctx, tx, b); {
	case errors.Is(err, idem.ErrRecorded), errors.Is(err, idem.ErrConflict):
		// Another attempt committed first: httpidem answers with its
		// response (or 422), not this one.
	case err != nil:
		// Not committed, or unknown: httpidem answers 500 and frees the
		// key; the next attempt finds out from the ledger.
		s.logger.ErrorContext(ctx, "httpdebit: commit", "err", err)
	}
}

// account handles GET /accounts/{id}: the balance and the debits.
func (s *service) account(w http.ResponseWriter, r *http.Request) {
	balance, debits, err := s.bank.Account(r.Context(), r.PathValue("id"))
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "database error", err.Error())
		return
	}
	if debits == nil {
		debits = []debit{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Balance int64   `json:"balance"`
		Debits  []debit `json:"debits"`
	}{balance, debits})
}

// problem answers with an RFC 9457 problem+json body.
func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": title, "status": status, "detail": detail})
}
