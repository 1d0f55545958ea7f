// Package door holds what idem's integrations share, so that every way
// into a service (an HTTP middleware, a gRPC interceptor, a stream
// consumer, and the next one: Kafka, NATS, SQS, connect-go) answers one
// idempotency key the same way: the key scheme (Key), the limits fitted
// to the Client's (FitKeyLen, FitResponse), the reasons a door answers a
// call itself and their wording (Reason, AnswerOf), the retry delay rule
// (CheckRetryAfter), the framing of a stored response (AppendFrame,
// ReadFrame, Reader), the run of a handler that outlives its caller
// (Detach) and the default logger (Logger).
//
// httpidem, grpcidem and idemstream use it and keep only their
// transport: status codes and problem URIs, gRPC codes and ErrorInfo,
// XACK and dead letters. A new integration is a mapping from Reason to
// its transport, not a copy of theirs:
//
//	a := door.AnswerOf(err, "Idempotency-Key")
//	switch a.Reason {
//	case door.KeyReused:
//		// answer "conflict" with a.Detail
//	}
//
// Its API follows the core's version and compatibility promise, as the
// integrations built on it do.
package door
