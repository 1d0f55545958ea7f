package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
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
	seed        uint64        // seeds every payment's random stream
	balance     string        // how the load balancer picks: "random" or "alternate"
	timeout     time.Duration // how long the client waits for a reply
	fastDebit   time.Duration // a debit's usual duration, well under timeout
	slowDebit   time.Duration // a slow debit's, well over timeout: retries overlap it
	maxAttempts int           // attempts per payment before the client gives up
}

// defaultConfig returns the workload of a plain `go run ./examples/debit`.
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
	errs = append(errs, share("loss", c.loss), share("slow", c.slow), share("bankerr", c.bankErr))
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

// compare runs the workload once with idem.Do and once with check-then-set, on
// the Redis at addr or, if addr is empty, on an embedded miniredis. It
// deletes the keys it created, and only those, before it returns.
func compare(ctx context.Context, cfg config, addr string) (rep report, err error) {
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

	rep.cfg = cfg
	if rep.idem, err = runIdem(ctx, cfg, rdbs, prefix+"idem"); err != nil {
		return rep, err
	}
	rep.naive, err = runNaive(ctx, cfg, rdbs, prefix+"naive:")
	return rep, err
}

// runIdem runs the workload on two instances paying through idem.Do, each
// with its own idem.Client.
func runIdem(ctx context.Context, cfg config, rdbs [2]*redis.Client, prefix string) (res result, err error) {
	b := newBank()
	var takeovers keySet
	var services [2]service
	for i, rdb := range rdbs {
		c := idem.New(rdb, idem.WithPrefix(prefix), idem.WithRetention(retention),
			idem.WithLogger(nil)) // the report is the output; miniredis cannot tell its eviction policy
		defer func() { err = errors.Join(err, c.Close()) }()
		services[i] = &idemService{name: instanceName(i), idem: c, bank: b, takeovers: &takeovers}
	}
	res, err = simulate(ctx, cfg, services, b)
	res.takeovers = takeovers.len()
	return res, err
}

// runNaive runs the workload on two instances paying with check-then-set.
func runNaive(ctx context.Context, cfg config, rdbs [2]*redis.Client, prefix string) (result, error) {
	b := newBank()
	var services [2]service
	for i, rdb := range rdbs {
		services[i] = &naiveService{name: instanceName(i), rdb: rdb, prefix: prefix, bank: b}
	}
	return simulate(ctx, cfg, services, b)
}

// instanceName names instance i for receipts: A or B.
func instanceName(i int) string { return string(rune('A' + i)) }

// sim is one strategy's run: the client side, and the service-side handlers
// it starts.
type sim struct {
	cfg      config
	services [2]service
	handlers sync.WaitGroup // service-side handlers, which outlive the client's wait

	mu         sync.Mutex
	unexpected int   // guarded by mu
	firstErr   error // guarded by mu
}

// simulate makes cfg.payments payments, cfg.clients at a time, and counts
// what the bank recorded once every handler has finished.
func simulate(ctx context.Context, cfg config, services [2]service, b *bank) (result, error) {
	s := &sim{cfg: cfg, services: services}
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
	res := result{unexpected: s.unexpected, firstErr: s.firstErr}
	s.mu.Unlock()
	for i := range cfg.payments {
		n := b.debits(paymentOf(i).ID)
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

// paymentOf returns the i-th payment of a run.
func paymentOf(i int) payment {
	return payment{
		ID:      fmt.Sprintf("pay-%04d", i),
		Account: fmt.Sprintf("acct-%02d", i%17),
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
			if err != nil && !errors.Is(err, errBankDown) {
				s.noteUnexpected(err)
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
