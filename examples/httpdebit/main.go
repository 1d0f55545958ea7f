// Command httpdebit is a debit service behind the httpidem middleware: an
// HTTP API that debits accounts once per Idempotency-Key, however often a
// client retries.
//
//	POST /debits          {"account":"A","amount":100} (cents), with the
//	                      headers Idempotency-Key and Authorization: Bearer <name>
//	GET  /accounts/{id}   the balance and the debits of an account
//
// The first POST with a key debits the account and answers 201; a retry
// with the key gets the same answer again, marked Idempotent-Replayed:
// true, and debits nothing; the key reused for another debit gets 422. Keys
// are scoped by the caller (the bearer token's name), so one caller's key
// never replays another's debit. Every account opens with 1,000.00
// (100000 cents); a debit larger than the balance gets 402, which is
// replayed like a success.
//
// The accounts live in SQLite, and so does the ledger (idemsql): the
// handler commits its response (httpidem.Recorded) in the debit's
// transaction (idemsql.Commit). A retry after Redis lost the key's record
// (FLUSHALL, a restart without persistence, or this service restarted on
// its embedded miniredis with the same -db) runs the handler again, whose
// commit meets the ledger's row: the transaction rolls back, debit and
// all, and the retry gets the committed response, marked replayed.
//
// Usage (from the examples directory, a module of its own):
//
//	go run ./httpdebit [-addr localhost:8080] [-redis ADDR] [-db FILE] [-delay D]
//
// Without -redis it runs on an embedded miniredis. With one, it stores its
// records under the key prefix "httpdebit" for an hour. Without -db the
// database is a temporary file, removed when the service stops. -delay
// makes every debit take that long, to see duplicates wait for the first
// request. Stop it with Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// config is what the flags set.
type config struct {
	addr  string        // where to listen
	redis string        // Redis address; "" for an embedded miniredis
	db    string        // SQLite file; "" for a temporary one
	delay time.Duration // how long each debit takes
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "localhost:8080", "address to listen on")
	flag.StringVar(&cfg.redis, "redis", "", "address of a Redis server to use instead of an embedded miniredis")
	flag.StringVar(&cfg.db, "db", "", "SQLite file of the accounts and the ledger (default: a temporary file, removed at exit)")
	flag.DurationVar(&cfg.delay, "delay", 0, "how long each debit takes")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `httpdebit serves a debit API behind the httpidem middleware: POST /debits
debits an account once per Idempotency-Key and replays its answer to every
retry with the key (Idempotent-Replayed: true); GET /accounts/{id} shows an
account. Records live in an embedded miniredis unless -redis names a server;
the accounts and the ledger, in which each debit commits its response, live
in SQLite (-db), so a retry never debits twice, even after Redis lost data.

Usage: httpdebit [flags]
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "httpdebit: unexpected argument %q\n", flag.Arg(0))
		flag.Usage()
		os.Exit(2)
	}
	if cfg.delay < 0 {
		fmt.Fprintf(os.Stderr, "httpdebit: -delay %v: must not be negative\n", cfg.delay)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "httpdebit:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts the server down. It reports the
// address it listens on to stdout and to ready (when not nil), and the
// middleware's log lines to stderr.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer, ready func(addr string)) (err error) {
	redisAddr, where := cfg.redis, "Redis at "+cfg.redis
	if redisAddr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		defer mr.Close()
		redisAddr, where = mr.Addr(), "embedded miniredis"
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer func() { err = errors.Join(err, rdb.Close()) }()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	dbPath := cfg.db
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "httpdebit-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "bank.db")
	}
	bk, err := openBank(ctx, dbPath, cfg.delay)
	if err != nil {
		return fmt.Errorf("database %s: %w", dbPath, err)
	}
	defer func() { err = errors.Join(err, bk.db.Close()) }()
	opts := []idem.Option{idem.WithPrefix("httpdebit"), idem.WithRetention(time.Hour), idem.WithLedger(bk.ledger)}
	if cfg.redis != "" {
		// miniredis has no CONFIG GET, so the Client's warning about the
		// eviction policy would only be noise on the embedded one.
		opts = append(opts, idem.WithLogger(logger))
	}
	keys := idem.New(rdb, opts...)
	defer func() { err = errors.Join(err, keys.Close()) }()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	s := &service{bank: bk, logger: logger}
	srv := &http.Server{Handler: s.routes(keys), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "httpdebit: listening on http://%s (%s)\n", ln.Addr(), where)
	if ready != nil {
		ready(ln.Addr().String())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
