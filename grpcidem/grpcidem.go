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
//	stored record unreadable, or expired          Internal            ReasonRecordUnusable
//	  while waiting
//	Redis unreachable, Client closed              Unavailable         ReasonUnavailable, RetryInfo
//	the call's context ended before a claim       Canceled or         -
//	                                              DeadlineExceeded
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
// # Keys and scopes
//
// A key is one metadata value of 1 to WithMaxKeyLen visible ASCII
// characters (0x21 to 0x7E). The key is namespaced by the principal that
// WithScope returns, so one user's key can never replay another user's
// response: the key given to idem.Client.Do (and seen in idem.Attempt.Key)
// is the scope's length in decimal, ':', the scope and the key, as in
// httpidem, so no two (scope, key) pairs share one. The Client's
// idem.WithMaxKeyLen must leave room for the scope and its length; a key
// that does not fit gets InvalidArgument. Logs carry a keyed digest of the
// key (WithKeySecret), never the key.
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
// The handler's context carries the idem.Attempt (idem.AttemptFrom), and
// ends when the client goes away or when idem's lease on the key is lost.
// A handler that gives up because its context ended should return a
// transient status (Canceled, Unavailable...), so that a retry runs it
// again.
//
// To record the metadata it sets, the handler's context carries a
// grpc.ServerTransportStream of the interceptor's, which passes every call
// on to gRPC's own: grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer and
// grpc.Method work as usual, but the experimental grpc.SetSendCompressor
// and grpc.ClientSupportedCompressors, which need gRPC's own stream, fail
// behind the interceptor.
//
// # Streaming RPCs
//
// Streaming RPCs pass through untouched: the interceptors are unary
// (grpc.UnaryServerInterceptor, grpc.UnaryClientInterceptor), and gRPC does
// not call them for streams. A stream carries many messages whose outcome
// cannot be stored and replayed as one response; a key sent on a stream is
// ignored, and WithRequired does not apply to streams.
package grpcidem

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Metadata names.
const (
	// HeaderIdempotencyKey is the request metadata that carries the key,
	// unless WithHeader (or WithClientHeader) names another.
	HeaderIdempotencyKey = "idempotency-key"
	// HeaderReplayed is the response header metadata set to "true" on
	// every replay.
	HeaderReplayed = "idempotent-replayed"
)

// An Option configures the server interceptor. Pass options to
// UnaryServerInterceptor.
type Option func(*config)

type config struct {
	header      string
	methods     map[string]bool // nil: every unary method
	required    bool
	scope       func(context.Context) (string, error)
	fingerprint func(context.Context, string, any) (string, error)
	definite    [codeCount]bool
	maxKeyLen   int
	retryAfter  time.Duration
	logger      *slog.Logger
	keySecret   []byte
	problems    []string
}

func (c *config) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// codeCount is the number of gRPC status codes (OK to Unauthenticated).
const codeCount = 17

// defaultDefinite are the codes of definite answers unless
// WithDefiniteCodes names others.
var defaultDefinite = []codes.Code{
	codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
	codes.PermissionDenied, codes.FailedPrecondition, codes.OutOfRange,
}

// WithHeader sets the name of the request metadata that carries the key:
// lowercase letters, digits, '-', '_' and '.', neither starting with
// "grpc-" (reserved) nor ending with "-bin" (binary). Upper case is
// lowered, as gRPC does.
// The default is "idempotency-key" (HeaderIdempotencyKey).
func WithHeader(name string) Option {
	return func(c *config) {
		n, err := metadataName(name)
		if err != nil {
			c.problem("WithHeader(%q): %v", name, err)
			return
		}
		c.header = n
	}
}

// WithMethods sets the unary methods the interceptor handles, by full
// name ("/package.Service/Method"); calls of other methods pass through
// untouched. List the methods that change something: a read replayed from
// the store is as old as its first call.
// The default is every unary method.
func WithMethods(fullMethods ...string) Option {
	return func(c *config) {
		m, err := methodSet(fullMethods)
		if err != nil {
			c.problem("WithMethods: %v", err)
			return
		}
		c.methods = m
	}
}

