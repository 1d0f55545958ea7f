package grpcidem

import (
	"fmt"
	"strings"

	"github.com/idem-go/idem/door"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// StreamServerInterceptor returns an interceptor that refuses a streaming
// RPC carrying an idempotency key (the metadata of WithHeader) with
// InvalidArgument and ReasonKeyInvalid, naming why, without running its
// handler: a stream carries many messages whose outcome cannot be stored
// and replayed as one response, so a key on it would promise what no
// interceptor can keep. Streams without a key pass through. Chain it
// beside UnaryServerInterceptor (grpc.ChainStreamInterceptor) so that a
// client that sends a key on a stream learns it at once instead of
// retrying a stream it believes idempotent. Of the options only
// WithHeader applies; it panics if an option is invalid.
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	cfg := config{header: HeaderIdempotencyKey}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.problems) > 0 {
		panic(fmt.Sprintf("grpcidem: invalid options: %s", strings.Join(cfg.problems, "; ")))
	}
	s := &server{cfg: cfg}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if len(md.Get(cfg.header)) == 0 {
			return handler(srv, ss)
		}
		return s.fail(codes.InvalidArgument, string(door.KeyInvalid),
			"the "+cfg.header+" metadata is not supported on streaming RPCs ("+info.FullMethod+
				"): a stream's outcome cannot be stored and replayed; the stream was not run")
	}
}
