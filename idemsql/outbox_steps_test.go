package idemsql_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// Each step of an operation publishes under ids of its own: the ids come
// from the call's key and the step's name, so the first event of two steps
// of one call differ, and both reach the outbox (its event ids are
// unique).
func TestPublishIDsInSteps(t *testing.T) {
	b := newBank(t, backendNamed("sqlite"))
	c := b.client(t)
	ctx := context.Background()
	publishIn := func(ctx context.Context, stream string) (string, error) {
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return "", err
		}
		defer tx.Rollback()
		id, err := idemsql.Publish(ctx, tx, stream, map[string]any{"n": 1})
		if err != nil {
			return "", err
		}
		return id, tx.Commit()
	}
	step := func(ctx context.Context, name string) (string, error) {
		return idem.Step(ctx, name, func(ctx context.Context) (string, error) { return publishIn(ctx, name) })
	}
	var ids []string
	fn := func(ctx context.Context) (int, error) {
		for _, name := range []string{"reserve", "notify"} {
			id, err := step(ctx, name)
			if err != nil {
				return 0, err
			}
			ids = append(ids, id)
		}
		return len(ids), nil
	}
	if _, err := idem.Do(ctx, c, "order-1", "", fn); err != nil {
		t.Fatalf("two steps that publish: %v", err)
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("the steps' event ids %v: want two distinct", ids)
	}
	var rows int
	if err := b.db.QueryRow("SELECT count(*) FROM " + b.ledger.Table() + "_outbox").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2 {
		t.Errorf("%d outbox rows, want 2", rows)
	}
	// An event of another key, outside any step: an id of its own.
	again, err := idem.Do(ctx, c, "order-2", "", func(ctx context.Context) (string, error) { return publishIn(ctx, "plain") })
	if err != nil || again == ids[0] || again == ids[1] {
		t.Fatalf("an event of another key outside steps: %q, %v; want an id of its own", again, err)
	}
}
