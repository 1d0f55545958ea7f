package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// config is one run's workload.
type config struct {
	events    int           // distinct events the producer sends
	dup       float64       // share of events the producer sends twice
	crash     float64       // share of events whose first handling kills its consumer
	consumers int           // consumers running at once
	batch     int           // entries a consumer reads at once
	lease     time.Duration // idem's lease (WithLease)
	minIdle   time.Duration // XAUTOCLAIM's min-idle-time
	seed      uint64        // seeds the choice of duplicates, crashes and events
	timeout   time.Duration // how long a run may take to have every entry acknowledged
}

// defaultConfig returns the workload of a plain `go run ./examples/events`.
func defaultConfig() config {
	return config{
		events:    200,
		dup:       0.1,
		crash:     0.05,
		consumers: 3,
		batch:     10,
		lease:     time.Second,
		minIdle:   time.Second,
		seed:      1,
		timeout:   2 * time.Minute,
	}
}

// validate reports the first setting out of range, named by its flag.
func (c config) validate() error {
	switch {
	case c.events < 1:
		return fmt.Errorf("-events %d: must be at least 1", c.events)
	case c.dup < 0 || c.dup > 1:
		return fmt.Errorf("-dup %v: must be between 0 and 1", c.dup)
	case c.crash < 0 || c.crash > 1:
		return fmt.Errorf("-crash %v: must be between 0 and 1", c.crash)
	case c.consumers < 1:
		return fmt.Errorf("-consumers %d: must be at least 1", c.consumers)
	case c.batch < 1:
		return fmt.Errorf("-batch %d: must be at least 1", c.batch)
	case c.lease < 10*time.Millisecond:
		return fmt.Errorf("-lease %v: must be at least 10ms", c.lease)
	case c.minIdle < time.Millisecond:
		return fmt.Errorf("-min-idle %v: must be at least 1ms", c.minIdle)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: must be positive", c.timeout)
	}
	return nil
}

// workload returns the stream entries the producer sends, in order, and the
// events whose first handling kills its consumer. A duplicate follows its
// event within a few entries, as a producer's retried XADD would.
func (c config) workload() (entries []event, crash map[string]bool) {
	rng := mrand.New(mrand.NewPCG(c.seed, 0))
	type entry struct {
		at float64
		ev event
	}
	var es []entry
	crash = make(map[string]bool)
	for i := range c.events {
		ev := event{
			ID:      fmt.Sprintf("evt-%04d", i+1),
			Account: fmt.Sprintf("acct-%d", rng.IntN(5)+1),
			Amount:  int64(rng.IntN(100) + 1),
		}
		es = append(es, entry{float64(i), ev})
		if rng.Float64() < c.dup {
			es = append(es, entry{float64(i) + 0.5 + 5*rng.Float64(), ev})
		}
		if rng.Float64() < c.crash {
			crash[ev.ID] = true
		}
	}
	slices.SortStableFunc(es, func(a, b entry) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	for _, e := range es {
		entries = append(entries, e.ev)
	}
	return entries, crash
}

// report holds one run of both handlers.
type report struct {
	cfg   config
	idem  result
	plain result
}

// result is what one handler's run left in the ledger, and what its
// consumers did.
type result struct {
	entries      int // stream entries the producer sent
	events       int // distinct events among them
	applications int // applications the ledger counted, all events together
	twice        int // events applied twice or more
	never        int // events never applied
	badBalances  int // accounts whose balance is not the sum of their events
	deaths       int // consumers killed mid-handler
	reclaimed    int // entries taken over from another consumer
	reconciled   int // attempts that found their event already applied
	rejected     int // entries acknowledged without being applied
}

// exactlyOnce reports whether every event was applied exactly once.
func (r result) exactlyOnce() bool {
	return r.twice == 0 && r.never == 0 && r.badBalances == 0 && r.applications == r.events
}

// compare runs the workload once with idem.Do and once with the plain
// handler, on the Redis at addr or, if addr is empty, on an embedded
// miniredis. It deletes the keys it created, and only those, before it
// returns.
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
		defer followWallClock(m)()
		addr = m.Addr()
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { err = errors.Join(err, admin.Close()) }()
	if err := admin.Ping(ctx).Err(); err != nil {
		return report{}, fmt.Errorf("redis at %s: %w", addr, err)
	}
	prefix, err := newPrefix()
	if err != nil {
		return report{}, err
	}
	defer func() { err = errors.Join(err, deleteKeys(ctx, admin, prefix)) }()

	entries, crash := cfg.workload()
	rep.cfg = cfg
	r := run{cfg: cfg, addr: addr, admin: admin, entries: entries, crash: crash}
	if rep.idem, err = r.do(ctx, prefix+"idem:", true); err != nil {
		return rep, err
	}
	rep.plain, err = r.do(ctx, prefix+"plain:", false)
	return rep, err
}

