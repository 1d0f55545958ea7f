package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/redistest"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// wantStatus checks an answer that the interceptor made itself: its code,
// its ErrorInfo reason, and that it is not marked replayed.
func wantStatus(t *testing.T, a answer, code codes.Code, reason string) {
	t.Helper()
	if got := status.Code(a.err); got != code {
		t.Errorf("code %v (%v), want %v", got, a.err, code)
	}
	if got := grpcidem.Reason(a.err); got != reason {
		t.Errorf("reason %q, want %q (%v)", got, reason, a.err)
	}
	if a.replayed() {
		t.Errorf("an answer of the interceptor's is marked replayed")
	}
	if msg := status.Convert(a.err).Message(); msg == "" {
		t.Errorf("status without a message")
	}
}

// retryDelay returns the RetryInfo delay of err's status, or -1.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

// A retry gets the first response again: the same message, decoded into
// the method's response type, the header and trailer the handler set, and
// idempotent-replayed: true.
func TestReplay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		addr := serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		cc := dial(t, addr)

		first := invoke(cc, methodDebit, "k-1", 100)
		if first.err != nil || first.replayed() {
			t.Fatalf("first: %v, replayed %v", first.err, first.replayed())
		}
		if first.field("run") != 1 || first.field("attempt") != 1 || first.field("amount") != 100 {
			t.Errorf("first response %v", first.resp)
		}
		if got := first.resp.GetFields()["key"].GetStringValue(); got != "0:k-1" {
			t.Errorf("the handler's Attempt.Key %q, want 0:k-1 (no scope)", got)
		}
		retry := invoke(cc, methodDebit, "k-1", 100)
		if retry.err != nil || !retry.replayed() {
			t.Fatalf("retry: %v, replayed %v", retry.err, retry.replayed())
		}
		if !proto.Equal(retry.resp, first.resp) {
			t.Errorf("retry %v, want %v", retry.resp, first.resp)
		}
		for _, k := range []string{"x-run"} {
			if got, want := retry.header.Get(k), first.header.Get(k); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
				t.Errorf("header %s: retry %q, first %q", k, got, want)
			}
		}
		for _, k := range []string{"x-trailer", "x-data-bin"} {
			if got, want := retry.trailer.Get(k), first.trailer.Get(k); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
				t.Errorf("trailer %s: retry %q, first %q", k, got, want)
			}
		}
		if other := invoke(cc, methodDebit, "k-2", 100); other.err != nil || other.replayed() || other.field("run") != 2 {
			t.Errorf("another key: %v, replayed %v, %v", other.err, other.replayed(), other.resp)
		}
		if got := c.runs(); got != 2 {
			t.Errorf("handler ran %d times for two keys, want 2", got)
		}
	})
}

// The replay is decoded into the method's response type, whatever process
// stored it: the interceptor is called directly here, outside a server,
// and gets the concrete type the handler returned.
func TestReplayType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ic := grpcidem.UnaryServerInterceptor(newIdem(t, b))
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcidem.HeaderIdempotencyKey, "typed"))
		info := &grpc.UnaryServerInfo{FullMethod: methodDebit}
		var runs int
		h := func(ctx context.Context, req any) (any, error) {
			runs++
			return structpb.NewStringValue("hello"), nil
		}
		req := mustStruct(map[string]any{"amount": 1})
		for i := range 2 {
			resp, err := ic(ctx, req, info, h)
			if err != nil {
				t.Fatal(err)
			}
			v, ok := resp.(*structpb.Value)
			if !ok || v.GetStringValue() != "hello" {
				t.Errorf("call %d: %T %v, want *structpb.Value hello", i, resp, resp)
			}
		}
		if runs != 1 {
			t.Errorf("handler ran %d times, want 1", runs)
		}
	})
}

// 30 duplicates at once, on connections of their own to three service
// instances (each with its own idem.Client) that share the Redis: the
// handler runs once and every client gets its one response.
func TestConcurrentDuplicates(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		const n = 30
		var c counter
		var arrived atomic.Int64
		all := make(chan struct{})
		var once sync.Once
		inner := c.debit()
		// The handler holds its response until every duplicate has reached
		// a server (or for 10s), so that they all overlap it.
		slow := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			select {
			case <-all:
			case <-time.After(10 * time.Second):
			}
			return inner(ctx, req)
		}
		count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if arrived.Add(1) == n {
				once.Do(func() { close(all) })
			}
			return h(ctx, req)
		}
		var addrs []string
		for range 3 {
			ic := grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithWait(20*time.Second)))
			addrs = append(addrs, serve(t, &bank{debit: slow}, count, ic))
		}
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			cc := dial(t, addrs[i%3]) // a connection of its own
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = invoke(cc, methodDebit, "dup", 5)
			}()
		}
		wg.Wait()
		replays := 0
		for i, a := range answers {
			if a.err != nil {
				t.Fatalf("call %d: %v", i, a.err)
			}
			if !proto.Equal(a.resp, answers[0].resp) || a.field("run") != 1 {
				t.Errorf("call %d: %v, want %v from run 1", i, a.resp, answers[0].resp)
			}
			if a.replayed() {
				replays++
			}
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if replays != n-1 {
			t.Errorf("%d replays, want %d (all but the first)", replays, n-1)
		}
	})
}

