package grpcidem

import (
	"context"
	"errors"
	"strconv"

	"github.com/idem-go/idem/door"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the domain of the ErrorInfo detail of the statuses the server
// interceptor makes itself.
const Domain = "github.com/idem-go/idem/grpcidem"

// Reasons, in the ErrorInfo detail of the statuses the server interceptor
// makes itself (see the package documentation's table): the values of
// door's Reasons, which every door shares.
const (
	// ReasonKeyReused: the key was used before with another request.
	ReasonKeyReused = string(door.KeyReused)
	// ReasonLateRetry: the key was used, and its outcome is no longer
	// kept (its retention ended; see idem.WithTombstones).
	ReasonLateRetry = string(door.LateRetry)
	// ReasonInProgress: a call with the key is still running; retry later.
	ReasonInProgress = string(door.InProgress)
	// ReasonKeyInvalid: the key is empty, too long, not visible ASCII, or
	// sent more than once.
	ReasonKeyInvalid = string(door.KeyInvalid)
	// ReasonKeyMissing: the method requires a key (WithRequired).
	ReasonKeyMissing = string(door.KeyMissing)
	// ReasonScope: WithScope found no principal for the call.
	ReasonScope = string(door.Scope)
	// ReasonBadRequest: WithFingerprint refused the request.
	ReasonBadRequest = string(door.BadRequest)
	// ReasonNotStored: the call was processed, but its response could not
	// be stored, so it cannot be replayed.
	ReasonNotStored = string(door.NotStored)
	// ReasonNotRecorded: the handler ran, but its outcome could not be
	// recorded; a retry may run it again.
	ReasonNotRecorded = string(door.NotRecorded)
	// ReasonRecordUnusable: the stored record of the key cannot be used.
	ReasonRecordUnusable = string(door.RecordUnusable)
	// ReasonUnavailable (Unavailable): the idempotency store (Redis)
	// cannot be reached, the service is shutting down, or another
	// transient failure (the key's record expired while the call waited:
	// idem.ErrExpired, idem.VerdictTransient); the call was not processed.
	ReasonUnavailable = string(door.Unavailable)
	// ReasonParked (FailedPrecondition): the key's operation is parked,
	// unfinished, until an operator retries it (idem.ErrParked); the
	// handler did not run, and waiting alone does not help.
	ReasonParked = string(door.Parked)
	// ReasonOutcomeUnknown (FailedPrecondition): a step of the key's
	// operation acted and its effect could not be settled; the outcome is
	// under reconciliation by an operator (idem.ErrUnknownOutcome). Do
	// not start the operation again under a new key.
	ReasonOutcomeUnknown = string(door.OutcomeUnknown)
)

// reasonCodes maps each door.Reason that answerError gives and that is not
// retryable (those are Unavailable, with RetryInfo) to its code.
var reasonCodes = map[door.Reason]codes.Code{
	door.KeyReused:      codes.FailedPrecondition,
	door.LateRetry:      codes.FailedPrecondition,
	door.Parked:         codes.FailedPrecondition,
	door.OutcomeUnknown: codes.FailedPrecondition,
	door.KeyInvalid:     codes.InvalidArgument,
	door.NotStored:      codes.Internal,
	door.RecordUnusable: codes.Internal,
}

// codeOf returns the code of reason r: Internal for one that answerError
// does not give.
func codeOf(r door.Reason) codes.Code {
	if c, ok := reasonCodes[r]; ok {
		return c
	}
	return codes.Internal
}

// pushbackTrailer is the trailer by which a server tells gRPC's retry
// policy how long to wait before it retries, in milliseconds.
const pushbackTrailer = "grpc-retry-pushback-ms"

// Reason returns the reason of err's ErrorInfo detail when err is a status
// made by the server interceptor (its domain is Domain), or "" otherwise:
// a client tells with it an idempotency answer from a handler's status of
// the same code.
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// fail returns a status with code, message and an ErrorInfo of reason.
func (s *server) fail(code codes.Code, reason, msg string) error {
	return newStatus(code, msg, &errdetails.ErrorInfo{Reason: reason, Domain: Domain}).Err()
}

// failWith returns err's own status if it has one, or else a status with
// code, reason and err's message.
func (s *server) failWith(err error, code codes.Code, reason string) error {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) && se.GRPCStatus().Code() != codes.OK {
		return se.GRPCStatus().Err()
	}
	return s.fail(code, reason, err.Error())
}

// retryable returns an Unavailable status with reason, and asks for a
// retry after WithRetryAfter in a RetryInfo detail and, for gRPC's retry
// policy, in the pushback trailer.
func (s *server) retryable(ctx context.Context, reason, msg string) error {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackTrailer, strconv.FormatInt(s.cfg.retryAfter.Milliseconds(), 10)))
	return newStatus(codes.Unavailable, msg,
		&errdetails.ErrorInfo{Reason: reason, Domain: Domain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(s.cfg.retryAfter)},
	).Err()
}

// newStatus returns a status with code, msg and details.
func newStatus(code codes.Code, msg string, details ...proto.Message) *status.Status {
	p := &spb.Status{Code: int32(code), Message: msg}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			panic(err) // the details are messages of this package's making
		}
		p.Details = append(p.Details, a)
	}
	return status.FromProto(p)
}
