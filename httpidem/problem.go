package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/idem-go/idem/door"
)

// The type URIs of the middleware's problem answers (RFC 9457), each a
// link to its own documentation here. Clients can switch on them.
const (
	problemBase = "https://pkg.go.dev/github.com/idem-go/idem/httpidem#"

	// ProblemKeyMissing (400): the request has no key, and WithRequired
	// makes it mandatory.
	ProblemKeyMissing = problemBase + "ProblemKeyMissing"
	// ProblemKeyInvalid (400): the key is empty, too long, sent twice, or
	// has characters other than visible ASCII.
	ProblemKeyInvalid = problemBase + "ProblemKeyInvalid"
	// ProblemKeyReused (422): the key was used before with another request
	// (another fingerprint). The handler did not run. Use a new key for a
	// new operation.
	ProblemKeyReused = problemBase + "ProblemKeyReused"
	// ProblemLateRetry (410): the key was used, and its response is no
	// longer kept (its retention ended; only its tombstone is left, see
	// idem.WithTombstones). The handler did not run again. Treat the
	// operation as done; use a new key for a new operation.
	ProblemLateRetry = problemBase + "ProblemLateRetry"
	// ProblemInProgress (409): a request with the key is still running:
	// another one's (the handler did not run for this one), or this one's,
	// whose context ended before its handler did. Retry after Retry-After
	// seconds for the response.
	ProblemInProgress = problemBase + "ProblemInProgress"
	// ProblemBodyTooLarge (413): the body is over WithMaxBody.
	ProblemBodyTooLarge = problemBase + "ProblemBodyTooLarge"
	// ProblemBadRequest (400): the body could not be read, or WithFingerprint
	// refused the request.
	ProblemBadRequest = problemBase + "ProblemBadRequest"
	// ProblemScope (401, or the status the error of WithScope gives): the
	// request's principal could not be established.
	ProblemScope = problemBase + "ProblemScope"
	// ProblemNotStored (500): a request with the key was processed, but its
	// response was too large to store, so it cannot be replayed. The
	// handler does not run again for the key.
	ProblemNotStored = problemBase + "ProblemNotStored"
	// ProblemNotRecorded (500): the handler ran in this request, but its
	// response could not be recorded (Redis failed, or the lease was lost).
	// A retry after the lease may run the handler again, as a new attempt.
	ProblemNotRecorded = problemBase + "ProblemNotRecorded"
	// ProblemServerError (500): the key's record cannot be used (it is
	// corrupt, or of a format this version cannot read). The handler did
	// not run.
	ProblemServerError = problemBase + "ProblemServerError"
	// ProblemUnavailable (503): the idempotency store (Redis) cannot be
	// reached, the service is shutting down, or another transient failure
	// (the key's record expired while this request waited: idem.ErrExpired,
	// idem.VerdictTransient). The handler did not run; retry after
	// Retry-After seconds.
	ProblemUnavailable = problemBase + "ProblemUnavailable"
	// ProblemParked (409): the key's operation is parked, unfinished,
	// until an operator retries it (idem.ErrParked). The handler did not
	// run; a retry gets the same answer until then. 409, not 503: waiting
	// alone does not help.
	ProblemParked = problemBase + "ProblemParked"
	// ProblemOutcomeUnknown (409): a step of the key's operation acted and
	// its effect could not be settled: the outcome is unknown, and under
	// reconciliation by an operator (idem.ErrUnknownOutcome). The handler
	// did not run; do not start the operation again under a new key.
	ProblemOutcomeUnknown = problemBase + "ProblemOutcomeUnknown"
	// ProblemKeyUnknown (404): a status check (StatusHandler) found no
	// operation with the key for this principal.
	ProblemKeyUnknown = problemBase + "ProblemKeyUnknown"
	// ProblemNotFinished (409): a status check (StatusHandler) found the
	// key's operation unfinished with nothing stored (its last attempt
	// failed transiently): send the request again with the key.
	ProblemNotFinished = problemBase + "ProblemNotFinished"
)

// problems maps each door.Reason to its problem type and status; titles
// are the reasons' (door.Reason.Title).
var problems = map[door.Reason]struct {
	typ    string
	status int
}{
	door.KeyMissing:     {ProblemKeyMissing, http.StatusBadRequest},
	door.KeyInvalid:     {ProblemKeyInvalid, http.StatusBadRequest},
	door.KeyReused:      {ProblemKeyReused, http.StatusUnprocessableEntity},
	door.LateRetry:      {ProblemLateRetry, http.StatusGone},
	door.InProgress:     {ProblemInProgress, http.StatusConflict},
	door.BodyTooLarge:   {ProblemBodyTooLarge, http.StatusRequestEntityTooLarge},
	door.BadRequest:     {ProblemBadRequest, http.StatusBadRequest},
	door.Scope:          {ProblemScope, http.StatusUnauthorized},
	door.NotStored:      {ProblemNotStored, http.StatusInternalServerError},
	door.NotRecorded:    {ProblemNotRecorded, http.StatusInternalServerError},
	door.RecordUnusable: {ProblemServerError, http.StatusInternalServerError},
	door.Unavailable:    {ProblemUnavailable, http.StatusServiceUnavailable},
	door.Parked:         {ProblemParked, http.StatusConflict},
	door.OutcomeUnknown: {ProblemOutcomeUnknown, http.StatusConflict},
	door.KeyUnknown:     {ProblemKeyUnknown, http.StatusNotFound},
	door.NotFinished:    {ProblemNotFinished, http.StatusConflict},
}

// titles are the problems' titles, one per type (RFC 9457, section 3.1.3).
var titles = func() map[string]string {
	t := make(map[string]string, len(problems))
	for r, p := range problems {
		t[p.typ] = r.Title()
	}
	return t
}()

// problemOf returns the problem type and status of reason r.
func problemOf(r door.Reason) (typ string, status int) {
	p := problems[r]
	return p.typ, p.status
}

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// fail answers with a problem+json body; headers already set on w (such as
// Retry-After) stay.
func (m *middleware) fail(w http.ResponseWriter, typ string, status int, detail string) {
	b, _ := json.Marshal(problem{Type: typ, Title: titles[typ], Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	h.Del(HeaderReplayed)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