// conns is a listener that keeps the connections it accepted, so that a
// test can drop them.
type conns struct {
	net.Listener
	mu  sync.Mutex
	all []net.Conn
}

func (l *conns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.all = append(l.all, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *conns) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.all {
		_ = c.Close()
	}
}

// The connection drops after the handler ran and before its response
// went out: the client gets an error, and its retry gets the stored
// response; the handler ran once.
func TestLostResponse(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		ran := make(chan struct{})
		goOn := make(chan struct{})
		var first atomic.Bool
		first.Store(true)
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			resp, err := inner(ctx, req)
			if first.Swap(false) {
				close(ran)
				<-goOn // the connection is dropped meanwhile
			}
			return resp, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lossy := &conns{Listener: ln}
		keys := newIdem(t, b)
		addr := serveOn(t, lossy, &bank{debit: h}, grpcidem.UnaryServerInterceptor(keys))

		res := make(chan answer, 1)
		go func() { res <- invoke(dial(t, addr), methodDebit, "lost-1", 7) }()
		<-ran
		lossy.drop()
		if a := recv(t, res); a.err == nil {
			t.Fatalf("first call got %v, want an error (its connection dropped)", a.resp)
		}
		close(goOn)
		// The handler returns its response now, to nobody; its outcome is
		// stored all the same.
		waitState(t, keys, "0:lost-1", idem.StateDone)

		retry := invoke(dial(t, addr), methodDebit, "lost-1", 7)
		if retry.err != nil || !retry.replayed() {
			t.Fatalf("retry: %v, replayed %v", retry.err, retry.replayed())
		}
		if retry.field("run") != 1 || retry.field("amount") != 7 {
			t.Errorf("retry %v, want the first run's response", retry.resp)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// waitState waits (up to 30s) until key's record is in state want.
func waitState(t *testing.T, c *idem.Client, key string, want idem.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.Status(context.Background(), key)
		if err == nil && st.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q: %v %v after 30s, want %v", key, st.State, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// blocking returns a handler that signals started, then waits for release
// before it runs inner.
func blocking(inner handlerFunc) (h handlerFunc, started chan struct{}, release chan struct{}) {
	started = make(chan struct{}, 8)
	release = make(chan struct{})
	h = func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		started <- struct{}{}
		<-release
		return inner(ctx, req)
	}
	return h, started, release
}

// The key reused with another request, or for another method, is refused,
// both while the first call runs and after it is done, and the handler
// does not run for it.
func TestKeyReused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		h, started, release := blocking(c.debit())
		addr := serve(t, &bank{debit: h, refund: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		cc := dial(t, addr)
		first := make(chan answer, 1)
		go func() { first <- invoke(cc, methodDebit, "reuse", 100) }()
		recv(t, started)
		wantStatus(t, invoke(cc, methodDebit, "reuse", 999), codes.FailedPrecondition, grpcidem.ReasonKeyReused)
		wantStatus(t, invoke(cc, methodRefund, "reuse", 100), codes.FailedPrecondition, grpcidem.ReasonKeyReused)
		close(release)
		if a := recv(t, first); a.err != nil {
			t.Fatalf("first: %v", a.err)
		}
		wantStatus(t, invoke(cc, methodDebit, "reuse", 999), codes.FailedPrecondition, grpcidem.ReasonKeyReused)
		wantStatus(t, invoke(cc, methodRefund, "reuse", 100), codes.FailedPrecondition, grpcidem.ReasonKeyReused)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// Maps are encoded in a fixed order for the fingerprint: a Struct with its
// fields set in another order is the same request.
func TestFingerprintIgnoresMapOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		fields := []string{"amount", "account", "memo", "currency", "z", "a"}
		for i := range 5 {
			// A map built in another order each time: Go's map order varies,
			// and so would a non-deterministic encoding.
			m := map[string]any{}
			for j := range fields {
				f := fields[(i+j)%len(fields)]
				m[f] = f
			}
			m["amount"] = 3.0
			a := invokeCtx(context.Background(), cc, methodDebit, "maps", mustStruct(m))
			if a.err != nil {
				t.Fatalf("call %d: %v", i, a.err)
			}
			if i > 0 && !a.replayed() {
				t.Errorf("call %d not replayed", i)
			}
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// While the first call runs, a duplicate that waited the Client's WithWait
// gets Unavailable, retryable after WithRetryAfter; once it is done, the
// response.
func TestInProgress(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		h, started, release := blocking(c.debit())
		// Two instances, so that the duplicate asks Redis (not only the
		// first call's flight in its process).
		addr1 := serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		addr2 := serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithWait(50*time.Millisecond)),
			grpcidem.WithRetryAfter(2*time.Second)))
		first := make(chan answer, 1)
		go func() { first <- invoke(dial(t, addr1), methodDebit, "busy", 1) }()
		recv(t, started)
		cc := dial(t, addr2)
		a := invoke(cc, methodDebit, "busy", 1)
		wantStatus(t, a, codes.Unavailable, grpcidem.ReasonInProgress)
		if got := retryDelay(a.err); got != 2*time.Second {
			t.Errorf("RetryInfo delay %v, want 2s", got)
		}
		if got := a.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "2000" {
			t.Errorf("pushback trailer %q, want 2000", got)
		}
		close(release)
		f := recv(t, first)
		if f.err != nil {
			t.Fatalf("first: %v", f.err)
		}
		again := invoke(cc, methodDebit, "busy", 1)
		if again.err != nil || !again.replayed() || !proto.Equal(again.resp, f.resp) {
			t.Errorf("after: %v replayed %v %v, want the first response replayed", again.err, again.replayed(), again.resp)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

func TestBadKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		addr := serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithMaxKeyLen(20)))
		// A Client whose own key limit the scoped key outgrows.
		short := serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithMaxKeyLen(10))))
		cc := dial(t, addr)
		for _, key := range []string{"with space", strings.Repeat("k", 21)} {
			t.Run(key, func(t *testing.T) {
				wantStatus(t, invoke(cc, methodDebit, key, 1), codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
			})
		}
		// Keys that gRPC's client refuses to send, given to the
		// interceptor directly.
		ic := grpcidem.UnaryServerInterceptor(newIdem(t, b))
		for _, key := range []string{"tab\there", "caf\u00e9", "nul\x00"} {
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcidem.HeaderIdempotencyKey, key))
			_, err := ic(ctx, mustStruct(nil), &grpc.UnaryServerInfo{FullMethod: methodDebit}, func(context.Context, any) (any, error) {
				t.Errorf("key %q: the handler ran", key)
				return mustStruct(nil), nil
			})
			wantStatus(t, answer{err: err}, codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
		}
		t.Run("empty", func(t *testing.T) {
			ctx := metadata.AppendToOutgoingContext(context.Background(), grpcidem.HeaderIdempotencyKey, "")
			wantStatus(t, invokeCtx(ctx, cc, methodDebit, "", mustStruct(nil)), codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
		})
		t.Run("twice", func(t *testing.T) {
			ctx := metadata.AppendToOutgoingContext(context.Background(), grpcidem.HeaderIdempotencyKey, "a")
			wantStatus(t, invokeCtx(ctx, cc, methodDebit, "b", mustStruct(nil)), codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
		})
		t.Run("too long for the Client", func(t *testing.T) {
			wantStatus(t, invoke(dial(t, short), methodDebit, "abcdefghij", 1), codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
		})
		// The longest key and every visible character are fine.
		for _, key := range []string{strings.Repeat("k", 20), "!\"#$%&'()*+,-./:;<=>", "?@[\\]^_`{|}~AZaz09"} {
			if a := invoke(cc, methodDebit, key, 1); a.err != nil {
				t.Errorf("key %q: %v", key, a.err)
			}
		}
		if got := c.runs(); got != 3 {
			t.Errorf("handler ran %d times, want 3 (for the good keys only)", got)
		}
	})
}

