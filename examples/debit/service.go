package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// retention is how long both strategies keep a payment's record: longer than
// any retry of a run, short enough that a run that dies before its cleanup
// leaves little behind in a real Redis.
const retention = 10 * time.Minute

// errBankDown is the transient refusal of the card network the service
// asks before it debits: nothing was debited, and the payment may be tried
// again.
var errBankDown = errors.New("card network: temporarily unavailable, nothing debited")

// A payment is one logical payment. The client sends it until it gets a
// receipt, always with the same ID: the ID is the idempotency key.
type payment struct {
	ID      string
	Account string
	Amount  Money
}

// A Receipt is what the service answers for a payment. idem.Do stores it
// encoded with msgpack, in Redis and in the ledger, and refuses result types
// it cannot give back exactly: so its fields are exported, and Amount,
// whose state is not, is stored through its MarshalText.
type Receipt struct {
	// Payment is the payment's ID.
	Payment string
	// Amount is the amount debited.
	Amount Money
	// Attempt is the idem attempt that debited (always 1 for
	// check-then-set, which has no attempt numbers).
	Attempt int64
	// Instance names the service instance that debited.
	Instance string
}

// A service is one instance of the payment service, as the load balancer
// sees it.
type service interface {
	// Pay debits the payment, or returns the receipt of an earlier debit.
	Pay(ctx context.Context, p payment) (Receipt, error)
}

// authorize stands for the work before the debit (asking the card network)
// and acts out the attempt's fate (see fateFrom): how long it takes, and
// whether the network refuses. It changes nothing.
func authorize(ctx context.Context) error {
	f := fateFrom(ctx)
	if f.bankDown {
		return errBankDown
	}
	t := time.NewTimer(f.debit)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// idemService pays through idem.Do with the ledger: the debit and the
// receipt commit in one transaction (bank.pay: idempgx.Commit or
// idemsql.Commit), so a payment is debited once whatever the retries, the
// instances, or Redis losing its records. fn has no reconcile code: the
// ledger is all it needs.
type idemService struct {
	name      string
	idem      *idem.Client
	bank      *bank
	takeovers *keySet // payments whose fn ran as attempt 2 or later
	recorded  *keySet // payments whose commit met the receipt of an earlier one
}

// Pay debits p at most once per key, and returns the receipt to retries.
// The fingerprint covers the account and the amount: a key reused for
// another payment gets idem.ErrConflict instead of the first receipt.
func (s *idemService) Pay(ctx context.Context, p payment) (Receipt, error) {
	return idem.Do(ctx, s.idem, p.ID, idem.Fingerprint(p.Account, p.Amount),
		func(ctx context.Context) (Receipt, error) {
			a, _ := idem.AttemptFrom(ctx)
			if a.Number > 1 {
				s.takeovers.add(a.Key) // counted for the report only
			}
			if err := authorize(ctx); err != nil {
				return Receipt{}, err
			}
			r := Receipt{Payment: a.Key, Amount: p.Amount, Attempt: a.Number, Instance: s.name}
			err := s.bank.pay(ctx, "idem", s.name, p, &r) // the debit and r commit together
			if errors.Is(err, idem.ErrRecorded) {
				s.recorded.add(a.Key) // counted for the report only
			}
			return r, err
		})
}

// naiveService pays with the classic check-then-set: GET the key, debit if
// it is absent, then SET the receipt. Nothing stops a second request for
// the same payment between the GET and the SET.
type naiveService struct {
	name   string
	rdb    redis.UniversalClient
	prefix string // of the receipt keys
	bank   *bank
}

// Pay returns the stored receipt for p, or debits and stores one.
func (s *naiveService) Pay(ctx context.Context, p payment) (Receipt, error) {
	key := s.prefix + p.ID
	b, err := s.rdb.Get(ctx, key).Bytes()
	switch {
	case err == nil:
		var r Receipt
		if err := json.Unmarshal(b, &r); err != nil {
			return Receipt{}, fmt.Errorf("decode receipt %s: %w", key, err)
		}
		return r, nil
	case !errors.Is(err, redis.Nil):
		return Receipt{}, err
	}
	// The race window: a retry that reaches any instance from here until the
	// SET below also finds no key, and debits again.
	if err := authorize(ctx); err != nil {
		return Receipt{}, err
	}
	if err := s.bank.pay(ctx, "naive", s.name, p, nil); err != nil {
		return Receipt{}, err
	}
	r := Receipt{Payment: p.ID, Amount: p.Amount, Attempt: 1, Instance: s.name}
	if b, err = json.Marshal(r); err != nil {
		return Receipt{}, err
	}
	return r, s.rdb.Set(ctx, key, b, retention).Err()
}

// keySet is a set of keys safe for concurrent use.
type keySet struct {
	mu   sync.Mutex
	keys map[string]struct{} // guarded by mu
}

// add puts key in the set.
func (s *keySet) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = make(map[string]struct{})
	}
	s.keys[key] = struct{}{}
}

// len returns the number of keys in the set.
func (s *keySet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}
