// ledgertest.go: what a driver gives the suite (Driver, Backend, Tx), and
// Exercise, which runs every scenario on it.

package ledgertest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Driver is a ledger driver under test.
type Driver struct {
	// Name names the driver in the subtests' names, such as "idempgx".
	Name string

	// Open returns a backend on a new, empty database (or schema, or
	// table) that the driver has migrated: no rows, in the ledger or in
	// the business table. What it opens is closed when tb ends. The suite
	// calls it once per scenario.
	Open func(tb testing.TB) Backend

	// Reopen, if set, opens in another process the database of a backend
	// that Open returned, from its DSN (see Reopener): the kill scenario
	// runs a child process on it. Without it, that scenario is skipped.
	Reopen func(tb testing.TB, dsn string) Backend
}

// Backend is one database as the suite drives it: the ledger under test,
// the user's transactions, and a business table of movements (one row per
// business change, such as a debit) that the suite counts.
type Backend interface {
	// Ledger returns the ledger under test, as WithLedger gets it.
	Ledger() idem.Ledger

	// Begin starts a transaction of the ledger's database, as a user's
	// fn does for its business change.
	Begin(ctx context.Context) (Tx, error)

	// Movements returns how many movements of account are committed.
	Movements(ctx context.Context, account string) (int, error)

	// Prune deletes the ledger's rows recorded before before, as the
	// driver's documented Prune does (idemsql.Ledger.Prune).
	Prune(ctx context.Context, before time.Time) (int64, error)
}

// OtherDatabase is implemented by a backend that can open a transaction of
// another database of the same system: the suite then checks that Commit
// refuses it and commits nothing. A backend without it skips that check.
type OtherDatabase interface {
	// BeginOther starts a transaction of another database than the
	// ledger's, with a movements table of its own; Movements of the
	// returned counter counts its rows.
	BeginOther(ctx context.Context) (Tx, func(ctx context.Context, account string) (int, error), error)
}

// Tx is one of the user's transactions, with the driver's commit helpers
// bound to it.
type Tx interface {
	// Move adds a movement of account in the transaction: the business
	// change whose outcome the ledger records.
	Move(ctx context.Context, account string) error

	// Commit is the driver's commit helper for v, such as
	// idemsql.Commit(ctx, tx, v): it records v as the outcome of the call
	// ctx belongs to and commits the transaction.
	Commit(ctx context.Context, v any) error

	// CommitError is the driver's CommitError helper, such as
	// idemsql.CommitError(ctx, tx, err).
	CommitError(ctx context.Context, err error) error

	// Rollback rolls the transaction back; an error for a transaction that
	// is already done is ignored by the suite.
	Rollback(ctx context.Context) error
}

// Exercise runs every scenario of the suite on d, each as a subtest of t
// on a backend of its own. The kill scenario runs this test binary again,
// on t's test alone, as a child process that Exercise recognizes by its
// environment: call Exercise from a test whose name the child can select,
// and nothing else in the child's way. The scenarios talk to a real redis-server that
// the suite starts on a free loopback port (skipped with a message where
// none is installed, unless IDEM_REQUIRE_REDIS=1).
func Exercise(t *testing.T, d Driver) {
	t.Helper()
	if d.Open == nil {
		t.Fatal("ledgertest: Driver.Open is nil")
	}
	if childMode(t, d) {
		return
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			s.run(t, newEnv(t, d))
		})
	}
	t.Run("KilledChild", func(t *testing.T) { killedChild(t, newEnv(t, d), d) })
}
