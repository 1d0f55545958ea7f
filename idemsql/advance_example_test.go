package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/idemsql"
	_ "modernc.org/sqlite"
)

// exampleDB opens a SQLite database in a new directory, with a migrated
// ledger; cleanup removes both.
func exampleDB() (*sql.DB, *idemsql.Ledger, func()) {
	dir, err := os.MkdirTemp("", "idemsql-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	ledger := idemsql.New(db, idemsql.SQLite)
	if err := ledger.Migrate(context.Background()); err != nil {
		log.Fatal(err)
	}
	return db, ledger, func() { db.Close(); os.RemoveAll(dir) }
}

// A consumer applies an order's events forward only: a late event, at or
// below the order's version, is refused and acknowledged.
func ExampleAdvance() {
	db, ledger, cleanup := exampleDB()
	defer cleanup()
	ctx := idemsql.NewContext(context.Background(), ledger) // inside idem.Do, fn's ctx will do

	apply := func(version int64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := idemsql.Advance(ctx, tx, "order-42", version); err != nil {
			return err
		}
		// ... the event's change, in tx ...
		return tx.Commit()
	}
	for _, v := range []int64{1, 3, 2, 3} {
		err := apply(v)
		fmt.Printf("version %d: stale %v\n", v, errors.Is(err, idemsql.ErrStale))
	}
	// Output:
	// version 1: stale false
	// version 3: stale false
	// version 2: stale true
	// version 3: stale true
}

// AdvanceInOrder holds back an event that comes before its predecessor:
// ErrGap is transient, so the consumer gets it again later.
func ExampleAdvanceInOrder() {
	db, ledger, cleanup := exampleDB()
	defer cleanup()
	ctx := idemsql.NewContext(context.Background(), ledger)

	apply := func(version int64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := idemsql.AdvanceInOrder(ctx, tx, "order-42", version); err != nil {
			return err
		}
		return tx.Commit()
	}
	for _, v := range []int64{2, 1, 2, 1} {
		err := apply(v)
		fmt.Printf("version %d: gap %v, stale %v\n", v, errors.Is(err, idemsql.ErrGap), errors.Is(err, idemsql.ErrStale))
	}
	// Output:
	// version 2: gap true, stale false
	// version 1: gap false, stale false
	// version 2: gap false, stale false
	// version 1: gap false, stale true
}

// NewContext lets Publish and Advance find the ledger's tables outside an
// idem call.
func ExampleNewContext() {
	db, ledger, cleanup := exampleDB()
	defer cleanup()
	ctx := idemsql.NewContext(context.Background(), ledger)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	fmt.Println(idemsql.Advance(ctx, tx, "order-7", 1))
	// Output: <nil>
}
