package idempgx_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// DBTX and Queries are what sqlc generates for pgx/v5 (sql_package:
// "pgx/v5"): the queries run on a pool or, with WithTx, in a pgx.Tx.
type DBTX interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

type Queries struct{ db DBTX }

func NewQueries(db DBTX) *Queries { return &Queries{db: db} }

func (q *Queries) WithTx(tx pgx.Tx) *Queries { return &Queries{db: tx} }

const debitAccount = `-- name: DebitAccount :one
UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance`

func (q *Queries) DebitAccount(ctx context.Context, id string, amount int64) (int64, error) {
	var balance int64
	err := q.db.QueryRow(ctx, debitAccount, id, amount).Scan(&balance)
	return balance, err
}

// A debit recorded with its business change, through sqlc-style queries
// in the same pgx.Tx: the retry gets the recorded balance, and so does a
// call after Redis lost every record, while the account is debited once.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDSN) // postgres://…
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts VALUES ('alice', 100)`); err != nil {
		log.Fatal(err)
	}
	queries := NewQueries(pool)

	ledger := idempgx.New(pool)
	if err := ledger.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	client := idem.New(rdb, idem.WithLedger(ledger), idem.WithLogger(nil))
	defer client.Close()

	debit := func(ctx context.Context) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		balance, err := queries.WithTx(tx).DebitAccount(ctx, "alice", 30)
		if err != nil {
			return 0, err
		}
		return balance, idempgx.Commit(ctx, tx, balance)
	}
	pay := func() {
		balance, err := idem.Do(ctx, client, "payment-1", idem.Fingerprint("alice", 30), debit)
		fmt.Println(balance, err)
	}
	pay()
	pay()         // a retry: replayed from Redis
	mr.FlushAll() // Redis loses its records
	pay()         // fn runs, its commit meets the ledger's row: rolled back, the recorded balance returned

	var balance int64
	if err := pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 'alice'").Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// 70 <nil>
	// 70 <nil>
	// 70 <nil>
	// balance: 70
}