// WithRequired makes the key mandatory: a call of a handled method without
// one gets InvalidArgument (ReasonKeyMissing).
// The default lets such calls pass through to the handler.
func WithRequired() Option {
	return func(c *config) { c.required = true }
}

// WithScope sets the function that names the principal a call acts for (a
// user or an API client, as authenticated by an interceptor that runs
// before this one), which namespaces its key: a key sent by one principal
// never replays another's response. It runs after the key is read. If it
// returns an error, the call gets that error's status when it has one
// (status.FromError), or else Unauthenticated (ReasonScope) with the
// error's message. An empty scope is allowed: it is the scope of calls
// without WithScope.
// The default scope is "" for every call.
func WithScope(scope func(ctx context.Context) (string, error)) Option {
	return func(c *config) {
		if scope == nil {
			c.problem("WithScope(nil)")
			return
		}
		c.scope = scope
	}
}

// WithFingerprint sets the function that fingerprints a call: a key reused
// with a call whose fingerprint differs gets FailedPrecondition
// (ReasonKeyReused). If it returns an error, the call gets that error's
// status when it has one, or else InvalidArgument (ReasonBadRequest). An
// empty fingerprint is not checked.
// The default is DefaultFingerprint.
func WithFingerprint(fingerprint func(ctx context.Context, fullMethod string, req any) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.problem("WithFingerprint(nil)")
			return
		}
		c.fingerprint = fingerprint
	}
}

// WithDefiniteCodes sets the error codes that are definite answers: a
// handler's status with one of them is stored and replayed; any other is
// transient, and the key is released (see the package documentation).
// OK cannot be one; with none, only errors marked idem.Permanent are
// stored.
// The default is InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition and OutOfRange.
func WithDefiniteCodes(definite ...codes.Code) Option {
	return func(c *config) {
		c.definite = [codeCount]bool{}
		for _, code := range definite {
			if code == codes.OK || code >= codeCount {
				c.problem("WithDefiniteCodes: %v is not an error code", code)
				continue
			}
			c.definite[code] = true
		}
	}
}

// WithMaxKeyLen sets the longest key, in bytes; a longer one gets
// InvalidArgument (ReasonKeyInvalid). It must be between 1 and 65536.
// The default is 255.
func WithMaxKeyLen(n int) Option {
	return func(c *config) {
		if n < 1 || n > 1<<16 {
			c.problem("WithMaxKeyLen(%d): must be between 1 and 65536", n)
			return
		}
		c.maxKeyLen = n
	}
}

// WithRetryAfter sets the delay that Unavailable answers (in progress,
// Redis unavailable) ask the client to wait before it retries, in their
// RetryInfo detail and their grpc-retry-pushback-ms trailer: a guess at
// when a retry may find the first call finished, not its lease's end. It
// must be at least a millisecond.
// The default is 1 second.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.problem("WithRetryAfter(%v): must be at least 1ms", d)
			return
		}
		c.retryAfter = d
	}
}

// WithLogger sets the logger for what the interceptor notices on its own:
// responses not stored, outcomes not recorded, Redis failures, unreadable
// records. Records carry the method and the key's digest (see
// WithKeySecret). A nil logger discards.
// The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithKeySecret sets the secret of the keyed digest that stands for the
// key in logs (idem.EventKeyDigest of the scoped key). Give it the secret
// given to idem.WithEventKeySecret, so that the digests in this package's
// logs match those of idem's events; at least 16 bytes.
// The default is a random secret per process.
func WithKeySecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) < 16 {
			c.problem("WithKeySecret: the secret has %d bytes, want at least 16", len(secret))
			return
		}
		c.keySecret = append([]byte(nil), secret...)
	}
}

// processSecret is the secret of key digests without WithKeySecret.
var processSecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand documents it)
	return b
})

