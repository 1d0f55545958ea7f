package grpcidem

import (
	"context"
	"errors"
)

// ErrNoInterceptor means Recorded was given a context that is not that of
// a handler run by the server interceptor for a call with a key.
var ErrNoInterceptor = errors.New("grpcidem: the context is not that of a handler behind the idempotency interceptor")

// callKey is the context key under which a handler's context holds its
// *call, for Recorded.
type callKey struct{}

// Recorded returns resp, the response the handler is about to return, with
// the header and trailer metadata it has set so far, in the form in which
// the interceptor stores them: the value for the handler to commit, with
// its business change, in its own transaction, when the interceptor's
// Client has a ledger (idem.WithLedger):
//
//	resp := &pb.DebitReply{Receipt: id}
//	b, err := grpcidem.Recorded(ctx, resp)
//	if err != nil { ... }
//	if err := idemsql.Commit(ctx, tx, b); err != nil { ... }
//	return resp, nil
//
// Once the commit lands, that is the key's outcome. When the commit finds
// the key recorded already (it returns an error wrapping idem.ErrRecorded
// or idem.ErrConflict: another live owner, or Redis lost the record), the
// transaction is rolled back, and the interceptor answers with the
// recorded response and its metadata, as a replay ("idempotent-replayed:
// true"), or with the error's status, whatever the handler returns; the
// metadata the handler set is dropped, unless it sent it (grpc.SendHeader)
// already.
//
// ctx is the handler's context, or one derived from it. Recorded fails
// with an error wrapping ErrNoInterceptor outside such a handler (a call
// without a key, a method not in WithMethods), and with another error for
// a resp that is not a protocol buffer message or cannot be encoded.
func Recorded(ctx context.Context, resp any) ([]byte, error) {
	cl, _ := ctx.Value(callKey{}).(*call)
	if cl == nil {
		return nil, ErrNoInterceptor
	}
	return encodeResponse(resp, cl.capture)
}