// Under WithRequired a call without a key is refused; methods outside
// WithMethods pass through untouched, key or not.
func TestRequiredAndMethods(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var debits, refunds counter
		addr := serve(t, &bank{debit: debits.debit(), refund: refunds.debit()},
			grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithRequired(), grpcidem.WithMethods(methodDebit)))
		cc := dial(t, addr)
		wantStatus(t, invoke(cc, methodDebit, "", 1), codes.InvalidArgument, grpcidem.ReasonKeyMissing)
		if got := debits.runs(); got != 0 {
			t.Errorf("handler ran %d times without a key, want 0", got)
		}
		for range 2 {
			if a := invoke(cc, methodRefund, "same", 1); a.err != nil || a.replayed() {
				t.Errorf("refund: %v, replayed %v", a.err, a.replayed())
			}
			if a := invoke(cc, methodRefund, "", 1); a.err != nil {
				t.Errorf("refund without key: %v", a.err)
			}
		}
		if got := refunds.runs(); got != 4 {
			t.Errorf("refund ran %d times, want 4 (not handled)", got)
		}
		// Without WithRequired, a call without a key passes through.
		addr2 := serve(t, &bank{debit: debits.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		cc2 := dial(t, addr2)
		for range 2 {
			if a := invoke(cc2, methodDebit, "", 1); a.err != nil || a.replayed() {
				t.Errorf("no key: %v, replayed %v", a.err, a.replayed())
			}
		}
		if got := debits.runs(); got != 2 {
			t.Errorf("handler ran %d times for two calls without a key, want 2", got)
		}
	})
}