// UnaryServerInterceptor returns an interceptor that runs the handler at
// most once per idempotency key, with c, and replays its response or
// definite error status to retries (see the package documentation). Chain
// it after the interceptors that authenticate the call.
// It panics if c is nil or an option is invalid, as those are programming
// errors.
func UnaryServerInterceptor(c *idem.Client, opts ...Option) grpc.UnaryServerInterceptor {
	cfg := config{
		header:      HeaderIdempotencyKey,
		fingerprint: DefaultFingerprint,
		maxKeyLen:   255,
		retryAfter:  time.Second,
		logger:      slog.New(slog.DiscardHandler),
	}
	for _, code := range defaultDefinite {
		cfg.definite[code] = true
	}
	if c == nil {
		cfg.problem("nil *idem.Client")
	}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("grpcidem: invalid options: %s", strings.Join(cfg.problems, "; ")))
	}
	if cfg.keySecret == nil {
		cfg.keySecret = processSecret()
	}
	s := &server{c: c, cfg: cfg}
	return s.intercept
}

type server struct {
	c   *idem.Client
	cfg config
}

// call is one call through the interceptor, from its key on.
type call struct {
	s      *server
	ctx    context.Context
	method string
	key    string // scoped: the key given to idem
	// Set when the handler runs in this call: its outcome is the
	// original, not a replay.
	ran     bool
	resp    any
	err     error
	capture *capture // the metadata the handler set; nil outside a server
}

// intercept reads the key, the scope and the fingerprint, and runs the
// handler under idem.Client.Do, or answers from the stored outcome.
func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.cfg.methods != nil && !s.cfg.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(s.cfg.header)
	if len(values) == 0 {
		if s.cfg.required {
			return nil, s.fail(codes.InvalidArgument, ReasonKeyMissing,
				"the call has no "+s.cfg.header+" metadata, which this method requires")
		}
		return handler(ctx, req)
	}
	key, err := parseKey(values, s.cfg.maxKeyLen)
	if err != nil {
		return nil, s.fail(codes.InvalidArgument, ReasonKeyInvalid, "the "+s.cfg.header+" metadata "+err.Error())
	}
	var scope string
	if s.cfg.scope != nil {
		if scope, err = s.cfg.scope(ctx); err != nil {
			return nil, s.failWith(err, codes.Unauthenticated, ReasonScope)
		}
	}
	fp, err := s.cfg.fingerprint(ctx, info.FullMethod, req)
	if err != nil {
		return nil, s.failWith(err, codes.InvalidArgument, ReasonBadRequest)
	}
	cl := &call{s: s, ctx: ctx, method: info.FullMethod, key: scopedKey(scope, key)}
	res, err := s.c.Do(ctx, cl.key, fp, func(ctx context.Context) ([]byte, error) {
		return cl.run(ctx, req, handler)
	})
	if cl.ran {
		return cl.answerOwner(err)
	}
	if err != nil {
		return nil, cl.answerError(err)
	}
	return cl.replay(res)
}

// run runs the handler as the key's owner and returns its outcome as idem
// stores it: the response's stored form, a permanent failure for a
// definite status, or a transient error.
func (cl *call) run(ctx context.Context, req any, handler grpc.UnaryHandler) ([]byte, error) {
	cl.ran = true
	ctx, cl.capture = captureMetadata(ctx)
	cl.resp, cl.err = handler(ctx, req)
	if cl.err != nil {
		st := status.Convert(cl.err)
		code := st.Code()
		if code == codes.OK {
			// An error whose status says OK (a GRPCStatus method that
			// returns nil): gRPC sends Unknown.
			code = codes.Unknown
		}
		if idem.IsPermanent(cl.err) || cl.s.cfg.definite[code] {
			return nil, idem.PermanentCode(statusCodePrefix+code.String(), errors.New(st.Message()))
		}
		return nil, errTransient
	}
	b, err := encodeResponse(cl.resp, cl.capture)
	if err != nil {
		// The handler acted: finish the key, so that it does not run again.
		return nil, idem.PermanentCode(codeNotStored, err)
	}
	return b, nil
}

