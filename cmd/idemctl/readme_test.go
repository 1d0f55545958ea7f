package main

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/readmetest"
	"github.com/idem-go/idem/internal/redistest"
)

// TestReadme runs every command of README.md against a redis-server that
// holds the records it shows, with the idemctl built from this tree first
// on PATH, and checks what each prints.
func TestReadme(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{AppendOnly: true})
	rdb := srv.Client(t)
	c := idem.New(rdb, idem.WithLogger(nil))
	defer c.Close()
	ctx := context.Background()
	for i := range 40 {
		if _, err := c.Do(ctx, "order-"+strconv.Itoa(i+1), "fp", func(context.Context) ([]byte, error) {
			return []byte(strings.Repeat("r", 100)), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// An owner that died holding attempt 3.
	rdb.Set(ctx, "idem:{order-stuck}", rec('p', "fingerprint-----", "owner-token-----", 3, strconv.Itoa(int(time.Hour.Milliseconds()))), time.Hour)
	// An HTTP request of principal alice.
	h := httpidem.New(c, httpidem.WithScope(func(*http.Request) (string, error) { return "alice", nil }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	req := httptest.NewRequest(http.MethodPost, "/debits", strings.NewReader(`{"amount":1}`))
	req.Header.Set(httpidem.HeaderIdempotencyKey, "k-1")
	h.ServeHTTP(httptest.NewRecorder(), req)

	// A debit that its ledger holds, whose record Redis lost.
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ledger := idemsql.New(db, idemsql.SQLite)
	if err := ledger.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	lc := idem.New(rdb, idem.WithLedger(ledger), idem.WithLogger(nil))
	defer lc.Close()
	if _, err := lc.Do(ctx, "debit-7", "fp", func(ctx context.Context) ([]byte, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		return []byte("receipt-7"), idemsql.Commit(ctx, tx, []byte("receipt-7"))
	}); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "idem:{debit-7}")

	// A payment whose charge no check could settle: parked.
	_, err = idem.Do(ctx, c, "payment-9", "", func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge",
			func(context.Context) (string, error) { return "", idem.Ambiguous(errors.New("timeout")) },
			func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil },
			idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
	})
	if !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("payment-9: %v, want parked", err)
	}

	// A service with the prefix jobs: a refund that failed transiently,
	// which its Recover loop takes over in an hour, and one that its one
	// recovery did not finish: parked.
	jobs := idem.New(rdb, idem.WithPrefix("jobs"), idem.WithRecoverAfter(time.Hour), idem.WithLogger(nil))
	defer jobs.Close()
	down := func(context.Context, int) (string, error) { return "", errors.New("provider down") }
	if _, err := idem.Register(jobs, "refund", down).Do(ctx, "refund-3", 5); err == nil {
		t.Fatal("refund-3: want the transient error")
	}
	quick := idem.New(rdb, idem.WithPrefix("jobs"), idem.WithRecoverAfter(10*time.Millisecond), idem.WithMaxRecoveries(1), idem.WithLogger(nil))
	defer quick.Close()
	if _, err := idem.Register(quick, "refund", down).Do(ctx, "refund-4", 7); err == nil {
		t.Fatal("refund-4: want the transient error")
	}
	rctx, stopRecover := context.WithTimeout(ctx, 30*time.Second)
	recovered := make(chan error, 1)
	go func() { recovered <- quick.Recover(rctx) }()
	for {
		st, err := quick.Status(ctx, "refund-4")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == idem.StateParked {
			break
		}
		if rctx.Err() != nil {
			t.Fatalf("refund-4 is %v after 30s, want parked", st.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopRecover()
	<-recovered

	bin := filepath.Dir(binary(t))
	readmetest.Run(t, "README.md", readmetest.Options{
		Dir:     dir,
		Env:     []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")},
		Replace: []string{"localhost:6379", srv.Addr()},
	})

	// What resolve told the service, the service does: the next call
	// resumes with the operator's value, without acting.
	v, err := idem.Do(ctx, c, "payment-9", "", func(ctx context.Context) (string, error) {
		return idem.StepChecked(ctx, "charge",
			func(context.Context) (string, error) { t.Error("act ran after resolve"); return "", nil },
			func(context.Context) (string, idem.Check, error) {
				t.Error("check ran after resolve")
				return "", idem.CheckUnknown, nil
			})
	})
	if err != nil || v != "ch_1234" {
		t.Fatalf("payment-9 after idemctl resolve: %q, %v; want ch_1234", v, err)
	}
	// What retry un-parked runs again.
	if st, err := jobs.Status(ctx, "refund-4"); err != nil || st.State != idem.StateReleased {
		t.Fatalf("refund-4 after idemctl retry: %v, %v; want released", st.State, err)
	}
}