// A definite error status is stored and replayed with its code and
// message; a transient one releases the key, and the retry runs the
// handler again as attempt 2; an error marked idem.Permanent is stored
// whatever its code.
func TestErrorStatuses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int64
		var c counter
		ok := c.debit()
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			runs.Add(1)
			a, _ := idem.AttemptFrom(ctx)
			switch req.GetFields()["case"].GetStringValue() {
			case "definite":
				st, _ := status.New(codes.NotFound, "no account A").WithDetails(&errdetails.BadRequest{})
				return nil, st.Err()
			case "transient":
				if a.Number == 1 {
					return nil, status.Error(codes.Unavailable, "bank down")
				}
			case "plain":
				return nil, errors.New("plain error") // Unknown: transient
			case "permanent":
				return nil, idem.Permanent(errors.New("card declined"))
			case "permanent-status":
				return nil, idem.Permanent(status.Error(codes.Aborted, "given up"))
			}
			return ok(ctx, req)
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		call := func(key, kase string) answer {
			return invokeCtx(context.Background(), cc, methodDebit, key, mustStruct(map[string]any{"case": kase}))
		}
		for _, tc := range []struct {
			kase string
			code codes.Code
			msg  string
		}{
			{"definite", codes.NotFound, "no account A"},
			{"permanent", codes.Unknown, "card declined"},
			{"permanent-status", codes.Aborted, "rpc error: code = Aborted desc = given up"},
		} {
			t.Run(tc.kase, func(t *testing.T) {
				before := runs.Load()
				first := call(tc.kase, tc.kase)
				if st := status.Convert(first.err); st.Code() != tc.code || st.Message() != tc.msg || first.replayed() {
					t.Errorf("first: %v, replayed %v; want %v %q", first.err, first.replayed(), tc.code, tc.msg)
				}
				retry := call(tc.kase, tc.kase)
				if st := status.Convert(retry.err); st.Code() != tc.code || st.Message() != tc.msg || !retry.replayed() {
					t.Errorf("retry: %v, replayed %v; want %v %q replayed", retry.err, retry.replayed(), tc.code, tc.msg)
				}
				if grpcidem.Reason(retry.err) != "" {
					t.Errorf("a replayed handler status carries the reason %q", grpcidem.Reason(retry.err))
				}
				if got := runs.Load() - before; got != 1 {
					t.Errorf("handler ran %d times, want 1", got)
				}
			})
		}
		t.Run("transient", func(t *testing.T) {
			first := call("transient", "transient")
			if status.Code(first.err) != codes.Unavailable || first.replayed() {
				t.Errorf("first: %v, want the handler's Unavailable", first.err)
			}
			second := call("transient", "transient")
			if second.err != nil || second.replayed() || second.field("attempt") != 2 {
				t.Errorf("second: %v replayed %v %v, want a new run as attempt 2", second.err, second.replayed(), second.resp)
			}
			third := call("transient", "transient")
			if third.err != nil || !third.replayed() || !proto.Equal(third.resp, second.resp) {
				t.Errorf("third: %v replayed %v, want the second replayed", third.err, third.replayed())
			}
		})
		t.Run("unknown", func(t *testing.T) {
			before := runs.Load()
			for range 2 {
				if a := call("plain", "plain"); status.Code(a.err) != codes.Unknown || a.replayed() {
					t.Errorf("plain error: %v replayed %v", a.err, a.replayed())
				}
			}
			if got := runs.Load() - before; got != 2 {
				t.Errorf("handler ran %d times, want 2 (Unknown is transient)", got)
			}
		})
	})
}

// WithDefiniteCodes replaces the codes that are stored.
func TestWithDefiniteCodes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			runs.Add(1)
			if req.GetFields()["amount"].GetNumberValue() == 1 {
				return nil, status.Error(codes.ResourceExhausted, "over the limit")
			}
			return nil, status.Error(codes.NotFound, "no such account")
		}
		cc := dial(t, serve(t, &bank{debit: h},
			grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithDefiniteCodes(codes.ResourceExhausted))))
		for range 2 {
			invoke(cc, methodDebit, "exhausted", 1)
			invoke(cc, methodDebit, "notfound", 2)
		}
		if a := invoke(cc, methodDebit, "exhausted", 1); status.Code(a.err) != codes.ResourceExhausted || !a.replayed() {
			t.Errorf("ResourceExhausted: %v replayed %v, want it stored", a.err, a.replayed())
		}
		if got := runs.Load(); got != 1+2 {
			t.Errorf("handler ran %d times, want 3 (once for the stored code, twice for NotFound)", got)
		}
	})
}

// scopeErr is a scope error that carries its own status.
type scopeErr struct{}

func (scopeErr) Error() string { return "not allowed here" }
func (scopeErr) GRPCStatus() *status.Status {
	return status.New(codes.PermissionDenied, "not allowed here")
}

// One principal's key never replays another principal's response.
func TestScope(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		scope := func(ctx context.Context) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			switch u := md.Get("x-user"); {
			case len(u) == 0:
				return "", errors.New("no user")
			case u[0] == "mallory":
				return "", fmt.Errorf("user mallory: %w", scopeErr{})
			default:
				return u[0], nil
			}
		}
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithScope(scope))))
		as := func(user, key string, amount float64) answer {
			ctx := context.Background()
			if user != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-user", user)
			}
			return invokeCtx(ctx, cc, methodDebit, key, mustStruct(map[string]any{"amount": amount}))
		}
		alice := as("alice", "k", 1)
		bob := as("bob", "k", 2)
		if bob.err != nil || bob.replayed() || bob.field("run") == alice.field("run") {
			t.Errorf("bob with alice's key: %v replayed %v %v; want his own run", bob.err, bob.replayed(), bob.resp)
		}
		if got := bob.resp.GetFields()["key"].GetStringValue(); got != "3:bobk" {
			t.Errorf("bob's Attempt.Key %q, want 3:bobk", got)
		}
		if a := as("alice", "k", 1); !a.replayed() || !proto.Equal(a.resp, alice.resp) {
			t.Errorf("alice's retry: replayed %v %v, want %v", a.replayed(), a.resp, alice.resp)
		}
		// Scope "ab" with key "c", and scope "a" with key "bc", are apart.
		abc := as("ab", "c", 0)
		if a := as("a", "bc", 0); a.replayed() || a.field("run") == abc.field("run") {
			t.Errorf("scope a, key bc replayed scope ab, key c: %v", a.resp)
		}
		wantStatus(t, as("", "k", 1), codes.Unauthenticated, grpcidem.ReasonScope)
		if a := as("mallory", "k", 1); status.Code(a.err) != codes.PermissionDenied {
			t.Errorf("mallory: %v, want the scope error's own PermissionDenied", a.err)
		}
		if got := c.runs(); got != 4 {
			t.Errorf("handler ran %d times, want 4", got)
		}
	})
}

