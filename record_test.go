package idem_test

// Tests of record.go: the claim script's replies, decoded.

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestClaimResult covers the scalar replies of lua/claim.lua (FuzzClaimReply
// covers the arrays, FuzzFinished the finished records).
func TestClaimResult(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	for _, tc := range []struct {
		v       any
		want    idem.ClaimReply
		corrupt bool
	}{
		{int64(1), idem.ClaimReply{Kind: 'c', N: 1, LeaseLeft: lease}, false},
		{int64(42), idem.ClaimReply{Kind: 'c', N: 42, LeaseLeft: lease}, false},
		{int64(0), idem.ClaimReply{Kind: 'x'}, false},
		{int64(-1), idem.ClaimReply{}, true},
		{nil, idem.ClaimReply{}, true},
		{"1d\x00\x001:ok", idem.ClaimReply{Kind: 'd', Payload: "ok"}, false},
		{[]any{"c", int64(3), int64(100)}, idem.ClaimReply{Kind: 'c', N: 3, LeaseLeft: 100 * time.Millisecond}, false},
		{[]any{"x"}, idem.ClaimReply{}, true},
		{1.5, idem.ClaimReply{}, true},
	} {
		got, err := idem.ClaimResult(tc.v, "fp", lease)
		switch {
		case tc.corrupt && !errors.Is(err, idem.ErrCorrupt):
			t.Errorf("claim reply %#v: got %+v, %v; want ErrCorrupt", tc.v, got, err)
		case !tc.corrupt && (err != nil || got != tc.want):
			t.Errorf("claim reply %#v: got %+v, %v; want %+v", tc.v, got, err, tc.want)
		}
	}
}
