package httpidem

import (
	"log/slog"
	"net/http"

	"github.com/idem-go/idem"
)

// StatusHandler returns a handler for status checks: a client that gave
// up on a request sends a GET with the request's Idempotency-Key (the
// header of WithHeader) and learns what became of it, without running or
// waiting for anything. The key is scoped as the middleware's (WithScope,
// with the same options), so a principal only ever sees its own
// operations: another principal's key is unknown to it.
//
//	done                      the stored response, with Idempotent-Replayed: true
//	in progress               409, ProblemInProgress, with Retry-After
//	not finished (released)   409, ProblemNotFinished: send the request again
//	parked                    409, ProblemParked (its recoveries did not finish it,
//	                          idem.WithMaxRecoveries) or ProblemOutcomeUnknown (a
//	                          checked step's outcome is unknown)
//	retention over, tombstone 410, ProblemLateRetry
//	unknown key               404, ProblemKeyUnknown
//	no key                    400, ProblemKeyMissing; other methods 405
//
// It reads Redis only (idem.Client.Result): with a ledger, an outcome that
// Redis lost is not found here, but by the request sent again. Mount it
// beside the endpoints it reports on, with the options given to New:
//
//	mux.Handle("GET /payments/status", httpidem.StatusHandler(keys, opts...))
//
// It panics as New does.
func StatusHandler(c *idem.Client, opts ...Option) http.Handler {
	m := New(c, append(opts, withoutRecovery())...)(http.NotFoundHandler()).(*middleware)
	return http.HandlerFunc(m.serveStatus)
}

func (m *middleware) serveStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		m.fail(w, ProblemBadRequest, http.StatusMethodNotAllowed, "a status check is a GET request")
		return
	}
	values := r.Header.Values(m.cfg.header)
	if len(values) == 0 {
		m.fail(w, ProblemKeyMissing, http.StatusBadRequest, "a status check names its operation by the "+m.cfg.header+" header")
		return
	}
	key, _, ok := m.scopedKey(w, r, values)
	if !ok {
		return
	}
	res, st, err := m.c.Result(r.Context(), key)
	switch {
	case err != nil:
		m.answerError(w, r, key, err)
	case st.State == idem.StateDone:
		resp, err := decodeResponse(res)
		if err != nil {
			m.log(r, key, slog.LevelError, "httpidem: status check: the stored response cannot be read", err)
			m.fail(w, ProblemServerError, http.StatusInternalServerError, "the record of this "+m.cfg.header+" cannot be used")
			return
		}
		resp.write(w, true)
	case st.State == idem.StateInProgress:
		m.retryAfter(w)
		m.fail(w, ProblemInProgress, http.StatusConflict,
			"the request with this "+m.cfg.header+" is still being processed; check again after Retry-After seconds")
	case st.State == idem.StateParked && st.Step == "":
		m.fail(w, ProblemParked, http.StatusConflict,
			"the operation of this "+m.cfg.header+" did not finish after its recoveries and is parked until an operator retries it; do not start it again under a new key")
	case st.State == idem.StateParked:
		m.fail(w, ProblemOutcomeUnknown, http.StatusConflict,
			"the outcome of this "+m.cfg.header+"'s operation is unknown and under reconciliation by an operator; do not start it again under a new key")
	case st.State == idem.StateReleased:
		m.fail(w, ProblemNotFinished, http.StatusConflict,
			"the operation of this "+m.cfg.header+" did not finish and nothing is stored; send the request again with the same "+m.cfg.header)
	case st.Tombstone:
		m.fail(w, ProblemLateRetry, http.StatusGone,
			"this "+m.cfg.header+" was used, and its outcome is no longer kept")
	default:
		m.fail(w, ProblemKeyUnknown, http.StatusNotFound, "no operation with this "+m.cfg.header+" is known")
	}
}
