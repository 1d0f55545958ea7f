package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// config is one run's workload and the behaviour of the simulated world.
type config struct {
	payments    int           // logical payments, each with its own key
	clients     int           // payments in flight at once
	loss        float64       // share of replies the network loses
	slow        float64       // share of debits that take slowDebit
	bankErr     float64       // share of debits the bank refuses, transiently
	lose        float64       // share of answered payments whose record Redis then loses
	seed        uint64        // seeds every payment's random stream
	balance     string        // how the load balancer picks: "random" or "alternate"
	timeout     time.Duration // how long the client waits for a reply
	fastDebit   time.Duration // a debit's usual duration, well under timeout
	slowDebit   time.Duration // a slow debit's, well over timeout: retries overlap it
	maxAttempts int           // attempts per payment before the client gives up
}

// defaultConfig returns the workload of a plain `go run ./debit` (from examples/).
func defaultConfig() config {
	return config{
		payments: 200,
		// Few clients and a timeout of 10ms leave room for the embedded
		// miniredis: it runs one Lua script at a time, at about 0.3ms each,
		// so idem.Do manages only about 1,000 calls a second on it, and
		// more clients would only queue for it and time out. The slow
		// debit is well past the timeout, so retries reliably overlap it.
		clients:     4,
		loss:        0.3,
		slow:        0.2,
		bankErr:     0.05,
		lose:        0.2,
		seed:        1,
		balance:     "random",
		timeout:     10 * time.Millisecond,
		fastDebit:   time.Millisecond,
		slowDebit:   25 * time.Millisecond,
		maxAttempts: 50,
	}
}

// validate reports every setting out of range, named by its flag.
func (c config) validate() error {
	share := func(name string, v float64) error {
		if v < 0 || v > 1 {
			return fmt.Errorf("-%s %v: must be between 0 and 1", name, v)
		}
		return nil
	}
	var errs []error
	if c.payments < 1 {
		errs = append(errs, fmt.Errorf("-payments %d: must be at least 1", c.payments))
	}
	if c.clients < 1 {
		errs = append(errs, fmt.Errorf("-clients %d: must be at least 1", c.clients))
	}
	if c.balance != "random" && c.balance != "alternate" {
		errs = append(errs, fmt.Errorf("-lb %q: must be random or alternate", c.balance))
	}
	errs = append(errs, share("loss", c.loss), share("slow", c.slow), share("bankerr", c.bankErr), share("lose", c.lose))
	return errors.Join(errs...)
}

// A fate is what the simulated world does to one attempt. Fates are drawn
// from the payment's own random stream, so a seed gives every attempt the
// same fate whatever order goroutines run in, and both strategies face the
// same fates.
type fate struct {
	instance int           // the instance the load balancer picks
	lost     bool          // the network loses the reply
	bankDown bool          // the bank refuses the debit
	debit    time.Duration // how long the debit takes
	lose     bool          // Redis loses the payment's record after the attempt
}

// fate draws the fate of attempt n (from 0) of payment i. It draws the same
// number of values whatever it decides, to keep later attempts' fates
// independent of the settings.
func (c config) fate(rng *mrand.Rand, i, n int) fate {
	f := fate{
		instance: rng.IntN(2),
		lost:     rng.Float64() < c.loss,
		bankDown: rng.Float64() < c.bankErr,
		debit:    c.fastDebit,
	}
	if rng.Float64() < c.slow {
		f.debit = c.slowDebit
	}
	f.lose = rng.Float64() < c.lose
	if c.balance == "alternate" {
		f.instance = (i + n) % 2
	}
	return f
}

// fateKey is the context key of an attempt's fate.
type fateKey struct{}

// withFate returns ctx carrying f. The simulation passes each attempt's fate
// in its request's context, so that the bank can act it out without the
// service code knowing.
func withFate(ctx context.Context, f fate) context.Context {
	return context.WithValue(ctx, fateKey{}, f)
}

// fateFrom returns the fate in ctx: an instant, successful debit if none.
func fateFrom(ctx context.Context) fate {
	f, _ := ctx.Value(fateKey{}).(fate)
	return f
}

// result counts what one strategy did to the bank and the client.
type result struct {
	debits      int   // debits the bank made, over all payments
	twice       int   // payments debited more than once
	notDebited  int   // payments never debited
	retries     int   // attempts beyond each payment's first
	unconfirmed int   // payments the client gave up on, with no receipt
	silentLoss  int   // payments confirmed to the client but never debited
	takeovers   int   // payments whose fn ran as attempt 2 or later (idem only)
	lost        int   // records Redis lost after an answered attempt
	fromLedger  int   // payments whose debit met the ledger's receipt and rolled back (idem only)
	unexpected  int   // errors other than the bank's simulated refusals
	firstErr    error // the first unexpected error, to show
}

