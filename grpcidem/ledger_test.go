package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// accounts is an idem.Ledger kept in memory, standing in for the service's
// database: an account's balance and the ledger's rows, which a
// transaction (accountsTx) changes together, or not at all.
type accounts struct {
	mu      sync.Mutex
	rows    map[string]idem.Entry
	balance int64
	debits  int // movements applied
}

func newAccounts() *accounts { return &accounts{rows: map[string]idem.Entry{}, balance: 1000} }

func (a *accounts) Lookup(ctx context.Context, key string) (idem.Entry, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.rows[key]
	return e, ok, nil
}

func (a *accounts) MaxKeyLen() int { return 0 }

// state returns the balance and the number of movements.
func (a *accounts) state() (int64, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.balance, a.debits
}

// accountsTx is one transaction of accounts: its debit is applied by its
// commit, with the ledger's row, only when the key has no row yet (the
// database's unique key); otherwise it rolls back and returns the row.
type accountsTx struct {
	a     *accounts
	debit int64
}

func (tx *accountsTx) Commit(ctx context.Context, e idem.Entry) (idem.Entry, bool, error) {
	a := tx.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.rows[e.Key]; ok {
		return old, true, nil
	}
	a.balance -= tx.debit
	a.debits++
	a.rows[e.Key] = e
	return idem.Entry{}, false, nil
}

func (tx *accountsTx) Rollback(context.Context) error { return nil }

// ledgerDebit is a Debit method on accounts: it debits the request's
// amount in a transaction, sets a header and a trailer naming its run, and
// commits its response (grpcidem.Recorded) in the transaction. before, when
// set, runs before the commit; commitErr gets the commit's error.
type ledgerDebit struct {
	a         *accounts
	runs      counter
	before    func(run int64)
	commitErr chan error
}

func (d *ledgerDebit) handler(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	n := d.runs.n.Add(1)
	run := strconv.FormatInt(n, 10)
	amount := int64(req.GetFields()["amount"].GetNumberValue())
	tx := &accountsTx{a: d.a, debit: amount}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-run", run)); err != nil {
		return nil, err
	}
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", run)); err != nil {
		return nil, err
	}
	resp := mustStruct(map[string]any{"receipt": n, "amount": amount})
	b, err := grpcidem.Recorded(ctx, resp)
	if err != nil {
		return nil, err
	}
	if d.before != nil {
		d.before(n)
	}
	err = idem.Commit(ctx, tx, b)
	if d.commitErr != nil {
		d.commitErr <- err
	}
	return resp, nil // on ErrRecorded, the interceptor answers with the recorded one
}

// sameAnswer fails the test unless got is want replayed: the response, the
// header (but for idempotent-replayed) and the trailer.
func sameAnswer(t *testing.T, what string, got, want answer) {
	t.Helper()
	if got.err != nil || !got.replayed() {
		t.Errorf("%s: %v, replayed %v; want a replay", what, got.err, got.replayed())
		return
	}
	if !proto.Equal(got.resp, want.resp) {
		t.Errorf("%s: %v; want the recorded %v", what, got.resp, want.resp)
	}
	for _, k := range []string{"x-run"} {
		if g, w := got.header.Get(k), want.header.Get(k); fmt.Sprint(g) != fmt.Sprint(w) || len(w) == 0 {
			t.Errorf("%s: header %s %q; want the recorded %q", what, k, g, w)
		}
	}
	if g, w := got.trailer.Get("x-trailer"), want.trailer.Get("x-trailer"); fmt.Sprint(g) != fmt.Sprint(w) || len(w) == 0 {
		t.Errorf("%s: trailer %q; want the recorded %q", what, g, w)
	}
}