// A fingerprint function that fails refuses the call; its own status
// wins.
func TestFingerprintOption(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		fp := func(ctx context.Context, method string, req any) (string, error) {
			switch req.(*structpb.Struct).GetFields()["amount"].GetNumberValue() {
			case -1:
				return "", errors.New("negative amount")
			case -2:
				return "", status.Error(codes.OutOfRange, "way out")
			}
			return "same", nil // every request is the same one
		}
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithFingerprint(fp))))
		wantStatus(t, invoke(cc, methodDebit, "f", -1), codes.InvalidArgument, grpcidem.ReasonBadRequest)
		if a := invoke(cc, methodDebit, "f", -2); status.Code(a.err) != codes.OutOfRange {
			t.Errorf("fingerprint's own status: %v, want OutOfRange", a.err)
		}
		invoke(cc, methodDebit, "f", 1)
		if a := invoke(cc, methodDebit, "f", 2); !a.replayed() || a.field("amount") != 1 {
			t.Errorf("same fingerprint: replayed %v %v, want the first replayed", a.replayed(), a.resp)
		}
	})
}

// Streaming calls pass through the server untouched: the handler runs for
// every call, key or not, even under WithRequired.
func TestStreamsPassThrough(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		bk := &bank{}
		cc := dial(t, serve(t, bk, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithRequired())),
			grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
		desc := &bankDesc.Streams[0]
		for i, key := range []string{"s", "s", ""} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.HeaderIdempotencyKey, key)
			}
			st, err := cc.NewStream(ctx, desc, methodWatch)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(mustStruct(nil)); err != nil {
				t.Fatal(err)
			}
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var got []float64
			for {
				m := new(structpb.Struct)
				if err := st.RecvMsg(m); err != nil {
					break
				}
				got = append(got, m.GetFields()["run"].GetNumberValue())
			}
			h, _ := st.Header()
			cancel()
			if len(got) != 2 || got[0] != float64(i+1) || len(h.Get(grpcidem.HeaderReplayed)) != 0 {
				t.Errorf("stream %d: runs %v, header %v; want 2 messages of run %d, not replayed", i, got, h, i+1)
			}
		}
		if got := bk.watchRuns.Load(); got != 3 {
			t.Errorf("stream handler ran %d times, want 3", got)
		}
	})
}

// A handler's panic releases the key and goes on (to a recovering
// interceptor here); the retry runs the handler again, as attempt 2.
func TestPanic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var calls atomic.Int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			if calls.Add(1) == 1 {
				panic("boom")
			}
			return inner(ctx, req)
		}
		var recovered atomic.Value
		recoverer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer func() {
				if p := recover(); p != nil {
					recovered.Store(p)
					err = status.Errorf(codes.Internal, "panic: %v", p)
				}
			}()
			return h(ctx, req)
		}
		cc := dial(t, serve(t, &bank{debit: h}, recoverer, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		if a := invoke(cc, methodDebit, "panic", 1); status.Code(a.err) != codes.Internal {
			t.Fatalf("first: %v, want the recoverer's Internal", a.err)
		}
		if p := recovered.Load(); p != "boom" {
			t.Errorf("the panic reached the recoverer as %v, want boom", p)
		}
		a := invoke(cc, methodDebit, "panic", 1)
		if a.err != nil || a.replayed() || a.field("attempt") != 2 {
			t.Errorf("retry: %v replayed %v %v, want a new run as attempt 2", a.err, a.replayed(), a.resp)
		}
	})
}

func TestRedisDown(t *testing.T) {
	b := &backend{Addr: redistest.RefusedAddr(t)}
	var c counter
	var logs syncBuffer
	cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b),
		grpcidem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))))
	a := invoke(cc, methodDebit, "secret-key-42", 1)
	wantStatus(t, a, codes.Unavailable, grpcidem.ReasonUnavailable)
	if got := retryDelay(a.err); got != time.Second {
		t.Errorf("RetryInfo delay %v, want 1s", got)
	}
	if got := c.runs(); got != 0 {
		t.Errorf("handler ran %d times without Redis, want 0", got)
	}
	if l := logs.String(); !strings.Contains(l, "cannot reach") || !strings.Contains(l, "key_digest=") || strings.Contains(l, "secret-key-42") {
		t.Errorf("log does not name the failure with the key's digest only: %s", l)
	}
}