// exactlyOnce reports whether every confirmed payment was debited exactly
// once and no payment was debited twice.
func (r result) exactlyOnce() bool { return r.twice == 0 && r.silentLoss == 0 }

// report holds one run of both strategies.
type report struct {
	cfg   config
	idem  result
	naive result
}

// compare runs the workload once with idem.Do and once with check-then-set,
// on the Redis at addr or, if addr is empty, on an embedded miniredis, and
// on the PostgreSQL at dsn or, if dsn is empty, on a SQLite file in a
// temporary directory. It deletes the keys and tables it created, and only
// those, before it returns.
func compare(ctx context.Context, cfg config, addr, dsn string) (rep report, err error) {
	if err := cfg.validate(); err != nil {
		return report{}, err
	}
	if addr == "" {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return report{}, fmt.Errorf("start miniredis: %w", err)
		}
		defer m.Close()
		addr = m.Addr()
	}
	// Two go-redis clients, as two processes behind the balancer would have.
	var rdbs [2]*redis.Client
	for i := range rdbs {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer func() { err = errors.Join(err, rdbs[i].Close()) }()
	}
	if err := rdbs[0].Ping(ctx).Err(); err != nil {
		return report{}, fmt.Errorf("redis at %s: %w", addr, err)
	}
	prefix, err := newPrefix()
	if err != nil {
		return report{}, err
	}
	defer func() { err = errors.Join(err, deleteKeys(ctx, rdbs[0], prefix)) }()
	b, err := openBank(ctx, dsn)
	if err != nil {
		return report{}, err
	}
	defer func() { err = errors.Join(err, b.Close()) }()

	rep.cfg = cfg
	if rep.idem, err = runIdem(ctx, cfg, rdbs, b, prefix+"idem"); err != nil {
		return rep, err
	}
	rep.naive, err = runNaive(ctx, cfg, rdbs, b, prefix+"naive:")
	return rep, err
}

// runIdem runs the workload on two instances paying through idem.Do with
// the bank's ledger, each with its own idem.Client.
func runIdem(ctx context.Context, cfg config, rdbs [2]*redis.Client, b *bank, prefix string) (res result, err error) {
	var takeovers, recorded keySet
	var services [2]service
	var clients [2]*idem.Client
	for i, rdb := range rdbs {
		c := idem.New(rdb, idem.WithPrefix(prefix), idem.WithRetention(retention), idem.WithLedger(b.ledger),
			idem.WithLogger(nil)) // the report is the output; miniredis cannot tell its eviction policy
		defer func() { err = errors.Join(err, c.Close()) }()
		clients[i] = c
		services[i] = &idemService{name: instanceName(i), idem: c, bank: b, takeovers: &takeovers, recorded: &recorded}
	}
	lose := func(ctx context.Context, id string) error { return clients[0].Forget(ctx, id) }
	res, err = simulate(ctx, cfg, services, b, "idem", lose)
	res.takeovers, res.fromLedger = takeovers.len(), recorded.len()
	return res, err
}

// runNaive runs the workload on two instances paying with check-then-set.
func runNaive(ctx context.Context, cfg config, rdbs [2]*redis.Client, b *bank, prefix string) (result, error) {
	var services [2]service
	for i, rdb := range rdbs {
		services[i] = &naiveService{name: instanceName(i), rdb: rdb, prefix: prefix, bank: b}
	}
	lose := func(ctx context.Context, id string) error { return rdbs[0].Del(ctx, prefix+id).Err() }
	return simulate(ctx, cfg, services, b, "naive", lose)
}

// instanceName names instance i for receipts: A or B.
func instanceName(i int) string { return string(rune('A' + i)) }

// sim is one strategy's run: the client side, and the service-side handlers
// it starts.
type sim struct {
	cfg      config
	services [2]service
	lose     func(ctx context.Context, id string) error // makes Redis lose payment id's record
	lost     atomic.Int64                               // records lost
	handlers sync.WaitGroup                             // service-side handlers, which outlive the client's wait

	mu         sync.Mutex
	unexpected int   // guarded by mu
	firstErr   error // guarded by mu
}

