package grpcidem

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem/door"
	"google.golang.org/grpc/codes"
)

// An Option configures the server interceptor. Pass options to
// UnaryServerInterceptor.
type Option func(*config)

type config struct {
	header         string
	methods        map[string]bool // nil: every unary method
	required       bool
	scope          func(context.Context) (string, error)
	fingerprint    func(context.Context, string, any) (string, error)
	definite       [codeCount]bool
	maxKeyLen      int
	retryAfter     time.Duration
	handlerTimeout time.Duration
	logger         *slog.Logger
	problems       []string
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
// InvalidArgument (ReasonKeyInvalid). It must be between 1 and 65536, and
// fit the Client's idem.WithMaxKeyLen after the scope's length prefix
// (door.FitKeyLen): UnaryServerInterceptor panics otherwise.
// The default is 255, or what the Client's limit leaves, if less.
func WithMaxKeyLen(n int) Option {
	return func(c *config) {
		if n < 1 || n > 1<<16 {
			c.problem("WithMaxKeyLen(%d): must be between 1 and 65536", n)
			return
		}
		c.maxKeyLen = n
	}
}

// WithHandlerTimeout bounds the handler's run: its context keeps the
// call's values (metadata, the Attempt) but not its cancellation or
// deadline, so that a client whose deadline passes or that goes away does
// not cancel the handler, whose outcome is stored for the retry; the
// handler's context ends d after it started (or when idem's lease is
// lost). d must be positive.
// The default is 1 minute.
func WithHandlerTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.problem("WithHandlerTimeout(%v): must be positive", d)
			return
		}
		c.handlerTimeout = d
	}
}

// WithRetryAfter sets the delay that Unavailable answers (in progress,
// Redis unavailable) ask the client to wait before it retries, in their
// RetryInfo detail and their grpc-retry-pushback-ms trailer: a guess at
// when a retry may find the first call finished, not its lease's end. It
// must be a positive whole number of seconds, as in every door
// (door.CheckRetryAfter).
// The default is 1 second.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if err := door.CheckRetryAfter(d); err != nil {
			c.problem("%v", err)
			return
		}
		c.retryAfter = d
	}
}

// WithLogger sets the logger for what the interceptor notices on its own:
// responses not stored, outcomes not recorded, Redis failures, unreadable
// records. Records carry the method and name the key by its digest, as the
// Client's own records do (idem.Client.LogAttrs: the Client's
// WithEventKeySecret and WithRawEventKeys apply). A nil logger discards.
// The default is slog.Default(), as it is when a record is logged.
func WithLogger(l *slog.Logger) Option {
	// Resolved here, not in the closure: one Option may be shared by
	// many New calls at once, and must not write what they read.
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return func(c *config) { c.logger = l }
}
