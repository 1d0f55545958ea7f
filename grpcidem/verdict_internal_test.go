package grpcidem

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// answerError maps every verdict (idem.VerdictOf) to its answer: one row
// per verdict, and a verdict added to the root without a row fails here.
func TestAnswerErrorEveryVerdict(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	c := idem.New(rdb, idem.WithLogger(nil))
	t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
	s := &server{c: c, cfg: config{header: HeaderIdempotencyKey, retryAfter: time.Second, logger: slog.New(slog.DiscardHandler)}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	rows := []struct {
		verdict idem.Verdict
		err     error
		ctx     context.Context // nil: a live one
		code    codes.Code
		reason  string
	}{
		{idem.VerdictOutcome, idem.ErrStepAfterCommit, nil, codes.Internal, ReasonRecordUnusable},
		{idem.VerdictFailure, &idem.StoredError{Code: statusCodePrefix + "NotFound", Message: "no"}, nil, codes.NotFound, ""},
		{idem.VerdictFailure, &idem.StoredError{Code: codeNotStored, Message: "big"}, nil, codes.Internal, ReasonNotStored},
		{idem.VerdictConflict, idem.ErrConflict, nil, codes.FailedPrecondition, ReasonKeyReused},
		{idem.VerdictLateRetry, idem.ErrLateRetry, nil, codes.FailedPrecondition, ReasonLateRetry},
		{idem.VerdictTooLarge, idem.ErrTooLarge, nil, codes.Internal, ReasonNotStored},
		{idem.VerdictUndecodable, idem.ErrDecode, nil, codes.Internal, ReasonRecordUnusable},
		{idem.VerdictInProgress, idem.ErrInProgress, nil, codes.Unavailable, ReasonInProgress},
		{idem.VerdictParked, idem.ErrParked, nil, codes.FailedPrecondition, ReasonParked},
		{idem.VerdictUnknownOutcome, fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, idem.ErrParked), nil, codes.FailedPrecondition, ReasonOutcomeUnknown},
		{idem.VerdictNotRecorded, idem.ErrNotRecorded, nil, codes.Unavailable, ReasonUnavailable},
		{idem.VerdictInvalidKey, idem.ErrInvalidKey, nil, codes.InvalidArgument, ReasonKeyInvalid},
		{idem.VerdictUnusable, idem.ErrCorrupt, nil, codes.Internal, ReasonRecordUnusable},
		{idem.VerdictUnavailable, idem.ErrUnavailable, nil, codes.Unavailable, ReasonUnavailable},
		{idem.VerdictUnavailable, idem.ErrClosed, nil, codes.Unavailable, ReasonUnavailable},
		{idem.VerdictContext, context.Canceled, cancelled, codes.Canceled, ""},
		{idem.VerdictTransient, idem.ErrExpired, nil, codes.Unavailable, ReasonUnavailable},
	}
	seen := map[idem.Verdict]bool{}
	for _, row := range rows {
		if got := idem.VerdictOf(row.err); got != row.verdict {
			t.Fatalf("VerdictOf(%v) = %v; the table says %v", row.err, got, row.verdict)
		}
		seen[row.verdict] = true
		ctx := row.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		cl := &call{s: s, ctx: ctx, method: "/p.S/M", key: "0:k"}
		err := cl.answerError(row.err)
		if got := status.Code(err); got != row.code || Reason(err) != row.reason {
			t.Errorf("%v (%v): %v %q; want %v %q", row.verdict, row.err, got, Reason(err), row.code, row.reason)
		}
	}
	for v := idem.Verdict(0); !strings.HasPrefix(v.String(), "Verdict("); v++ {
		if !seen[v] {
			t.Errorf("verdict %v has no row", v)
		}
	}
}
