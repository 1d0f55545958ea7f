package main

import (
	"fmt"
	"strconv"
	"strings"
)

// Money is an amount in hundredths of the currency unit, a fixed-point
// number as payment services hold money: never a float. Its state is
// unexported, so that every Money is built by its constructors; idem
// reaches it through MarshalText, both when it fingerprints a payment
// (idem.Fingerprint) and when it stores a receipt (idem.Do).
type Money struct {
	cents int64
}

// Cents returns the amount of n hundredths.
func Cents(n int64) Money { return Money{cents: n} }

// Cents returns m in hundredths.
func (m Money) Cents() int64 { return m.cents }

// String formats m with two decimals: "12.34", "-0.05".
func (m Money) String() string {
	sign, c := "", m.cents
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

// MarshalText returns m as String formats it.
func (m Money) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses an amount with at most two decimals, as
// MarshalText writes it.
func (m *Money) UnmarshalText(b []byte) error {
	s := string(b)
	units, frac, _ := strings.Cut(s, ".")
	neg := strings.HasPrefix(units, "-")
	u, err := strconv.ParseUint(strings.TrimPrefix(units, "-"), 10, 62)
	if err != nil || len(frac) > 2 || strings.TrimLeft(frac, "0123456789") != "" {
		return fmt.Errorf("debit: bad amount %q", s)
	}
	f, _ := strconv.Atoi((frac + "00")[:2])
	c := int64(u)*100 + int64(f)
	if neg {
		c = -c
	}
	m.cents = c
	return nil
}
