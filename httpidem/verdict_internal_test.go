package httpidem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// answerError maps every verdict (idem.VerdictOf) to its answer: one row
// per verdict, and a verdict added to the root without a row fails here.
func TestAnswerErrorEveryVerdict(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	c := idem.New(rdb, idem.WithLogger(nil))
	t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
	m := New(c, WithLogger(nil))(http.NotFoundHandler()).(*middleware)
	rows := []struct {
		verdict    idem.Verdict
		err        error
		status     int
		typ        string
		retryAfter bool
	}{
		{idem.VerdictOutcome, idem.ErrStepAfterCommit, 500, ProblemServerError, false},
		{idem.VerdictFailure, idem.Permanent(errNotStored), 500, ProblemNotStored, false},
		{idem.VerdictConflict, idem.ErrConflict, 422, ProblemKeyReused, false},
		{idem.VerdictLateRetry, idem.ErrLateRetry, 410, ProblemLateRetry, false},
		{idem.VerdictTooLarge, idem.ErrTooLarge, 500, ProblemNotStored, false},
		{idem.VerdictUndecodable, idem.ErrDecode, 500, ProblemServerError, false},
		{idem.VerdictInProgress, idem.ErrInProgress, 409, ProblemInProgress, true},
		{idem.VerdictParked, idem.ErrParked, 409, ProblemParked, false},
		{idem.VerdictUnknownOutcome, fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, idem.ErrParked), 409, ProblemOutcomeUnknown, false},
		{idem.VerdictNotRecorded, idem.ErrNotRecorded, 503, ProblemUnavailable, true},
		{idem.VerdictInvalidKey, idem.ErrInvalidKey, 400, ProblemKeyInvalid, false},
		{idem.VerdictUnusable, idem.ErrCorrupt, 500, ProblemServerError, false},
		{idem.VerdictUnavailable, idem.ErrUnavailable, 503, ProblemUnavailable, true},
		{idem.VerdictUnavailable, idem.ErrClosed, 503, ProblemUnavailable, true},
		{idem.VerdictContext, context.Canceled, 503, ProblemUnavailable, true},
		{idem.VerdictTransient, idem.ErrExpired, 503, ProblemUnavailable, true},
	}
	seen := map[idem.Verdict]bool{}
	for _, row := range rows {
		if got := idem.VerdictOf(row.err); got != row.verdict {
			t.Fatalf("VerdictOf(%v) = %v; the table says %v", row.err, got, row.verdict)
		}
		seen[row.verdict] = true
		w := httptest.NewRecorder()
		m.answerError(w, httptest.NewRequest(http.MethodPost, "/", nil), "0:k", row.err)
		var p problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("%v: body %q: %v", row.verdict, w.Body, err)
		}
		if w.Code != row.status || p.Type != row.typ || p.Status != row.status || p.Title == "" {
			t.Errorf("%v (%v): %d %s %q; want %d %s", row.verdict, row.err, w.Code, p.Type, p.Title, row.status, row.typ)
		}
		if got := w.Header().Get("Retry-After") != ""; got != row.retryAfter {
			t.Errorf("%v: Retry-After %q; want it: %v", row.verdict, w.Header().Get("Retry-After"), row.retryAfter)
		}
	}
	for v := idem.Verdict(0); !strings.HasPrefix(v.String(), "Verdict("); v++ {
		if !seen[v] {
			t.Errorf("verdict %v has no row", v)
		}
	}
}
