package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/examples/internal/demoredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
)

// config is one run's workload.
type config struct {
	events    int           // distinct events the producer sends
	dup       float64       // share of events the producer sends twice
	consumers int           // consumer processes at once
	kills     int           // consumer processes killed, per handler
	lease     time.Duration // idem's lease (WithLease)
	work      time.Duration // how long applying an event takes, besides SQLite
	seed      uint64        // seeds the events, the duplicates and the kills
	timeout   time.Duration // how long each handler's run may take
}

// defaultConfig returns the workload of a plain `go run ./events` (in examples/).
func defaultConfig() config {
	return config{events: 300, dup: 0.1, consumers: 3, kills: 6, lease: time.Second, work: 2 * time.Millisecond, seed: 1, timeout: 2 * time.Minute}
}

// validate reports the first setting out of range, named by its flag.
func (c config) validate() error {
	switch {
	case c.events < 1:
		return fmt.Errorf("-events %d: must be at least 1", c.events)
	case c.dup < 0 || c.dup > 1:
		return fmt.Errorf("-dup %v: must be between 0 and 1", c.dup)
	case c.consumers < 1:
		return fmt.Errorf("-consumers %d: must be at least 1", c.consumers)
	case c.kills < 0:
		return fmt.Errorf("-kills %d: must not be negative", c.kills)
	case c.lease < 10*time.Millisecond:
		return fmt.Errorf("-lease %v: must be at least 10ms", c.lease)
	case c.work < 0:
		return fmt.Errorf("-work %v: must not be negative", c.work)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: must be positive", c.timeout)
	}
	return nil
}

// workload returns the stream entries the producer sends: every event once,
// in order, and some again a little later, as a producer that lost the
// reply to an XADD and sent it again would.
func (c config) workload() []event {
	rng := mrand.New(mrand.NewPCG(c.seed, 1))
	var entries []event
	var again []int // positions at which to send an event again
	for i := range c.events {
		ev := event{ID: fmt.Sprintf("ev-%d", i), Account: fmt.Sprintf("acct-%d", rng.IntN(5)), Amount: 1 + rng.Int64N(100)}
		entries = append(entries, ev)
		if rng.Float64() < c.dup {
			again = append(again, len(entries)-1)
		}
	}
	for _, i := range again {
		at := min(len(entries), i+1+rng.IntN(20))
		entries = append(entries[:at], append([]event{entries[i]}, entries[at:]...)...)
	}
	return entries
}

// result is what one handler's run did, read from its database.
type result struct {
	applications int   // credits rows
	twice        int   // events with more than one
	never        int   // events with none
	badBalances  int   // accounts whose balance is not the sum of their events
	kills        int   // consumer processes killed
	found        int64 // takeovers that found an event applied, in the ledger
	deadLetters  int64 // entries in the dead-letter stream
	pending      int64 // entries left unacknowledged
}

func (r result) exactlyOnce() bool {
	return r.twice == 0 && r.never == 0 && r.badBalances == 0 && r.deadLetters == 0 && r.pending == 0
}

// report is a run of both handlers on one workload.
type report struct {
	cfg           config
	entries, dups int
	idem, plain   result
}

// run runs the workload with each handler, on the Redis at addr ("" for an
// embedded miniredis), killing consumer processes as it goes.
func run(ctx context.Context, cfg config, addr string) (report, error) {
	if err := cfg.validate(); err != nil {
		return report{}, err
	}
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return report{}, err
		}
		defer mr.Close()
		defer demoredis.FollowWallClock(mr)()
		addr = mr.Addr()
	}
	dir, err := os.MkdirTemp("", "idem-events-")
	if err != nil {
		return report{}, err
	}
	defer os.RemoveAll(dir)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	prefix := demoredis.RunPrefix("events")
	defer demoredis.Cleanup(rdb, prefix)

	entries := cfg.workload()
	rep := report{cfg: cfg, entries: len(entries), dups: len(entries) - cfg.events}
	for _, mode := range []string{"idem", "plain"} {
		r := &rep.idem
		if mode == "plain" {
			r = &rep.plain
		}
		h := handlerRun{cfg: cfg, rdb: rdb, rng: mrand.New(mrand.NewPCG(cfg.seed, 2)),
			child: child{Mode: mode, Redis: addr, DB: filepath.Join(dir, mode+".db"), Stream: prefix + mode,
				Prefix: prefix + "records", Lease: cfg.lease, Work: cfg.work}}
		if *r, err = h.run(ctx, entries); err != nil {
			return rep, fmt.Errorf("%s handler: %w", mode, err)
		}
	}
	return rep, nil
}

// handlerRun is the run of one handler: its consumer processes and what
// they wrote.
type handlerRun struct {
	cfg   config
	rdb   *redis.Client
	rng   *mrand.Rand
	child child // the settings of its consumers but their names
}

