package main

import (
	"context"
	"errors"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// TestReusedKeyWithOtherAmountConflicts: the amount is a Money, whose
// state is unexported; the fingerprint still tells 10.00 from 20.00, so
// a key reused with another amount is refused, not answered with the
// first receipt.
func TestReusedKeyWithOtherAmountConflicts(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	b, err := openBank(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := idem.New(rdb, idem.WithLedger(b.ledger), idem.WithLogger(nil))
	defer c.Close()
	s := &idemService{name: "a", idem: c, bank: b, takeovers: &keySet{}, recorded: &keySet{}}

	first, err := s.Pay(ctx, payment{ID: "pay-1", Account: accountOf(0), Amount: Cents(1000)})
	if err != nil || first.Amount != Cents(1000) {
		t.Fatalf("first payment: got %+v, %v", first, err)
	}
	if _, err := s.Pay(ctx, payment{ID: "pay-1", Account: accountOf(0), Amount: Cents(2000)}); !errors.Is(err, idem.ErrConflict) {
		t.Fatalf("the key with another amount: got %v, want ErrConflict", err)
	}
	replay, err := s.Pay(ctx, payment{ID: "pay-1", Account: accountOf(0), Amount: Cents(1000)})
	if err != nil || replay != first {
		t.Fatalf("retry: got %+v, %v; want the first receipt %+v", replay, err, first)
	}
	if n, err := b.debitsOf(ctx, "idem", "pay-1"); n != 1 || err != nil {
		t.Fatalf("the bank debited pay-1 %d times, want once", n)
	}
}

func TestMoneyText(t *testing.T) {
	for _, c := range []struct {
		m    Money
		text string
	}{{Cents(0), "0.00"}, {Cents(5), "0.05"}, {Cents(-5), "-0.05"}, {Cents(123456), "1234.56"}, {Cents(-100), "-1.00"}} {
		b, _ := c.m.MarshalText()
		var back Money
		if string(b) != c.text || back.UnmarshalText(b) != nil || back != c.m {
			t.Errorf("%d cents: text %q, back %v; want %q", c.m.Cents(), b, back, c.text)
		}
	}
	for _, bad := range []string{"", "1.234", "x", "1.2x", "--1"} {
		var m Money
		if err := m.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q: parsed as %v, want an error", bad, m)
		}
	}
	var m Money
	if err := m.UnmarshalText([]byte("12.5")); err != nil || m != Cents(1250) {
		t.Errorf("12.5: got %v, %v; want 12.50", m, err)
	}
}