// Without WithLogger, the interceptor logs to slog.Default() as the Client
// does, so an outage shows without configuration: an unreachable Redis is
// ErrUnavailable, logged with the key's digest only.
func TestRedisDownLogsToSlogDefault(t *testing.T) {
	b := &backend{Addr: redistest.RefusedAddr(t)}
	var logs syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	cc := dial(t, serve(t, &bank{}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
	a := invoke(cc, methodDebit, "secret-key-43", 1)
	wantStatus(t, a, codes.Unavailable, grpcidem.ReasonUnavailable)
	if l := logs.String(); !strings.Contains(l, "grpcidem: cannot reach") || !strings.Contains(l, "key_digest=") || strings.Contains(l, "secret-key-43") {
		t.Errorf("slog.Default did not get the failure with the key's digest only: %s", l)
	}
}

// A closed Client refuses with Unavailable, nothing run.
func TestClientClosed(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		keys := newIdem(t, b)
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(keys)))
		_ = keys.Close()
		wantStatus(t, invoke(cc, methodDebit, "closed", 1), codes.Unavailable, grpcidem.ReasonUnavailable)
		if got := c.runs(); got != 0 {
			t.Errorf("handler ran %d times, want 0", got)
		}
	})
}

// A record that is not one idem wrote, an idem record whose result is not
// a stored response, or a stored response of an unknown type: Internal,
// and the handler does not run.
func TestCorruptRecords(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		keys := newIdem(t, b)
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(keys)))
		ctx := context.Background()
		// The record of key "garbage" with no scope ("0:" before the key).
		if err := b.Client(t).Set(ctx, "idem:{0:garbage}", "not a record", 0).Err(); err != nil {
			t.Fatal(err)
		}
		wantStatus(t, invoke(cc, methodDebit, "garbage", 1), codes.Internal, grpcidem.ReasonRecordUnusable)
		store := func(key string, res []byte, err error) {
			if _, derr := keys.Do(ctx, key, "", func(context.Context) ([]byte, error) { return res, err }); derr != nil && err == nil {
				t.Fatal(derr)
			}
		}
		store("0:foreign", []byte("hello"), nil)
		store("0:unknown-type", []byte("g\x01\x0cno.such.Type\x00\x00"), nil)
		store("0:bad-body", []byte("g\x01\x15google.protobuf.Value\x00\x00\xff\xff"), nil)
		store("0:foreign-failure", nil, idem.PermanentCode("card_declined", errors.New("declined")))
		for _, key := range []string{"foreign", "unknown-type", "bad-body", "foreign-failure"} {
			t.Run(key, func(t *testing.T) {
				// An empty fingerprint was stored: any request matches.
				wantStatus(t, invoke(cc, methodDebit, key, 1), codes.Internal, grpcidem.ReasonRecordUnusable)
			})
		}
		if got := c.runs(); got != 0 {
			t.Errorf("handler ran %d times on corrupt records, want 0", got)
		}
	})
}

// The handler ran, but Redis went away before its outcome was recorded:
// Internal ReasonNotRecorded, never the handler's response as if it were
// safe.
func TestNotRecorded(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var down func()
		if b.MR != nil {
			down = b.MR.Close
		} else {
			rdb := b.Client(t)
			down = func() { // every later write fails: Redis is out of memory
				_ = rdb.ConfigSet(context.Background(), "maxmemory", "1").Err()
			}
		}
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			down()
			return inner(ctx, req)
		}
		var logs syncBuffer
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithStoreTimeout(300*time.Millisecond)),
			grpcidem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))))
		wantStatus(t, invoke(cc, methodDebit, "nr", 1), codes.Internal, grpcidem.ReasonNotRecorded)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if !strings.Contains(logs.String(), "not recorded") {
			t.Errorf("log does not say the outcome was not recorded: %s", logs.String())
		}
	})
}

// A response larger than the Client stores reaches its caller; the key is
// finished, and retries get Internal ReasonNotStored, never a second run.
func TestTooLarge(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var runs atomic.Int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			runs.Add(1)
			return mustStruct(map[string]any{"blob": strings.Repeat("x", 4096)}), nil
		}
		var logs syncBuffer
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithMaxResultSize(1024)),
			grpcidem.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))))
		first := invoke(cc, methodDebit, "big", 1)
		if first.err != nil || len(first.resp.GetFields()["blob"].GetStringValue()) != 4096 {
			t.Fatalf("first: %v, want the whole response", first.err)
		}
		for range 2 {
			wantStatus(t, invoke(cc, methodDebit, "big", 1), codes.Internal, grpcidem.ReasonNotStored)
		}
		if got := runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if !strings.Contains(logs.String(), "not stored") {
			t.Errorf("log does not say the response was not stored: %s", logs.String())
		}
	})
}