func (h handlerRun) run(ctx context.Context, entries []event) (result, error) {
	all := entries
	ctx, cancel := context.WithTimeout(ctx, h.cfg.timeout)
	defer cancel()
	db, err := openDB(h.child.DB)
	if err != nil {
		return result{}, err
	}
	defer db.Close()
	if err := migrate(ctx, db, h.child.Mode); err != nil {
		return result{}, err
	}
	// The entries go out in a chunk before each kill, and a last one
	// after, so that the consumers have work when each kill comes.
	var last string
	produce := func(chunk []event) error {
		pipe := h.rdb.Pipeline()
		for _, ev := range chunk {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: h.child.Stream, Values: ev.values()})
		}
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		last = cmds[len(cmds)-1].(*redis.StringCmd).Val()
		return nil
	}
	chunks := h.cfg.kills + 1
	size := (len(entries) + chunks - 1) / chunks

	reports := make(chan *proc, 1024)
	procs := make(map[string]*proc, h.cfg.consumers)
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i := range h.cfg.consumers {
		name := fmt.Sprintf("consumer-%d", i)
		if procs[name], err = h.start(name, reports); err != nil {
			return result{}, err
		}
	}
	var res result
	for len(entries) > 0 {
		chunk := entries[:min(size, len(entries))]
		entries = entries[len(chunk):]
		if err := produce(chunk); err != nil {
			return res, err
		}
		if len(entries) == 0 {
			break
		}
		// Kill the consumer that committed the n-th next event, right
		// after its commit: the event is not recorded in Redis yet, nor
		// acknowledged, and its other workers are anywhere.
		p := await(ctx, reports, 1+h.rng.IntN(len(chunk)/2+1))
		if p == nil {
			continue // nothing left to do now
		}
		p.kill()
		res.kills++
		res.found += p.found.Load()
		if procs[p.name], err = h.start(p.name, reports); err != nil {
			return res, err
		}
	}
	if err := h.drained(ctx, last); err != nil {
		return res, err
	}
	for name, p := range procs {
		p.stop()
		res.found += p.found.Load()
		delete(procs, name)
	}
	return h.count(ctx, db, all, res)
}

// start starts a consumer process named name, which sends itself to
// reports for each event it commits.
func (h handlerRun) start(name string, reports chan<- *proc) (*proc, error) {
	c := h.child
	c.Consumer = name
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), c.env())
	cmd.Stderr = os.Stderr
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start consumer %s: %w", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "found" {
				p.found.Add(1)
				continue
			}
			select {
			case reports <- p:
			default: // nobody waits for a kill now
			}
		}
	}()
	return p, nil
}

// drained waits until the group has delivered every entry up to last and
// none is pending.
func (h handlerRun) drained(ctx context.Context, last string) error {
	for {
		groups, err := h.rdb.XInfoGroups(ctx, h.child.Stream).Result()
		if err == nil && len(groups) == 1 && groups[0].LastDeliveredID == last && groups[0].Pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("entries not all acknowledged within -timeout %v (%+v, %v)", h.cfg.timeout, groups, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// count reads what the consumers did from the database and from Redis.
func (h handlerRun) count(ctx context.Context, db *sql.DB, entries []event, res result) (result, error) {
	applied := map[string]int{}
	rows, err := db.QueryContext(ctx, `SELECT event, COUNT(*) FROM credits GROUP BY event`)
	if err != nil {
		return res, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return res, err
		}
		applied[id] = n
		res.applications += n
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return res, err
	}
	want := map[string]int64{}
	seen := map[string]bool{}
	for _, ev := range entries {
		if !seen[ev.ID] {
			seen[ev.ID] = true
			want[ev.Account] += ev.Amount
			switch n := applied[ev.ID]; {
			case n == 0:
				res.never++
			case n > 1:
				res.twice++
			}
		}
	}
	for account, sum := range want {
		var balance int64
		if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, account).Scan(&balance); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return res, err
		}
		if balance != sum {
			res.badBalances++
		}
	}
	if res.deadLetters, err = h.rdb.XLen(ctx, h.child.Stream+":dead").Result(); err != nil {
		return res, err
	}
	p, err := h.rdb.XPending(ctx, h.child.Stream, group).Result()
	if err != nil {
		return res, err
	}
	res.pending = p.Count
	return res, nil
}

// migrate creates the business tables, and for idem the ledger's.
func migrate(ctx context.Context, db *sql.DB, mode string) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS credits (event TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if mode == "idem" {
		return idemsql.New(db, idemsql.SQLite).Migrate(ctx)
	}
	return nil
}

// proc is a running consumer process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // closed to stop it
	found  atomic.Int64   // takeovers that found the outcome in the ledger
	done   chan struct{}  // its stdout closed
	killed bool           // set by kill, read by await, in the demo's goroutine
}

// await returns the consumer that reports the n-th event committed from
// now, among those alive; nil when none comes within 30 seconds (nothing
// left to do) or ctx ends.
func await(ctx context.Context, reports <-chan *proc, n int) *proc {
drain: // reports from before now
	for {
		select {
		case <-reports:
		default:
			break drain
		}
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case p := <-reports:
			if p.killed {
				continue
			}
			if n--; n == 0 {
				return p
			}
		case <-timeout:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// kill kills p with SIGKILL (TerminateProcess on Windows) and waits for it.
func (p *proc) kill() {
	p.killed = true
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
}

// stop closes p's stdin, which ends it, and waits for it; one that does
// not end within ten seconds is killed.
func (p *proc) stop() {
	_ = p.stdin.Close()
	t := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
	defer t.Stop()
	<-p.done
	_ = p.cmd.Wait()
}
