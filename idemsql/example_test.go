package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

// A debit recorded with its business change: the retry gets the recorded
// balance, and so does a call after Redis lost every record, while the
// account is debited once.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemsql-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bank.db")+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
		INSERT INTO accounts VALUES ('alice', 100)`); err != nil {
		log.Fatal(err)
	}

	ledger := idemsql.New(db, idemsql.SQLite)
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
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		var balance int64
		err = tx.QueryRowContext(ctx, "UPDATE accounts SET balance = balance - 30 WHERE id = 'alice' RETURNING balance").Scan(&balance)
		if err != nil {
			return 0, err
		}
		return balance, idemsql.Commit(ctx, tx, balance)
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
	if err := db.QueryRow("SELECT balance FROM accounts WHERE id = 'alice'").Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// 70 <nil>
	// 70 <nil>
	// 70 <nil>
	// balance: 70
}