// A response that is not a protocol buffer message cannot be stored: the
// caller gets it, retries get Internal ReasonNotStored.
func TestResponseNotProto(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		ic := grpcidem.UnaryServerInterceptor(newIdem(t, b))
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcidem.HeaderIdempotencyKey, "np"))
		info := &grpc.UnaryServerInfo{FullMethod: methodDebit}
		runs := 0
		h := func(context.Context, any) (any, error) {
			runs++
			return "not a message", nil
		}
		resp, err := ic(ctx, mustStruct(nil), info, h)
		if err != nil || resp != "not a message" {
			t.Errorf("first: %v %v, want the handler's response", resp, err)
		}
		_, err = ic(ctx, mustStruct(nil), info, h)
		wantStatus(t, answer{err: err}, codes.Internal, grpcidem.ReasonNotStored)
		// A request that is not a message cannot be fingerprinted.
		_, err = ic(ctx, "not a message", info, h)
		wantStatus(t, answer{err: err}, codes.InvalidArgument, grpcidem.ReasonBadRequest)
		if runs != 1 {
			t.Errorf("handler ran %d times, want 1", runs)
		}
	})
}

// The handler's context carries the attempt, and outlives the client: a
// client that goes away does not cancel it; WithHandlerTimeout ends it.
func TestHandlerContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		gone := make(chan error, 1)
		started := make(chan struct{})
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			a, ok := idem.AttemptFrom(ctx)
			if !ok || a.Number != 1 || a.Key != "0:ctx" {
				t.Errorf("attempt %+v %v, want 1 of 0:ctx", a, ok)
			}
			close(started)
			select {
			case <-ctx.Done():
				gone <- context.Cause(ctx)
			case <-time.After(30 * time.Second):
				gone <- errors.New("the context did not end in 30s")
			}
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithHandlerTimeout(time.Second))))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan answer, 1)
		go func() { done <- invokeCtx(ctx, cc, methodDebit, "ctx", mustStruct(nil)) }()
		<-started
		cancel()
		if a := recv(t, done); status.Code(a.err) != codes.Canceled {
			t.Errorf("the client that went away got %v; want Canceled", a.err)
		}
		if err := recv(t, gone); err == nil || !strings.Contains(err.Error(), "WithHandlerTimeout") {
			t.Errorf("handler's context: %v, want ended by WithHandlerTimeout, not by the client", err)
		}
	})
}

// Options that make no sense panic at construction.
func TestOptionsPanic(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	keys := idem.New(nil)
	defer keys.Close()
	for name, opt := range map[string]grpcidem.Option{
		"header empty":     grpcidem.WithHeader(""),
		"header grpc-":     grpcidem.WithHeader("grpc-key"),
		"header -bin":      grpcidem.WithHeader("key-bin"),
		"header space":     grpcidem.WithHeader("my key"),
		"methods none":     grpcidem.WithMethods(),
		"methods bad":      grpcidem.WithMethods("Debit"),
		"methods no slash": grpcidem.WithMethods("idemtest.Bank/Debit"),
		"scope nil":        grpcidem.WithScope(nil),
		"fingerprint nil":  grpcidem.WithFingerprint(nil),
		"definite OK":      grpcidem.WithDefiniteCodes(codes.OK),
		"max key 0":        grpcidem.WithMaxKeyLen(0),
		"retry after 0":    grpcidem.WithRetryAfter(0),
		"retry after 1.5s": grpcidem.WithRetryAfter(1500 * time.Millisecond),
	} {
		mustPanic(name, func() { grpcidem.UnaryServerInterceptor(keys, opt) })
	}
	mustPanic("nil client", func() { grpcidem.UnaryServerInterceptor(nil) })
	for name, opt := range map[string]grpcidem.ClientOption{
		"header":    grpcidem.WithClientHeader("grpc-x"),
		"methods":   grpcidem.WithClientMethods(),
		"generator": grpcidem.WithKeyGenerator(nil),
	} {
		mustPanic("client "+name, func() { grpcidem.UnaryClientInterceptor(opt) })
	}
	// Upper case is lowered, as gRPC does.
	grpcidem.UnaryServerInterceptor(keys, grpcidem.WithHeader("X-Request-Key"))
}

// WithHeader names the metadata that carries the key.
func TestWithHeader(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithHeader("X-Request-Key"))))
		for range 2 {
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-key", "h")
			invokeCtx(ctx, cc, methodDebit, "", mustStruct(nil))
			invoke(cc, methodDebit, "ignored", 1) // the default name is not read
		}
		if got := c.runs(); got != 3 {
			t.Errorf("handler ran %d times, want 3", got)
		}
	})
}

// Reason reads the ErrorInfo of the interceptor's statuses only.
func TestReason(t *testing.T) {
	other, err := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: grpcidem.ReasonInProgress, Domain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"nil":          nil,
		"plain":        errors.New(grpcidem.ReasonInProgress),
		"no details":   status.Error(codes.Unavailable, grpcidem.ReasonInProgress),
		"other domain": other.Err(),
	} {
		if got := grpcidem.Reason(err); got != "" {
			t.Errorf("%s: Reason %q, want none", name, got)
		}
	}
}