// A method that commits its response through the ledger debits once: a
// retry after Redis lost everything (FLUSHALL) runs the handler, whose
// commit meets the ledger's row and rolls back, and gets the committed
// response; so do 20 concurrent duplicates on four servers, before and
// after another FLUSHALL.
func TestLedgerDebitExactlyOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := newAccounts()
		d := &ledgerDebit{a: a}
		var ccs []*grpc.ClientConn
		for range 4 {
			ic := grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLedger(a)))
			ccs = append(ccs, dial(t, serve(t, &bank{debit: d.handler}, ic)))
		}
		first := invoke(ccs[0], methodDebit, "debit-1", 100)
		if first.err != nil || first.replayed() || first.field("receipt") != 1 {
			t.Fatalf("first: %v, replayed %v, %v", first.err, first.replayed(), first.resp)
		}
		sameAnswer(t, "retry", invoke(ccs[1], methodDebit, "debit-1", 100), first)
		b.Client(t).FlushAll(context.Background())
		sameAnswer(t, "retry after FLUSHALL", invoke(ccs[2], methodDebit, "debit-1", 100), first)
		if runs := d.runs.runs(); runs != 2 {
			t.Errorf("handler ran %d times; want 2 (once more after FLUSHALL, rolled back)", runs)
		}
		for round := range 2 {
			b.Client(t).FlushAll(context.Background())
			answers := make([]answer, 20)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() { answers[i] = invoke(ccs[i%len(ccs)], methodDebit, "debit-1", 100) })
			}
			wg.Wait()
			for i, got := range answers {
				sameAnswer(t, fmt.Sprintf("round %d, duplicate %d", round, i), got, first)
			}
		}
		if bal, n := a.state(); bal != 900 || n != 1 {
			t.Fatalf("balance %d after %d movements; want 900 after 1", bal, n)
		}
	})
}

// 20 concurrent duplicates of a fresh key: one debit, one receipt.
func TestLedgerConcurrentDuplicates(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := newAccounts()
		d := &ledgerDebit{a: a}
		var ccs []*grpc.ClientConn
		for range 4 {
			ic := grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLedger(a)))
			ccs = append(ccs, dial(t, serve(t, &bank{debit: d.handler}, ic)))
		}
		answers := make([]answer, 20)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = invoke(ccs[i%len(ccs)], methodDebit, "debit-2", 7) })
		}
		wg.Wait()
		originals := 0
		for i, got := range answers {
			if got.err != nil || got.field("receipt") != 1 || got.field("amount") != 7 {
				t.Errorf("duplicate %d: %v %v", i, got.err, got.resp)
			}
			if !got.replayed() {
				originals++
			}
		}
		if originals != 1 {
			t.Errorf("%d answers not replayed; want 1", originals)
		}
		if bal, n := a.state(); bal != 993 || n != 1 || d.runs.runs() != 1 {
			t.Fatalf("balance %d after %d movements, %d runs; want 993, 1, 1", bal, n, d.runs.runs())
		}
	})
}

// Two live owners: A's record is lost while its handler runs (before its
// commit), B runs and commits; A's commit then meets B's row, and A's
// caller gets B's response and metadata as a replay, without A's own
// header and trailer. One debit.
func TestLedgerTwoLiveOwners(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := newAccounts()
		started, proceed := make(chan struct{}), make(chan struct{})
		d := &ledgerDebit{a: a, commitErr: make(chan error, 2), before: func(run int64) {
			if run == 1 {
				close(started)
				<-proceed
			}
		}}
		ccA := dial(t, serve(t, &bank{debit: d.handler}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLedger(a)))))
		ccB := dial(t, serve(t, &bank{debit: d.handler}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLedger(a)))))
		aDone := make(chan answer, 1)
		go func() { aDone <- invoke(ccA, methodDebit, "debit-3", 5) }()
		recv(t, started)
		b.Client(t).Del(context.Background(), "idem:{0:debit-3}") // A's record is lost
		fromB := invoke(ccB, methodDebit, "debit-3", 5)
		if fromB.err != nil || fromB.replayed() || fromB.field("receipt") != 2 {
			t.Fatalf("B: %v, replayed %v, %v", fromB.err, fromB.replayed(), fromB.resp)
		}
		if err := recv(t, d.commitErr); err != nil {
			t.Fatalf("B's commit: %v", err)
		}
		close(proceed)
		fromA := recv(t, aDone)
		sameAnswer(t, "A", fromA, fromB)
		if err := recv(t, d.commitErr); !errors.Is(err, idem.ErrRecorded) {
			t.Errorf("A's commit: %v; want ErrRecorded", err)
		}
		if bal, n := a.state(); bal != 995 || n != 1 {
			t.Fatalf("balance %d after %d movements; want 995 after 1", bal, n)
		}
	})
}

