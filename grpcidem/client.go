package grpcidem

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A ClientOption configures the client interceptor. Pass options to
// UnaryClientInterceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	header   string
	methods  map[string]bool // nil: every unary method
	newKey   func() string
	problems []string
}

func (c *clientConfig) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// WithClientHeader sets the name of the request metadata that carries the
// key, as WithHeader does for the server.
// The default is "idempotency-key" (HeaderIdempotencyKey).
func WithClientHeader(name string) ClientOption {
	return func(c *clientConfig) {
		n, err := metadataName(name)
		if err != nil {
			c.problem("WithClientHeader(%q): %v", name, err)
			return
		}
		c.header = n
	}
}

// WithClientMethods sets the unary methods that get a key, by full name
// ("/package.Service/Method"); calls of other methods pass through
// untouched.
// The default is every unary method.
func WithClientMethods(fullMethods ...string) ClientOption {
	return func(c *clientConfig) {
		m, err := methodSet(fullMethods)
		if err != nil {
			c.problem("WithClientMethods: %v", err)
			return
		}
		c.methods = m
	}
}

// WithKeyGenerator sets the function that makes a new key. Its keys must
// be unique across the clients of a service (and scope), and valid: 1 to
// 255 visible ASCII characters by default.
// The default is a random UUID (version 4), such as
// "6f1c2a3e-9b7d-4e8f-a1c2-3d4e5f6a7b8c".
func WithKeyGenerator(newKey func() string) ClientOption {
	return func(c *clientConfig) {
		if newKey == nil {
			c.problem("WithKeyGenerator(nil)")
			return
		}
		c.newKey = newKey
	}
}

// UnaryClientInterceptor returns an interceptor that sends an idempotency
// key with every call of the methods it handles, one key per logical
// call:
//
//   - a key the caller set in the outgoing metadata is kept;
//   - else, the key of a context made by NewContext: given there, or made
//     at the context's first call and reused by every later call with it,
//     so that the caller's own retries carry one key;
//   - else, a new key for the call.
//
// The key is set once per call, before gRPC's retry policy (and its
// transparent retries) resend it: every attempt of one call carries the
// same key. It panics if an option is invalid, as that is a programming
// error.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	cfg := clientConfig{header: HeaderIdempotencyKey, newKey: newUUID}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("grpcidem: invalid client options: %s", strings.Join(cfg.problems, "; ")))
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if cfg.methods != nil && !cfg.methods[method] {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(cfg.header)) > 0 {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		var key string
		if s, ok := ctx.Value(slotKey{}).(*slot); ok {
			key = s.get(cfg.newKey)
		} else {
			key = cfg.newKey()
		}
		ctx = metadata.AppendToOutgoingContext(ctx, cfg.header, key)
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// slot holds the key of a context made by NewContext.
type slot struct {
	mu  sync.Mutex
	key string // guarded by mu; "" until the first call
}

type slotKey struct{}

// get returns the slot's key, made with newKey if it has none yet.
func (s *slot) get(newKey func() string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key == "" {
		s.key = newKey()
	}
	return s.key
}

// NewContext returns a context for the calls of one logical operation:
// every call made with it through UnaryClientInterceptor carries key, or,
// when key is "", the key made at its first call. Make one per operation
// and retry with it:
//
//	ctx := grpcidem.NewContext(ctx, "")
//	for try := 0; try < 3; try++ {
//		resp, err = bank.Debit(ctx, req) // one key for every try
//		...
//	}
func NewContext(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, slotKey{}, &slot{key: key})
}

// FromContext returns the key of a context made by NewContext: the key
// given to it, or the one made at its first call. It reports false when
// ctx has no key yet.
func FromContext(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(slotKey{}).(*slot)
	if !ok {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key, s.key != ""
}

// newUUID returns a random UUID, version 4 (RFC 9562).
func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails (crypto/rand documents it)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hex[c>>4], hex[c&0x0f]
		j += 2
	}
	return string(b[:])
}
