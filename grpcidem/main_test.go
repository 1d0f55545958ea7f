package grpcidem_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the tests with Redis down cause some.
	redis.SetLogger(quietLogger{})
	// Every server, connection and idem.Client of a test must be gone when
	// it ends.
	goleak.VerifyTestMain(m)
}

// backend is one Redis the tests run against, as in the core's tests:
// miniredis, or a real redis-server started for the test.
type backend = idemtest.Backend

// eachBackend runs f against miniredis and against a real redis-server
// (idemtest.EachBackend).
func eachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Helper()
	idemtest.EachBackend(t, f)
}

// newIdem returns an idem.Client of b on a go-redis client of its own, as
// one service instance would have, closed when the test ends; miniredis
// has no CONFIG GET, so idem's warning about it is discarded unless opts
// give a logger.
func newIdem(t testing.TB, b *backend, opts ...idem.Option) *idem.Client {
	t.Helper()
	return b.Idem(t, append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
}

// The test service, idemtest.Bank, written by hand (there is no protoc
// here) with well-known types as messages: Debit and Refund are unary,
// Watch streams from the server.
const (
	methodDebit  = "/idemtest.Bank/Debit"
	methodRefund = "/idemtest.Bank/Refund"
	methodWatch  = "/idemtest.Bank/Watch"
)

// handlerFunc is a unary method's implementation.
type handlerFunc func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)

// bank implements idemtest.Bank with the functions it holds.
type bank struct {
	debit, refund handlerFunc
	watchRuns     atomic.Int64
}

// bankServer is the service's handler type, for grpc.ServiceDesc.
type bankServer interface{ isBank() }

func (*bank) isBank() {}

func unary(name string, impl func(*bank) handlerFunc) grpc.MethodDesc {
	full := "/idemtest.Bank/" + name
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return impl(srv.(*bank))(ctx, req.(*structpb.Struct))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		},
	}
}

var bankDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Bank",
	HandlerType: (*bankServer)(nil),
	Methods: []grpc.MethodDesc{
		unary("Debit", func(b *bank) handlerFunc { return b.debit }),
		unary("Refund", func(b *bank) handlerFunc { return b.refund }),
	},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			b := srv.(*bank)
			in := new(structpb.Struct)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			n := b.watchRuns.Add(1)
			for i := range 2 {
				if err := stream.SendMsg(mustStruct(map[string]any{"run": n, "i": i})); err != nil {
					return err
				}
			}
			return nil
		},
	}},
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

// counter is a handler's count of its runs.
type counter struct{ n atomic.Int64 }

func (c *counter) runs() int64 { return c.n.Load() }

// debit is the handler most tests use: it counts its runs, sets a header
// and a trailer, and answers with the run, the attempt, the idempotency
// key it saw and the request's amount.
func (c *counter) debit() handlerFunc {
	return func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		n := c.n.Add(1)
		a, _ := idem.AttemptFrom(ctx)
		if err := grpc.SetHeader(ctx, metadata.Pairs("x-run", strconv.FormatInt(n, 10))); err != nil {
			return nil, err
		}
		if err := grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t", "x-data-bin", "\x00\xff")); err != nil {
			return nil, err
		}
		return mustStruct(map[string]any{
			"run":     n,
			"attempt": a.Number,
			"key":     a.Key,
			"amount":  req.GetFields()["amount"].GetNumberValue(),
		}), nil
	}
}

// serve starts a gRPC server for b on a loopback port with the unary
// interceptors, stopped when the test ends, and returns its address.
func serve(t testing.TB, b *bank, interceptors ...grpc.UnaryServerInterceptor) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, b, interceptors...)
}

func serveOn(t testing.TB, ln net.Listener, b *bank, interceptors ...grpc.UnaryServerInterceptor) string {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	srv.RegisterService(&bankDesc, b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return ln.Addr().String()
}

// dial returns a client connection to addr, closed when the test ends.
func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// answer is what a client got from one call.
type answer struct {
	resp            *structpb.Struct
	header, trailer metadata.MD
	err             error
}

func (a answer) replayed() bool {
	v := a.header.Get(grpcidem.HeaderReplayed)
	return len(v) == 1 && v[0] == "true"
}

// field returns a number field of the response.
func (a answer) field(name string) float64 { return a.resp.GetFields()[name].GetNumberValue() }

// invoke calls method on cc with key (none if "") and the request
// {"amount": amount}, with a 30s deadline.
func invoke(cc *grpc.ClientConn, method, key string, amount float64, opts ...grpc.CallOption) answer {
	return invokeCtx(context.Background(), cc, method, key, mustStruct(map[string]any{"amount": amount}), opts...)
}

func invokeCtx(ctx context.Context, cc *grpc.ClientConn, method, key string, req *structpb.Struct, opts ...grpc.CallOption) answer {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.HeaderIdempotencyKey, key)
	}
	var a answer
	a.resp = new(structpb.Struct)
	opts = append(opts, grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	a.err = cc.Invoke(ctx, method, req, a.resp, opts...)
	return a
}

// recv receives from ch, or fails the test after 30 seconds: a test that
// fails does not hang.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing received in 30s")
		panic("unreachable")
	}
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}