// simulate makes cfg.payments payments, cfg.clients at a time, and counts
// the debits of strategy once every handler has finished.
func simulate(ctx context.Context, cfg config, services [2]service, b *bank, strategy string, lose func(context.Context, string) error) (result, error) {
	s := &sim{cfg: cfg, services: services, lose: lose}
	attempts := make([]int, cfg.payments)
	confirmed := make([]bool, cfg.payments)
	next := make(chan int)
	var clients sync.WaitGroup
	for range cfg.clients {
		clients.Go(func() {
			for i := range next {
				attempts[i], confirmed[i] = s.pay(ctx, i)
			}
		})
	}
feed:
	for i := range cfg.payments {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	clients.Wait()
	// Count only when no debit is still running: those the client gave up
	// on are the duplicates.
	s.handlers.Wait()

	s.mu.Lock()
	res := result{unexpected: s.unexpected, firstErr: s.firstErr, lost: int(s.lost.Load())}
	s.mu.Unlock()
	for i := range cfg.payments {
		n, err := b.debitsOf(context.WithoutCancel(ctx), strategy, paymentOf(i).ID)
		if err != nil {
			return res, err
		}
		res.debits += n
		res.retries += attempts[i] - 1
		switch {
		case n > 1:
			res.twice++
		case n == 0:
			res.notDebited++
			if confirmed[i] {
				res.silentLoss++
			}
		}
		if !confirmed[i] {
			res.unconfirmed++
		}
	}
	return res, ctx.Err()
}

// accounts is how many accounts the payments of a run debit.
const accounts = 17

// accountOf returns the account of the i-th payment (and names the i-th
// account).
func accountOf(i int) string { return fmt.Sprintf("acct-%02d", i%accounts) }

// paymentOf returns the i-th payment of a run.
func paymentOf(i int) payment {
	return payment{
		ID:      fmt.Sprintf("pay-%04d", i),
		Account: accountOf(i),
		Amount:  Cents(int64(100 + i%50*25)),
	}
}

// pay is the client of payment i: it sends the payment until a reply
// arrives, waiting cfg.timeout for each. It returns how many attempts it
// made and whether it got a receipt.
func (s *sim) pay(ctx context.Context, i int) (attempts int, confirmed bool) {
	rng := mrand.New(mrand.NewPCG(s.cfg.seed, uint64(i)))
	p := paymentOf(i)
	for n := range s.cfg.maxAttempts {
		f := s.cfg.fate(rng, i, n)
		reply := make(chan error, 1) // buffered: a late reply must not block its handler
		s.handlers.Go(func() {
			// The handler's context is not the client's: a service does not
			// learn that its client timed out, and goes on debiting.
			_, err := s.services[f.instance].Pay(withFate(ctx, f), p)
			// A record lost under a waiting duplicate ends its wait with
			// ErrExpired: as the card network's refusal, an error the
			// client retries.
			if err != nil && !errors.Is(err, errBankDown) && !errors.Is(err, idem.ErrExpired) {
				s.noteUnexpected(err)
			}
			if err == nil && f.lose {
				// Redis loses the record (a restart without persistence, a
				// failover): a retry finds no trace of the payment there.
				if lerr := s.lose(ctx, p.ID); lerr != nil {
					s.noteUnexpected(lerr)
				} else {
					s.lost.Add(1)
				}
			}
			if !f.lost {
				reply <- err
			}
		})
		t := time.NewTimer(s.cfg.timeout)
		select {
		case err := <-reply:
			t.Stop()
			if err == nil {
				return n + 1, true
			}
			// An error reply: nothing to wait for, retry at once.
		case <-t.C:
			// No reply in time. Lost or only slow, the client cannot tell:
			// it retries.
		case <-ctx.Done():
			t.Stop()
			return n + 1, false
		}
	}
	return s.cfg.maxAttempts, false
}

// noteUnexpected counts an error that the simulation did not inject.
func (s *sim) noteUnexpected(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unexpected++
	if s.firstErr == nil {
		s.firstErr = err
	}
}

// newPrefix returns a key prefix unique to this run, so that a run on a real
// Redis touches no other data. It is hex, so it holds no SCAN glob
// characters and no hash-tag braces.
func newPrefix() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "debit-example-" + hex.EncodeToString(b[:]) + ":", nil
}

// deleteKeys deletes every key under prefix, and nothing else (no FLUSHDB:
// the Redis may hold someone's data). It runs detached from ctx so that an
// interrupted run still cleans up.
func deleteKeys(ctx context.Context, rdb *redis.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var keys []string
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan %s*: %w", prefix, err)
	}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 500)]
		keys = keys[len(batch):]
		if err := rdb.Del(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("delete %s*: %w", prefix, err)
		}
	}
	return nil
}
