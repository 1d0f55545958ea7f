package httpidem

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/idem-go/idem"
)

// ErrNoMiddleware means Recorded was given a writer that is not the one
// the middleware gave the handler for a call with a key, nor one that
// wraps it with an Unwrap() http.ResponseWriter method.
var ErrNoMiddleware = errors.New("httpidem: the writer is not the idempotency middleware's")

// Recorded returns the response the handler has written to w so far (its
// status, the headers that are stored and its body) in the form in which
// the middleware stores it: the value for the handler to commit, with its
// business change, in its own transaction, when the middleware's Client
// has a ledger (idem.WithLedger):
//
//	w.WriteHeader(http.StatusCreated)
//	json.NewEncoder(w).Encode(receipt)
//	b, err := httpidem.Recorded(w)
//	if err != nil { ... }
//	if err := idemsql.Commit(r.Context(), tx, b); err != nil { ... }
//	return
//
// Once the commit lands, that response is the key's outcome: write nothing
// more. When the commit finds the key recorded already (it returns an
// error wrapping idem.ErrRecorded or idem.ErrConflict: another live
// owner, or Redis lost the record), the transaction is rolled back, and
// the middleware answers with the recorded response, as a replay
// (Idempotent-Replayed: true), or with the error's answer, whatever the
// handler writes next.
//
// w is the handler's writer, or one that wraps it and has an Unwrap()
// http.ResponseWriter method (as http.ResponseController expects).
// Recorded writes the status 200 if none is written yet, as a first Write
// would. It fails with an error wrapping ErrNoMiddleware for a writer of
// no middleware's call (the request has no key, or a method the
// middleware does not handle), and with another error for a 5xx status
// (not stored: a retry runs the handler again) or a response too large to
// store (idem.ErrTooLarge): nothing may be committed then.
func Recorded(w http.ResponseWriter) ([]byte, error) {
	for w != nil {
		if rec, ok := w.(*recorder); ok {
			return rec.recorded()
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	return nil, fmt.Errorf("%w: %T (is the request's method handled, does it carry a key, and does each wrapper of the writer have an Unwrap method?)", ErrNoMiddleware, w)
}

// recorded returns the stored form of the response so far, for Recorded.
func (rec *recorder) recorded() ([]byte, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	switch {
	case rec.status >= 500:
		return nil, fmt.Errorf("httpidem: Recorded: status %d is not stored (a retry runs the handler again): answer it without committing", rec.status)
	case rec.streamed:
		return nil, fmt.Errorf("httpidem: Recorded: %w: the response outgrew WithMaxResponse (%d bytes) and was sent unbuffered; it cannot be stored", idem.ErrTooLarge, rec.limit)
	}
	return rec.stored(), nil
}
