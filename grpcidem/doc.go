// Package grpcidem makes unary gRPC calls safe to retry: a server
// interceptor runs the handler at most once per idempotency key and replays
// its response to every retry, and a client interceptor sends one key per
// logical call, the same in every retry.
//
// A client that times out cannot know whether its call ran. It sends one
// key per logical operation in the metadata "idempotency-key" and retries
// with the same key:
//
//	keys := idem.New(rdb)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		auth, // sets the principal that WithScope reads
//		grpcidem.UnaryServerInterceptor(keys, grpcidem.WithScope(principal)),
//	))
//	cc, err := grpc.NewClient(target, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()), ...)
//
// The first call with a key claims it (idem.Client.Do) and runs the
// handler; its response message, and the header and trailer metadata it
// set, are stored in Redis for the Client's retention (idem.WithRetention).
// Every later call with the key gets that response, decoded into the
// method's response type, with the response header
// "idempotent-replayed: true", and the handler does not run. Duplicates
// that arrive while the handler runs wait for its response
// (idem.WithWait), in any number of processes that share the Redis.
//
// # Statuses
//
//	situation                                     code                reason (ErrorInfo)
//	--------------------------------------------  ------------------  -------------------------
//	method not in WithMethods, or no key          -                   passed to the handler untouched
//	  (and not WithRequired); streaming RPCs
//	first call with the key                       the handler's       -
//	retry after a response                        OK                  the stored response, replayed
//	retry after a definite error status           the same code       the stored code and message, replayed
//	  (see WithDefiniteCodes)
//	retry after a transient error status          the handler's       the handler runs again (not stored)
//	key reused with another request               FailedPrecondition  ReasonKeyReused
//	retry after the retention, outcome gone       FailedPrecondition  ReasonLateRetry
//	  (only its tombstone: idem.WithTombstones)
//	first call still running after the wait       Unavailable         ReasonInProgress, RetryInfo
//	key empty, too long, not visible ASCII,       InvalidArgument     ReasonKeyInvalid
//	  or sent twice
//	key missing under WithRequired                InvalidArgument     ReasonKeyMissing
//	WithScope failed                              Unauthenticated     ReasonScope (or the error's own status)
//	WithFingerprint failed                        InvalidArgument     ReasonBadRequest (or the error's own status)
//	retry after a response too large to store     Internal            ReasonNotStored
//	the handler ran, its outcome not recorded     Internal            ReasonNotRecorded
//	operation parked (idem.ErrParked)             FailedPrecondition  ReasonParked
//	outcome unknown (idem.ErrUnknownOutcome)      FailedPrecondition  ReasonOutcomeUnknown
//	stored record unreadable                      Internal            ReasonRecordUnusable
//	Redis unreachable, Client closed, the record  Unavailable         ReasonUnavailable, RetryInfo
//	  expired while waiting (idem.ErrExpired)
//	the call's context ended before the answer    Canceled or         -
//	  (the handler, if it runs, goes on)          DeadlineExceeded
//
// Every status the interceptor makes itself carries an ErrorInfo detail
// (google.golang.org/genproto/googleapis/rpc/errdetails) with Domain and one
// of the Reason constants, which Reason reads back, so that a client can
// tell an idempotency answer from its handler's statuses of the same code.
// The retryable ones (Unavailable) carry a RetryInfo detail and the
// trailer grpc-retry-pushback-ms, both set to WithRetryAfter, which gRPC's
// retry policy honours: a client whose policy retries UNAVAILABLE retries
// an in-progress call after that delay, with the same key (see
// UnaryClientInterceptor), and gets the first call's response.
//
// The handler is never run without a claim, and a response is never
// replayed to a call it was not stored for: with Redis down the answer is
// Unavailable, not a guess.
//
// # What is stored and replayed
//
// A response: the message (proto.Marshal), its type's full name, and the
// header and trailer metadata the handler set (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer). A replay decodes the message into a
// new message of that type, found in protoregistry.GlobalTypes (generated
// code and the well-known types register themselves there), and sets the
// stored metadata; the header "idempotent-replayed: true" is added.
//
// An error status is stored when it is a definite answer, one the handler
// would give again (WithDefiniteCodes: InvalidArgument, NotFound,
// AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange by
// default), or when the handler marked its error idem.Permanent: it is
// stored as an idem permanent failure carrying the code and the message
// (code "grpc.<Code>", such as "grpc.NotFound"), and replayed as a status
// with the same code and message. Its details and the metadata the handler
// set are not stored: the first caller gets them, retries do not. Any
// other status (Unavailable, Internal, DeadlineExceeded, Aborted,
// ResourceExhausted, Unknown, Canceled...) is transient: the key is
// released, and a retry runs the handler again, as idem.Attempt number 2
// (the handler can read idem.AttemptFrom(ctx) to reconcile first). A
// handler that panics releases the key too, and the panic goes on.
//
// A response larger than the Client's idem.WithMaxResultSize (1 MiB by
// default), or one that cannot be encoded (not a protocol buffer message,
// or invalid), is sent to its caller and not stored: the handler has run,
// so the key is finished as a failure (the log says so) and retries get
// Internal with ReasonNotStored, never a second run.
//
// # Exactly-once through the ledger
//
// Redis cannot join the handler's database transaction: with Redis alone,
// a response stored after the business change committed can be lost (a
// crash between the two, a Redis restart without persistence), and a
// retry then runs the handler again. With a ledger in the handler's own
// database (idem.WithLedger on the interceptor's Client), the handler
// commits its response with its business change: Recorded(ctx, resp) is
// the response and the metadata set so far in the form the interceptor
// stores them; the handler commits it in its transaction, then returns
// resp:
//
//	b, err := grpcidem.Recorded(ctx, resp)
//	if err != nil { ... }
//	err = idemsql.Commit(ctx, tx, b) // or idempgx.Commit
//	return resp, nil
//
// The database's unique key on the idempotency key decides: when the
// commit finds the key recorded already (another live owner committed
// first, or Redis lost the record and this is a retry), the transaction
// rolls back, business change and all, and the interceptor returns the
// recorded response and its metadata, marked replayed, not what this
// handler returns (idem.LedgerDecided tells it which). A takeover after a
// crash finds the committed response before the handler runs.
//
// # Keys and scopes
//
// A key is one metadata value of 1 to WithMaxKeyLen visible ASCII
// characters (0x21 to 0x7E). The key is namespaced by the principal that
// WithScope returns, so one user's key can never replay another user's
// response: the key given to idem.Client.Do (and seen in idem.Attempt.Key)
// is door.Key(scope, key), the scope's length in decimal, ':', the scope
// and the key, as in every door, so no two (scope, key) pairs share one,
// and a key without a scope names the record that httpidem and
// idemstream name with it. WithMaxKeyLen is fitted to the Client's
// idem.WithMaxKeyLen (door.FitKeyLen); a key with a scope that does not
// fit gets InvalidArgument. Logs carry the Client's keyed
// digest of the key (idem.Client.LogAttrs), never the key unless the Client
// was made with idem.WithRawEventKeys(true).
//
// # Fingerprints
//
// A key reused with another request is refused (FailedPrecondition,
// ReasonKeyReused), while the first call runs and after. The fingerprint
// (DefaultFingerprint) is a digest of the full method name and the
// request's deterministic protobuf encoding
// (proto.MarshalOptions{Deterministic: true}), which is stable for one
// build of the service, not across schemas and library versions: map
// entries are sorted and fields are written in field-number order, so the
// order a client sent them in does not count; but unknown fields (sent by
// a client with a newer schema) are kept as the bytes received, in their
// order, and a field the server's schema learns later is written
// differently from when it was unknown. A retry that spans a deployment
// which changed the request's message may therefore be refused as a
// conflict. Floating-point -0 and 0, and NaNs with different bits, are
// different requests. WithFingerprint replaces the digest.
//
// # The handler's context
//
// The handler's context carries the call's values and the idem.Attempt
// (idem.AttemptFrom), and ends after WithHandlerTimeout (1 minute by
// default) or when idem's lease on the key is lost, not when the client
// goes away or its deadline passes: the work outlives its caller. A
// client whose deadline passes gets DeadlineExceeded at once, the handler
// goes on, its outcome is stored, and the client's retry waits for it or
// replays it; what the handler sends (grpc.SendHeader) after its caller
// has gone is dropped. A panic reaches gRPC while the call lasts; after,
// it is logged and the key released. grpc.Server.GracefulStop does not
// wait for handlers whose calls have ended. A handler that gives up
// because its context ended should return a transient status (Canceled,
// Unavailable...), so that a retry runs it again.
//
// To record the metadata it sets, the handler's context carries a
// grpc.ServerTransportStream of the interceptor's, which holds what
// grpc.SetHeader and grpc.SetTrailer set until the handler returns, then
// sets it on gRPC's own (unless the ledger decided another outcome, whose
// metadata the replay sets), and passes the rest on: grpc.SendHeader and
// grpc.Method work as usual, but the experimental grpc.SetSendCompressor
// and grpc.ClientSupportedCompressors, which need gRPC's own stream, fail
// behind the interceptor.
//
// # Streaming RPCs
//
// A stream carries many messages whose outcome cannot be stored and
// replayed as one response, so no interceptor here makes a stream
// idempotent. UnaryServerInterceptor and UnaryClientInterceptor are unary,
// and gRPC does not call them for streams: alone, they let a key sent on a
// stream pass unseen, and WithRequired does not apply to streams. Chain
// StreamServerInterceptor too, and a stream that carries a key is refused
// (InvalidArgument, ReasonKeyInvalid, saying why) instead of being run by
// a client that believes its retries safe:
//
//	grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(keys)),
//		grpc.ChainStreamInterceptor(grpcidem.StreamServerInterceptor()),
//	)
package grpcidem
