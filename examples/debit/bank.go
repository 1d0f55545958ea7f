package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // the "sqlite" driver, the default
)

// sqliteOptions make SQLite's writers wait for each other instead of
// failing with "database is locked" (see idemsql's package doc).
const sqliteOptions = "_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

// openingBalance is what every account holds when a run starts.
const openingBalance = 1_000_000_00

// A bank is the service's database: the accounts, a row for every debit
// made, and the ledger in which idem.Do's calls record their receipts.
// Both strategies of a run share it; its debits table tells their debits
// apart by a strategy column. Nothing keeps a payment from being debited
// twice but the strategy: the debits table has no unique key on purpose.
type bank struct {
	db       *sql.DB       // for the tables and the counts; on PostgreSQL, over pool
	pool     *pgxpool.Pool // on PostgreSQL: the payments' transactions, native pgx
	postgres bool
	// accounts, debits: the tables' names, unique to the run on a
	// PostgreSQL given with -postgres, so that the run touches no other data.
	accounts, debits string
	ledger           ledger
	cleanup          func() error // drops the run's tables, or removes its SQLite file
}

// ledger is what the bank needs of its ledger: idempgx's on PostgreSQL,
// idemsql's on SQLite.
type ledger interface {
	idem.Ledger
	Migrate(ctx context.Context) error
	Table() string
}

// openBank opens the bank: on the PostgreSQL at dsn, in tables under a
// prefix unique to the run, or, when dsn is empty, in a new SQLite file in
// a temporary directory. Close removes what openBank created.
func openBank(ctx context.Context, dsn string) (*bank, error) {
	b := &bank{}
	var err error
	if dsn == "" {
		dir, err := os.MkdirTemp("", "debit-example-")
		if err != nil {
			return nil, err
		}
		b.db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "bank.db")+"?"+sqliteOptions)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		// One connection: writers queue in the pool instead of in SQLite's
		// busy handler (see idemsql's package doc).
		b.db.SetMaxOpenConns(1)
		b.accounts, b.debits = "accounts", "debits"
		b.ledger = idemsql.New(b.db, idemsql.SQLite)
		b.cleanup = func() error { return os.RemoveAll(dir) }
	} else {
		b.postgres = true
		if b.pool, err = pgxpool.New(ctx, dsn); err != nil {
			return nil, err
		}
		b.db = stdlib.OpenDBFromPool(b.pool)
		var r [6]byte
		_, _ = rand.Read(r[:])
		prefix := "debit_example_" + hex.EncodeToString(r[:]) + "_"
		b.accounts, b.debits = prefix+"accounts", prefix+"debits"
		b.ledger = idempgx.New(b.pool, idempgx.WithTable(prefix+"ledger"))
		b.cleanup = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var errs []error
			for _, t := range []string{b.accounts, b.debits, b.ledger.Table(), b.ledger.Table() + "_meta"} {
				if _, err := b.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
	}
	if err := b.create(ctx); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return b, nil
}

// create makes the tables and opens the accounts.
func (b *bank) create(ctx context.Context) error {
	if err := b.db.PingContext(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if err := b.ledger.Migrate(ctx); err != nil {
		return err
	}
	for _, q := range []string{
		"CREATE TABLE " + b.accounts + " (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
		"CREATE TABLE " + b.debits + " (payment TEXT NOT NULL, strategy TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL, instance TEXT NOT NULL)",
	} {
		if _, err := b.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	for i := range accounts {
		if _, err := b.db.ExecContext(ctx, b.q("INSERT INTO "+b.accounts+" (id, balance) VALUES (?, ?)"), accountOf(i), openingBalance); err != nil {
			return err
		}
	}
	return nil
}

// Close removes what openBank created and closes the database.
func (b *bank) Close() error {
	err := errors.Join(b.cleanup(), b.db.Close())
	if b.pool != nil {
		b.pool.Close()
	}
	return err
}

// q turns the ? placeholders of query into PostgreSQL's $n when needed.
func (b *bank) q(query string) string {
	if !b.postgres {
		return query
	}
	var s strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			s.WriteString("$" + strconv.Itoa(n))
			continue
		}
		s.WriteRune(r)
	}
	return s.String()
}

// pay debits p in one transaction and ends it: with the ledger's commit
// of r (idempgx.Commit on PostgreSQL, idemsql.Commit on SQLite), or with a
// plain COMMIT when r is nil.
func (b *bank) pay(ctx context.Context, strategy, instance string, p payment, r *Receipt) error {
	if b.pool != nil {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		exec := func(q string, args ...any) (int64, error) {
			tag, err := tx.Exec(ctx, q, args...)
			return tag.RowsAffected(), err
		}
		if err := b.debit(exec, strategy, instance, p); err != nil {
			return err
		}
		if r == nil {
			return tx.Commit(ctx)
		}
		return idempgx.Commit(ctx, tx, *r)
	}
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	exec := func(q string, args ...any) (int64, error) {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	if err := b.debit(exec, strategy, instance, p); err != nil {
		return err
	}
	if r == nil {
		return tx.Commit()
	}
	return idemsql.Commit(ctx, tx, *r)
}

// debit takes p's amount from its account and records the debit, through
// exec, a statement of the payment's transaction.
func (b *bank) debit(exec func(q string, args ...any) (int64, error), strategy, instance string, p payment) error {
	n, err := exec(b.q("UPDATE "+b.accounts+" SET balance = balance - ? WHERE id = ?"), p.Amount.Cents(), p.Account)
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("debit %s: account %s: %d rows", p.ID, p.Account, n)
	}
	_, err = exec(b.q("INSERT INTO "+b.debits+" (payment, strategy, account, amount, instance) VALUES (?, ?, ?, ?, ?)"),
		p.ID, strategy, p.Account, p.Amount.Cents(), instance)
	return err
}

// debitsOf returns how many times strategy debited payment id.
func (b *bank) debitsOf(ctx context.Context, strategy, id string) (int, error) {
	var n int
	err := b.db.QueryRowContext(ctx, b.q("SELECT count(*) FROM "+b.debits+" WHERE strategy = ? AND payment = ?"), strategy, id).Scan(&n)
	return n, err
}