// errTransient is the outcome of a handler that returned a transient
// status: the key is released.
var errTransient = errors.New("grpcidem: transient status, not stored")

// answerOwner returns the outcome of the handler that ran in this call,
// unless it could not be recorded.
func (cl *call) answerOwner(err error) (any, error) {
	log := cl.s.cfg.logger
	switch {
	case err == nil:
	case errors.Is(err, idem.ErrNotRecorded), errors.Is(err, idem.ErrLeaseLost):
		log.Error("grpcidem: the handler ran but its outcome was not recorded",
			"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
		return nil, cl.s.fail(codes.Internal, ReasonNotRecorded,
			"the call was processed, but its outcome could not be recorded; a retry may run it again")
	case errors.Is(err, idem.ErrTooLarge):
		log.Warn("grpcidem: response not stored: larger than the Client's WithMaxResultSize; retries get Internal",
			"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
	case idem.Code(err) == codeNotStored:
		log.Warn("grpcidem: response not stored: it cannot be encoded; retries get Internal",
			"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
	}
	return cl.resp, cl.err
}

// answerError answers a call whose handler did not run here.
func (cl *call) answerError(err error) error {
	s := cl.s
	var stored *idem.StoredError
	switch {
	case errors.As(err, &stored):
		return cl.replayFailure(stored)
	case errors.Is(err, idem.ErrConflict):
		return s.fail(codes.FailedPrecondition, ReasonKeyReused,
			"this "+s.cfg.header+" was used before with another request")
	case errors.Is(err, idem.ErrLateRetry):
		return s.fail(codes.FailedPrecondition, ReasonLateRetry,
			"this "+s.cfg.header+" was used, and its outcome is no longer kept; use a new key for a new operation")
	case errors.Is(err, idem.ErrInProgress):
		return s.retryable(cl.ctx, ReasonInProgress,
			"a call with this "+s.cfg.header+" is still being processed; retry later")
	case errors.Is(err, idem.ErrInvalidKey):
		return s.fail(codes.InvalidArgument, ReasonKeyInvalid,
			"the "+s.cfg.header+" metadata is too long for this service")
	case errors.Is(err, idem.ErrTooLarge):
		return errNotStoredStatus(s)
	case errors.Is(err, idem.ErrClosed):
		return s.retryable(cl.ctx, ReasonUnavailable, "the service is shutting down")
	case errors.Is(err, idem.ErrCorrupt), errors.Is(err, idem.ErrExpired):
		s.cfg.logger.Error("grpcidem: cannot answer from the stored record",
			"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
		return s.fail(codes.Internal, ReasonRecordUnusable, "the record of this key cannot be used")
	case cl.ctx.Err() != nil:
		// The caller went away or its deadline passed: nothing ran.
		return status.FromContextError(cl.ctx.Err()).Err()
	default:
		// Redis unreachable, a timeout, a claim that came back too late:
		// nothing ran.
		s.cfg.logger.Error("grpcidem: cannot reach the idempotency store",
			"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
		return s.retryable(cl.ctx, ReasonUnavailable,
			"the idempotency store is unavailable; the call was not processed")
	}
}

// replay returns the stored response res.
func (cl *call) replay(res []byte) (any, error) {
	r, err := decodeResponse(res)
	if err == nil {
		var m proto.Message
		if m, err = r.message(); err == nil {
			cl.setMetadata(r.header, r.trailer)
			return m, nil
		}
	}
	cl.s.cfg.logger.Error("grpcidem: stored response unreadable",
		"method", cl.method, "key_digest", cl.digest(), "error", cl.redact(err))
	return nil, cl.s.fail(codes.Internal, ReasonRecordUnusable, "the stored response to this key cannot be read")
}

// replayFailure returns the stored failure as the status it was.
func (cl *call) replayFailure(stored *idem.StoredError) error {
	switch code, ok := strings.CutPrefix(stored.Code, statusCodePrefix); {
	case ok:
		c, known := codeByName[code]
		if !known {
			c = codes.Unknown
		}
		cl.setMetadata(nil, nil)
		return status.Error(c, stored.Message)
	case stored.Code == codeNotStored, errors.Is(stored, idem.ErrTooLarge):
		return errNotStoredStatus(cl.s)
	default:
		// A failure that no grpcidem interceptor stored: the key was used
		// by other code.
		cl.s.cfg.logger.Error("grpcidem: the key's stored failure is not a status",
			"method", cl.method, "key_digest", cl.digest(), "code", stored.Code)
		return cl.s.fail(codes.Internal, ReasonRecordUnusable, "the record of this key cannot be used")
	}
}

// setMetadata sets the header (marked replayed) and the trailer of a
// replay. Outside a gRPC server (an interceptor called directly) there is
// nothing to set them on.
func (cl *call) setMetadata(header, trailer metadata.MD) {
	h := metadata.MD{}
	for k, vs := range header {
		h[k] = vs
	}
	h.Set(HeaderReplayed, "true")
	_ = grpc.SetHeader(cl.ctx, h)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(cl.ctx, trailer)
	}
}

func (cl *call) digest() string { return idem.EventKeyDigest(cl.s.cfg.keySecret, cl.key) }

// redact returns err's message without the key, which idem's errors quote:
// logs carry its digest only.
func (cl *call) redact(err error) string {
	return strings.ReplaceAll(err.Error(), strconv.Quote(cl.key), "<key>")
}

func errNotStoredStatus(s *server) error {
	return s.fail(codes.Internal, ReasonNotStored,
		"the call was processed, but its response could not be stored and cannot be replayed")
}

// statusCodePrefix begins the idem code of a stored status: "grpc.NotFound".
const statusCodePrefix = "grpc."

// codeNotStored is the idem code of a response that could not be encoded.
const codeNotStored = "grpcidem.not_stored"

// codeByName maps the names of the status codes to the codes.
var codeByName = func() map[string]codes.Code {
	m := make(map[string]codes.Code, codeCount)
	for c := codes.Code(0); c < codeCount; c++ {
		m[c.String()] = c
	}
	return m
}()

// scopedKey returns the key that idem stores: the scope's length, ':', the
// scope and the key. The length says where the scope ends, so no two
// (scope, key) pairs give one key.
func scopedKey(scope, key string) string {
	return strconv.Itoa(len(scope)) + ":" + scope + key
}

// parseKey checks the key metadata's values and returns the key.
func parseKey(values []string, maxLen int) (string, error) {
	if len(values) > 1 {
		return "", errors.New("is sent more than once")
	}
	v := values[0]
	switch {
	case v == "":
		return "", errors.New("is empty")
	case len(v) > maxLen:
		return "", fmt.Errorf("is longer than %d bytes", maxLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7E {
			return "", errors.New("has a character that is not visible ASCII")
		}
	}
	return v, nil
}

// metadataName checks a metadata key for the key and returns it lowered.
func metadataName(name string) (string, error) {
	n := strings.ToLower(name)
	switch {
	case n == "":
		return "", errors.New("empty")
	case strings.HasPrefix(n, "grpc-"):
		return "", errors.New(`names starting with "grpc-" are reserved`)
	case strings.HasSuffix(n, "-bin"):
		return "", errors.New(`names ending with "-bin" carry binary values`)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", fmt.Errorf("character %q is not allowed in a metadata name", c)
		}
	}
	return n, nil
}

// methodSet checks full method names and returns them as a set.
func methodSet(fullMethods []string) (map[string]bool, error) {
	if len(fullMethods) == 0 {
		return nil, errors.New("needs at least one method")
	}
	m := make(map[string]bool, len(fullMethods))
	for _, fm := range fullMethods {
		if svc, meth, ok := strings.Cut(strings.TrimPrefix(fm, "/"), "/"); !strings.HasPrefix(fm, "/") || !ok || svc == "" || meth == "" || strings.Contains(meth, "/") {
			return nil, fmt.Errorf("%q is not a full method name (/package.Service/Method)", fm)
		}
		m[fm] = true
	}
	return m, nil
}
