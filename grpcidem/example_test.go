package grpcidem_test

import (
	"context"
	"fmt"
	"net"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// debitService is the example's service, example.Bank, written by hand: a
// generated one (protoc-gen-go-grpc) registers the same way.
var debitService = grpc.ServiceDesc{
	ServiceName: "example.Bank",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Debit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			debit := srv.(func(context.Context, *structpb.Struct) (*wrapperspb.StringValue, error))
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/example.Bank/Debit"}
			return ic(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return debit(ctx, req.(*structpb.Struct))
			})
		},
	}},
}

// A debit service behind the server interceptor, and a client whose
// interceptor sends one key for the operation: the retry gets the first
// response again, marked replayed, and the key reused for another amount
// is refused.
func Example() {
	mr := miniredis.NewMiniRedis() // a real Redis in production
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	keys := idem.New(rdb)
	defer keys.Close()

	debit := func(ctx context.Context, req *structpb.Struct) (*wrapperspb.StringValue, error) {
		a, _ := idem.AttemptFrom(ctx)
		f := req.GetFields()
		fmt.Printf("debiting %v from %s (attempt %d)\n", f["amount"].GetNumberValue(), f["account"].GetStringValue(), a.Number)
		return wrapperspb.String("d-1"), nil
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpcidem.UnaryServerInterceptor(keys)))
	srv.RegisterService(&debitService, debit)
	lis := bufconn.Listen(1 << 20) // a real listener in production
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cc, err := grpc.NewClient("passthrough:///bank",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()

	ctx := grpcidem.NewContext(context.Background(), "") // one key for the operation
	call := func(amount float64) {
		req, _ := structpb.NewStruct(map[string]any{"account": "A", "amount": amount})
		resp := new(wrapperspb.StringValue)
		var header metadata.MD
		if err := cc.Invoke(ctx, "/example.Bank/Debit", req, resp, grpc.Header(&header)); err != nil {
			fmt.Println(status.Code(err), grpcidem.Reason(err))
			return
		}
		fmt.Println(resp.GetValue(), header.Get(grpcidem.HeaderReplayed))
	}
	call(100)
	call(100) // the retry
	call(999) // another debit, same key
	// Output:
	// debiting 100 from A (attempt 1)
	// d-1 []
	// d-1 [true]
	// FailedPrecondition KEY_REUSED
}
