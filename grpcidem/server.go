package grpcidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
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

// UnaryServerInterceptor returns an interceptor that runs the handler at
// most once per idempotency key, with c, and replays its response or
// definite error status to retries (see the package documentation). Chain
// it after the interceptors that authenticate the call.
// It panics if c is nil or an option is invalid, as those are programming
// errors.
func UnaryServerInterceptor(c *idem.Client, opts ...Option) grpc.UnaryServerInterceptor {
	cfg := config{
		header:         HeaderIdempotencyKey,
		fingerprint:    DefaultFingerprint,
		retryAfter:     time.Second,
		handlerTimeout: time.Minute,
		logger:         door.Logger(),
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
	if c != nil {
		// The key limit fitted to the Client's (door.FitKeyLen), as in
		// every door: a key the interceptor accepts is one the Client takes.
		var err error
		if cfg.maxKeyLen, err = door.FitKeyLen(c, cfg.maxKeyLen, ""); err != nil {
			cfg.problem("%v", err)
		}
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("grpcidem: invalid options: %s", strings.Join(cfg.problems, "; ")))
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
	// Whether a ledger commit decided the outcome (idem.LedgerDecided),
	// and whether it was the handler's own.
	decided, mine bool
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
	var sctx context.Context
	sctx, cl.capture = captureMetadata(ctx)
	o, ok := cl.detach(sctx, func(ctx context.Context) ([]byte, error) {
		return s.c.Do(ctx, cl.key, fp, func(ctx context.Context) ([]byte, error) {
			return cl.run(ctx, req, handler)
		})
	})
	if !ok {
		// The caller went away or its deadline passed: the handler runs
		// on, and its outcome goes to the retry.
		cl.capture.close()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	cl.capture.close()
	res, err := o.Res, o.Err
	switch {
	case cl.ran && cl.decided && cl.mine && err == nil:
		return cl.answerCommitted(res)
	case cl.ran && (!cl.decided || cl.mine):
		cl.capture.flush()
		return cl.answerOwner(err)
	}
	// The handler did not run here, or its commit met the ledger's row:
	// the answer is the recorded outcome's (what the handler set is
	// dropped).
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
	cl.resp, cl.err = handler(context.WithValue(ctx, callKey{}, cl), req)
	cl.decided, cl.mine = idem.LedgerDecided(ctx)
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
	switch {
	case err == nil:
	case errors.Is(err, idem.ErrParked):
		// A checked step of the handler is parked: nothing is stored,
		// whatever the handler answered; this call gets what every retry
		// gets until an operator resolves the step.
		return nil, cl.answerError(err)
	case errors.Is(err, idem.ErrNotRecorded), errors.Is(err, idem.ErrLeaseLost):
		cl.log(slog.LevelError, "grpcidem: the handler ran but its outcome was not recorded", err)
		return nil, cl.s.fail(codes.Internal, ReasonNotRecorded,
			"the call was processed, but its outcome could not be recorded; a retry may run it again")
	case errors.Is(err, idem.ErrTooLarge):
		cl.log(slog.LevelWarn, "grpcidem: response not stored: larger than the Client's WithMaxResultSize; retries get Internal", err)
	case idem.Code(err) == codeNotStored:
		cl.log(slog.LevelWarn, "grpcidem: response not stored: it cannot be encoded; retries get Internal", err)
	}
	return cl.resp, cl.err
}

// answerCommitted returns the outcome that the handler committed through
// the ledger (res, Recorded's bytes), as its own, not a replay: the
// handler's response and metadata when they are what was committed; else
// (the handler changed them after Recorded, or returned an error) what was
// committed, as every retry will get it.
func (cl *call) answerCommitted(res []byte) (any, error) {
	if b, err := encodeResponse(cl.resp, cl.capture); cl.err == nil && err == nil && bytes.Equal(b, res) {
		cl.capture.flush()
		return cl.answerOwner(nil)
	}
	r, err := decodeResponse(res)
	if err == nil {
		var m proto.Message
		if m, err = r.message(); err == nil {
			cl.log(slog.LevelWarn, "grpcidem: the handler's answer differs from the response it committed (grpcidem.Recorded); the call gets what was committed", cl.err)
			cl.setMetadata(r.header, r.trailer, false)
			return m, nil
		}
	}
	cl.log(slog.LevelError, "grpcidem: the handler committed a value that is not grpcidem.Recorded's; retries get Internal", err)
	cl.capture.flush()
	return cl.answerOwner(nil)
}

// answerError answers a call whose handler did not run here: a stored
// failure is replayed; otherwise the door.Answer of the error, mapped to
// a code and the ErrorInfo reason.
func (cl *call) answerError(err error) error {
	s := cl.s
	var stored *idem.StoredError
	if idem.VerdictOf(err) == idem.VerdictFailure && errors.As(err, &stored) {
		return cl.replayFailure(stored)
	}
	a := door.AnswerOf(err, s.cfg.header)
	if a.Reason == door.Unavailable && cl.ctx.Err() != nil {
		// The caller went away or its deadline passed.
		return status.FromContextError(cl.ctx.Err()).Err()
	}
	if a.Log != "" {
		cl.log(slog.LevelError, "grpcidem: "+a.Log, err)
	}
	if a.Reason.Retryable() {
		return s.retryable(cl.ctx, string(a.Reason), a.Detail)
	}
	return s.fail(codeOf(a.Reason), string(a.Reason), a.Detail)
}

// replay returns the stored response res.
func (cl *call) replay(res []byte) (any, error) {
	r, err := decodeResponse(res)
	if err == nil {
		var m proto.Message
		if m, err = r.message(); err == nil {
			cl.setMetadata(r.header, r.trailer, true)
			return m, nil
		}
	}
	cl.log(slog.LevelError, "grpcidem: stored response unreadable", err)
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
		cl.setMetadata(nil, nil, true)
		return status.Error(c, stored.Message)
	case stored.Code == codeNotStored, errors.Is(stored, idem.ErrTooLarge):
		return errNotStoredStatus(cl.s)
	default:
		// A failure that no grpcidem interceptor stored: the key was used
		// by other code.
		cl.log(slog.LevelError, "grpcidem: the key's stored failure is not a status", nil, slog.String("code", stored.Code))
		return cl.s.fail(codes.Internal, ReasonRecordUnusable, "the record of this key cannot be used")
	}
}

// setMetadata sets the header (marked replayed on a replay) and the
// trailer of a stored response. Outside a gRPC server (an interceptor
// called directly) there is nothing to set them on.
func (cl *call) setMetadata(header, trailer metadata.MD, replayed bool) {
	h := metadata.MD{}
	for k, vs := range header {
		h[k] = vs
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	_ = grpc.SetHeader(cl.ctx, h)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(cl.ctx, trailer)
	}
}

// log logs msg at level with the call's method, its key's digest and err
// (with the key in its message replaced by the digest), as the Client
// names keys in its own logs (idem.Client.LogAttrs).
func (cl *call) log(level slog.Level, msg string, err error, attrs ...slog.Attr) {
	attrs = append(append([]slog.Attr{slog.String("method", cl.method)}, cl.s.c.LogAttrs(cl.key, err)...), attrs...)
	cl.s.cfg.logger.LogAttrs(cl.ctx, level, msg, attrs...)
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

// scopedKey returns the key that idem stores: door.Key's scheme, shared
// by every door.
func scopedKey(scope, key string) string { return door.Key(scope, key) }

// parseKey checks the key metadata's values and returns the key.
func parseKey(values []string, maxLen int) (string, error) { return door.CheckKey(values, maxLen) }

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