// followWallClock makes m's keys expire as a real Redis's would: miniredis
// counts TTLs down only when told to (FastForward), and without that a dead
// consumer's lease would never end. It returns the function that stops it.
func followWallClock(m *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// run is one workload, to run with either handler.
type run struct {
	cfg     config
	addr    string
	admin   *redis.Client // the producer's connection, also used to watch the group and read the ledger
	entries []event
	crash   map[string]bool
}

// do sends the entries to a new stream under prefix, runs the consumers
// until every entry is acknowledged, and reads the ledger.
func (r run) do(ctx context.Context, prefix string, useIdem bool) (result, error) {
	s := stream{
		key:     prefix + "stream",
		group:   "appliers",
		batch:   int64(r.cfg.batch),
		block:   100 * time.Millisecond,
		minIdle: r.cfg.minIdle,
	}
	last, err := produce(ctx, r.admin, s, r.entries)
	if err != nil {
		return result{}, err
	}

	var st stats
	var deaths atomic.Int64
	var died sync.Map // events whose first handling killed its consumer
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, r.cfg.consumers)
	for i := range r.cfg.consumers {
		wg.Go(func() {
			// Consumer i, restarted under a new name each time it dies,
			// as an orchestrator restarts a crashed process.
			for gen := 1; runCtx.Err() == nil; gen++ {
				c := member{
					addr:   r.addr,
					name:   fmt.Sprintf("consumer-%d.%d", i+1, gen),
					prefix: prefix,
					s:      s,
					stats:  &st,
					lease:  r.cfg.lease,
					idem:   useIdem,
					dies: func(ev event) bool {
						if !r.crash[ev.ID] {
							return false
						}
						_, again := died.LoadOrStore(ev.ID, true)
						return !again
					},
				}
				dead, err := c.run(runCtx)
				if err != nil {
					errs[i] = err
					stop()
					return
				}
				if !dead {
					return
				}
				deaths.Add(1)
			}
		})
	}
	err = waitAcked(runCtx, r.admin, s, last, r.cfg.timeout)
	if errors.Is(err, context.Canceled) && ctx.Err() == nil {
		err = nil // a consumer failed and stopped the run: its error says why
	}
	stop()
	wg.Wait()
	if err = errors.Join(append(errs, err)...); err != nil {
		return result{}, err
	}

	res, err := tally(ctx, newLedger(r.admin, prefix), r.entries)
	res.deaths = int(deaths.Load())
	res.reclaimed = int(st.reclaimed.Load())
	res.reconciled = int(st.reconciled.Load())
	res.rejected = int(st.rejected.Load())
	return res, err
}

// member is one consumer of a run, with the connections of a process of
// its own.
type member struct {
	addr   string
	name   string
	prefix string
	s      stream
	stats  *stats
	lease  time.Duration
	idem   bool             // apply through idem.Do, or with the plain handler
	dies   func(event) bool // reports whether the consumer dies right after applying the event
}

// run runs the consumer until ctx ends or it dies, and reports whether it
// died.
func (m member) run(ctx context.Context) (dead bool, err error) {
	rdb := redis.NewClient(&redis.Options{Addr: m.addr})
	defer rdb.Close() // its error: closed already when the consumer died
	ctx, kill := context.WithCancel(ctx)
	defer kill()
	c := &consumer{name: m.name, rdb: rdb, ledger: newLedger(rdb, m.prefix), s: m.s, stats: m.stats}
	if m.idem {
		c.keys = idem.New(rdb, idem.WithPrefix(m.prefix+"records"), idem.WithLease(m.lease))
		defer func() { err = errors.Join(err, c.keys.Close()) }()
	}
	c.hook = func(_ context.Context, ev event, after bool) error {
		if !after || !m.dies(ev) {
			return nil
		}
		// Die as kill -9 would, between the side effect and everything
		// after it: no outcome recorded, no lease renewed, no
		// acknowledgement, and the entries read but not handled left
		// pending.
		dead = true
		kill()
		_ = rdb.Close()
		return errors.New("killed")
	}
	err = c.run(ctx)
	return dead, err
}

// produce creates the stream and its group and sends the entries, and
// returns the last entry's id.
func produce(ctx context.Context, rdb *redis.Client, s stream, entries []event) (string, error) {
	if err := rdb.XGroupCreateMkStream(ctx, s.key, s.group, "0").Err(); err != nil {
		return "", fmt.Errorf("create group %s: %w", s.group, err)
	}
	var last string
	for _, ev := range entries {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.key, Values: ev.values()}).Result()
		if err != nil {
			return "", fmt.Errorf("XADD %s: %w", ev.ID, err)
		}
		last = id
	}
	return last, nil
}

// waitAcked waits until the group has received every entry up to last and
// acknowledged them all, for at most timeout.
func waitAcked(ctx context.Context, rdb *redis.Client, s stream, last string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		groups, err := rdb.XInfoGroups(ctx, s.key).Result()
		if err != nil {
			return fmt.Errorf("XINFO GROUPS: %w", err)
		}
		var g redis.XInfoGroup
		for _, x := range groups {
			if x.Name == s.group {
				g = x
			}
		}
		if g.LastDeliveredID == last && g.Pending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every entry was acknowledged within %v: last delivered %s of %s, %d pending",
				timeout, g.LastDeliveredID, last, g.Pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tally compares the ledger with the events of entries.
func tally(ctx context.Context, l *ledger, entries []event) (result, error) {
	applied, err := l.applications(ctx)
	if err != nil {
		return result{}, err
	}
	balances, err := l.balances(ctx)
	if err != nil {
		return result{}, err
	}
	res := result{entries: len(entries)}
	seen := make(map[string]bool)
	want := make(map[string]int)
	for _, ev := range entries {
		if seen[ev.ID] {
			continue
		}
		seen[ev.ID] = true
		res.events++
		want[ev.Account] += int(ev.Amount)
		switch n := applied[ev.ID]; {
		case n == 0:
			res.never++
		case n > 1:
			res.twice++
		}
	}
	for _, n := range applied {
		res.applications += n
	}
	for acct := range balances {
		if _, ok := want[acct]; !ok {
			want[acct] = 0
		}
	}
	for acct, sum := range want {
		if balances[acct] != sum {
			res.badBalances++
		}
	}
	return res, nil
}

// newPrefix returns a key prefix unique to this run, so that a run on a real
// Redis touches no other data. It is hex, so it holds no SCAN glob
// characters and no hash-tag braces.
func newPrefix() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "events-example-" + hex.EncodeToString(b[:]) + ":", nil
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