// Recorded returns the response and the metadata in the stored form: the
// bytes that the interceptor stores in Redis for them without a ledger.
func TestRecordedIsTheStoredForm(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var got []byte
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-h", "1"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "2"))
			resp := mustStruct(map[string]any{"ok": true})
			var err error
			got, err = grpcidem.Recorded(ctx, resp)
			return resp, err
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		if a := invoke(cc, methodDebit, "k", 1); a.err != nil {
			t.Fatal(a.err)
		}
		record, err := b.Client(t).Get(context.Background(), "idem:{0:k}").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 || !strings.HasSuffix(string(record), string(got)) {
			t.Fatalf("Recorded gave %q; the stored record is %q", got, record)
		}
		if !strings.Contains(string(got), "x-h") || !strings.Contains(string(got), "x-t") {
			t.Fatalf("Recorded gave %q; want the header and the trailer", got)
		}
	})
}

// Recorded says clearly when the context is no handler's behind the
// interceptor (outside a call, a call without a key), and refuses a
// response that is not a message.
func TestRecordedOutsideTheInterceptor(t *testing.T) {
	if _, err := grpcidem.Recorded(context.Background(), mustStruct(nil)); !errors.Is(err, grpcidem.ErrNoInterceptor) {
		t.Fatalf("outside a call: %v; want ErrNoInterceptor", err)
	}
	eachBackend(t, func(t *testing.T, b *backend) {
		errs := make(chan error, 1)
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			var resp any = mustStruct(nil)
			if req.GetFields()["amount"].GetNumberValue() == 2 {
				resp = "not a message"
			}
			_, err := grpcidem.Recorded(ctx, resp)
			errs <- err
			return mustStruct(nil), nil
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		invoke(cc, methodDebit, "", 1)
		if err := recv(t, errs); !errors.Is(err, grpcidem.ErrNoInterceptor) {
			t.Errorf("a call without a key: %v; want ErrNoInterceptor", err)
		}
		invoke(cc, methodDebit, "k", 1)
		if err := recv(t, errs); err != nil {
			t.Errorf("a call with a key: %v", err)
		}
		invoke(cc, methodDebit, "k2", 2)
		if err := recv(t, errs); err == nil || errors.Is(err, grpcidem.ErrNoInterceptor) {
			t.Errorf("a response that is not a message: %v; want an error", err)
		}
	})
}

// A handler that returns another response than it committed, or an error
// after its commit, gets what it committed, as every retry will.
func TestLedgerCommittedResponseStands(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		a := newAccounts()
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			committed := mustStruct(map[string]any{"committed": true})
			rb, err := grpcidem.Recorded(ctx, committed)
			if err != nil {
				return nil, err
			}
			if err := idem.Commit(ctx, &accountsTx{a: a}, rb); err != nil {
				return nil, err
			}
			if req.GetFields()["amount"].GetNumberValue() == 1 {
				return mustStruct(map[string]any{"committed": false}), nil
			}
			return nil, errors.New("after the commit")
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLedger(a)),
			grpcidem.WithLogger(nil))))
		for _, amount := range []float64{1, 2} {
			key := fmt.Sprint("k", amount)
			for i := range 2 {
				got := invoke(cc, methodDebit, key, amount)
				if got.err != nil || !got.resp.GetFields()["committed"].GetBoolValue() || got.replayed() != (i == 1) {
					t.Errorf("amount %v, call %d: %v %v replayed %v; want the committed response", amount, i, got.err, got.resp, got.replayed())
				}
			}
		}
	})
}
