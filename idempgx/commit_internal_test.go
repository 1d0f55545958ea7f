package idempgx

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ledgertest/dbtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A row that PostgreSQL refuses every time (a key over what its B-tree
// indexes: random, incompressible bytes) is a permanent error, never one
// to retry; nothing commits, and the pool keeps its connection.
func TestCommitOversizeKeyIsPermanent(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.SharedPostgres(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l := New(pool)
	if err := l.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 3000) // over the Client's limit: only a direct Commit gets here
	_, _ = rand.Read(key)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, found, err := (&txn{l: l, tx: tx}).Commit(ctx, idem.Entry{Key: string(key), Attempt: 1, Value: []byte("v")})
	if found || err == nil || !idem.IsPermanent(err) {
		t.Fatalf("Commit of a 3000-byte key: found %v, %v; want a permanent error", found, err)
	}
	if pe := pgError(err); pe == nil || pe.Code[:2] != "54" {
		t.Fatalf("the error %v does not carry SQLSTATE 54xxx", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idem_ledger").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows, %v; want none", n, err)
	}
}