// A retry after the retention, with tombstones: refused, the handler not
// run again.
func TestLateRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		retention := time.Second
		keys := newIdem(t, b, idem.WithLease(500*time.Millisecond), idem.WithRetention(retention), idem.WithTombstones(time.Hour))
		cc := dial(t, serve(t, &bank{debit: c.debit()}, grpcidem.UnaryServerInterceptor(keys)))
		if a := invoke(cc, methodDebit, "late", 1); a.err != nil {
			t.Fatal(a.err)
		}
		b.Advance(t, retention+200*time.Millisecond)
		if st, err := keys.Status(context.Background(), "0:late"); err != nil || st.State != idem.StateAbsent {
			t.Fatalf("after the retention: %v %v, want the record gone", st.State, err)
		}
		wantStatus(t, invoke(cc, methodDebit, "late", 1), codes.FailedPrecondition, grpcidem.ReasonLateRetry)
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// TestKeyLimitFitsTheClients: the interceptor fits its key limit to the
// Client's idem.WithMaxKeyLen (door.FitKeyLen), as httpidem does: a
// WithMaxKeyLen the Client cannot hold with the scope's length prefix
// panics at construction instead of refusing keys near it call by call.
func TestKeyLimitFitsTheClients(t *testing.T) {
	keys := idem.New(nil, idem.WithMaxKeyLen(40))
	defer keys.Close()
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "WithMaxKeyLen(40)") {
				t.Errorf("WithMaxKeyLen(39) with a Client of 40: panic %v, want one naming the Client's limit", p)
			}
		}()
		grpcidem.UnaryServerInterceptor(keys, grpcidem.WithMaxKeyLen(39))
	}()
	grpcidem.UnaryServerInterceptor(keys, grpcidem.WithMaxKeyLen(38)) // "0:" and 38 bytes fit
	grpcidem.UnaryServerInterceptor(keys)                             // the default, fitted
}

// TestStreamWithKeyRefused: StreamServerInterceptor refuses a streaming
// RPC that carries a key, with InvalidArgument and ReasonKeyInvalid and a
// message saying why, without running its handler; streams without a key
// run as before, and WithHeader names the key's metadata.
func TestStreamWithKeyRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []grpcidem.Option
		header string
	}{
		{"default header", nil, grpcidem.HeaderIdempotencyKey},
		{"WithHeader", []grpcidem.Option{grpcidem.WithHeader("x-request-key")}, "x-request-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bk := &bank{}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer(grpc.ChainStreamInterceptor(grpcidem.StreamServerInterceptor(tc.opts...)))
			srv.RegisterService(&bankDesc, bk)
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			t.Cleanup(func() { srv.Stop(); <-done })
			cc := dial(t, ln.Addr().String())
			watch := func(md ...string) (int, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				ctx = metadata.AppendToOutgoingContext(ctx, md...)
				st, err := cc.NewStream(ctx, &bankDesc.Streams[0], methodWatch)
				if err != nil {
					return 0, err
				}
				if err := st.SendMsg(mustStruct(nil)); err != nil {
					return 0, err
				}
				_ = st.CloseSend()
				n := 0
				for {
					if err := st.RecvMsg(new(structpb.Struct)); err != nil {
						if errors.Is(err, io.EOF) {
							return n, nil
						}
						return n, err
					}
					n++
				}
			}
			_, err = watch(tc.header, "k1")
			if status.Code(err) != codes.InvalidArgument || grpcidem.Reason(err) != grpcidem.ReasonKeyInvalid ||
				!strings.Contains(status.Convert(err).Message(), "not supported on streaming RPCs") {
				t.Errorf("stream with a key: %v (reason %q), want InvalidArgument, %s, saying why", err, grpcidem.Reason(err), grpcidem.ReasonKeyInvalid)
			}
			if got := bk.watchRuns.Load(); got != 0 {
				t.Errorf("the refused stream's handler ran %d times", got)
			}
			if n, err := watch("other-metadata", "v"); err != nil || n != 2 {
				t.Errorf("stream without a key: %d messages, %v; want 2, nil", n, err)
			}
			if got := bk.watchRuns.Load(); got != 1 {
				t.Errorf("stream handler ran %d times, want 1", got)
			}
		})
	}
	defer func() {
		if recover() == nil {
			t.Error("StreamServerInterceptor(WithHeader(\"grpc-x\")): no panic")
		}
	}()
	grpcidem.StreamServerInterceptor(grpcidem.WithHeader("grpc-x"))
}

// A handler whose checked step is parked gets FailedPrecondition and
// OUTCOME_UNKNOWN, even when it swallowed the step's error and answered
// OK: nothing was stored, so its OK would be the one answer no retry
// gets. Its retries get the same, without running act again.
func TestParkedStepAnswersOutcomeUnknown(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var acts atomic.Int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			_, err := idem.StepChecked(ctx, "charge",
				func(context.Context) (string, error) { acts.Add(1); return "", idem.Ambiguous(errors.New("timeout")) },
				func(context.Context) (string, idem.Check, error) { return "", idem.CheckUnknown, nil },
				idem.SettleAfter(50*time.Millisecond), idem.ReconcileFor(200*time.Millisecond))
			_ = err // swallowed
			return mustStruct(map[string]any{"ok": true}), nil
		}
		cc := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b))))
		for i := range 2 {
			a := invoke(cc, methodDebit, "parked", 1)
			wantStatus(t, a, codes.FailedPrecondition, grpcidem.ReasonOutcomeUnknown)
			if i == 0 && t.Failed() {
				t.Fatalf("first call: %v", a.err)
			}
		}
		if n := acts.Load(); n != 1 {
			t.Errorf("act ran %d times, want 1", n)
		}
	})
}
