package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
)

// openingBalance is what every account holds when the service starts, in
// cents.
const openingBalance = 100_000

// errInsufficientFunds is the bank's refusal of a debit larger than the
// balance: a final answer, stored and replayed like a success.
var errInsufficientFunds = errors.New("insufficient funds")

// A debit is the bank's record of one debit.
type debit struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`  // in cents
	Balance int64  `json:"balance"` // after the debit, in cents
}

// bank is the downstream system whose side effect must not repeat: an
// in-memory ledger. Like a real bank's API, it is idempotent by reference
// too (the downstream defence the idem README recommends): a second debit
// with a reference it has seen returns the first one.
type bank struct {
	delay time.Duration // how long a debit takes

	mu       sync.Mutex
	balances map[string]int64 // guarded by mu; by account
	byRef    map[string]debit // guarded by mu; by reference
	debits   []debit          // guarded by mu; in order
}

func newBank(delay time.Duration) *bank {
	return &bank{delay: delay, balances: make(map[string]int64), byRef: make(map[string]debit)}
}

// Debit debits amount from account under the reference ref, or returns the
// debit already made under ref.
func (b *bank) Debit(ref, account string, amount int64) (debit, error) {
	time.Sleep(b.delay)
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.byRef[ref]; ok {
		return d, nil
	}
	bal, ok := b.balances[account]
	if !ok {
		bal = openingBalance
	}
	if amount > bal {
		return debit{}, fmt.Errorf("%w: %d cents asked, %d held", errInsufficientFunds, amount, bal)
	}
	d := debit{ID: fmt.Sprintf("d-%d", len(b.debits)+1), Account: account, Amount: amount, Balance: bal - amount}
	b.balances[account] = d.Balance
	b.byRef[ref] = d
	b.debits = append(b.debits, d)
	return d, nil
}

// Account returns an account's balance and its debits.
func (b *bank) Account(account string) (balance int64, debits []debit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	balance, ok := b.balances[account]
	if !ok {
		balance = openingBalance
	}
	for _, d := range b.debits {
		if d.Account == account {
			debits = append(debits, d)
		}
	}
	return balance, debits
}

// service is the HTTP API of the debit service.
type service struct {
	bank *bank
}

// routes returns the service's handler: POST /debits behind httpidem (a key
// is required, and scoped by the caller), GET /accounts/{id} without it.
func (s *service) routes(keys *idem.Client, logger *slog.Logger) http.Handler {
	idempotent := httpidem.New(keys,
		httpidem.WithRequired(),
		httpidem.WithScope(caller),
		httpidem.WithMaxBody(4<<10),
		httpidem.WithLogger(logger))
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
	// Attempt is the idem attempt that ran the handler: above 1 after a
	// failed attempt, when the bank's own idempotency by reference keeps
	// the debit single.
	Attempt int64 `json:"attempt"`
}

// debit handles POST /debits. It runs once per key; httpidem replays its
// answer, errors included (4xx), to every retry.
func (s *service) debit(w http.ResponseWriter, r *http.Request) {
	var req debitRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "invalid body", err.Error())
		return
	}
	if req.Account == "" || req.Amount <= 0 {
		problem(w, http.StatusBadRequest, "invalid debit", "account must be set and amount positive (in cents)")
		return
	}
	// The attempt's key (scoped by the caller) is the bank's reference: a
	// second attempt after a failure finds the first one's debit, if any.
	a, _ := idem.AttemptFrom(r.Context())
	d, err := s.bank.Debit(a.Key, req.Account, req.Amount)
	switch {
	case errors.Is(err, errInsufficientFunds):
		problem(w, http.StatusPaymentRequired, "insufficient funds", err.Error())
		return
	case err != nil:
		problem(w, http.StatusBadGateway, "bank error", err.Error()) // 5xx: not stored, a retry runs again
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/debits/"+d.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(debitResponse{debit: d, Attempt: a.Number})
}

// account handles GET /accounts/{id}: the balance and the debits.
func (s *service) account(w http.ResponseWriter, r *http.Request) {
	balance, debits := s.bank.Account(r.PathValue("id"))
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
