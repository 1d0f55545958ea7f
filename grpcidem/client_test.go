package grpcidem_test

import (
	"context"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// seen records the key metadata of every call a server receives, before
// the idempotency interceptor, and what that interceptor answered.
type seen struct {
	mu      sync.Mutex
	keys    [][]string
	answers []error
	// onAnswer, if set, is called with every answer.
	onAnswer func(error)
}

func (s *seen) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.keys = append(s.keys, md.Get(grpcidem.HeaderIdempotencyKey))
	s.mu.Unlock()
	resp, err := h(ctx, req)
	s.mu.Lock()
	s.answers = append(s.answers, err)
	s.mu.Unlock()
	if s.onAnswer != nil {
		s.onAnswer(err)
	}
	return resp, err
}

// all returns the key values of every call, each joined with ",".
func (s *seen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, k := range s.keys {
		out = append(out, join(k))
	}
	return out
}

func join(vs []string) string {
	out := ""
	for i, v := range vs {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Without a context of NewContext, each call gets a key of its own, a
// random UUID.
func TestClientKeyPerCall(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		var s seen
		addr := serve(t, &bank{debit: c.debit()}, s.interceptor, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		cc := dial(t, addr, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
		for range 2 {
			if a := invoke(cc, methodDebit, "", 1); a.err != nil || a.replayed() {
				t.Errorf("call: %v, replayed %v", a.err, a.replayed())
			}
		}
		keys := s.all()
		if len(keys) != 2 || keys[0] == keys[1] || !uuidV4.MatchString(keys[0]) || !uuidV4.MatchString(keys[1]) {
			t.Errorf("keys %q, want two different UUIDs", keys)
		}
		if got := c.runs(); got != 2 {
			t.Errorf("handler ran %d times, want 2", got)
		}
	})
}

// retryPolicy is a service config whose retry policy resends a call that
// ended Unavailable, up to five attempts in all.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "idemtest.Bank"}],
	"retryPolicy": {
		"maxAttempts": 5,
		"initialBackoff": "0.01s",
		"maxBackoff": "0.05s",
		"backoffMultiplier": 2,
		"retryableStatusCodes": ["UNAVAILABLE"]
	}
}]}`

// gRPC's retry policy resends one call after transient failures: every
// attempt carries the one key, and the handler sees attempts 1, 2, 3 of
// it.
func TestClientRetryPolicyKeepsKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var mu sync.Mutex
		var attempts []int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			a, _ := idem.AttemptFrom(ctx)
			mu.Lock()
			attempts = append(attempts, a.Number)
			mu.Unlock()
			if a.Number < 3 {
				return nil, status.Error(codes.Unavailable, "bank down")
			}
			return mustStruct(map[string]any{"attempt": a.Number}), nil
		}
		var s seen
		addr := serve(t, &bank{debit: h}, s.interceptor, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		cc := dial(t, addr, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
			grpc.WithDefaultServiceConfig(retryPolicy))
		a := invoke(cc, methodDebit, "", 1)
		if a.err != nil || a.field("attempt") != 3 {
			t.Fatalf("call: %v %v, want success at attempt 3", a.err, a.resp)
		}
		keys := s.all()
		if len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] || !uuidV4.MatchString(keys[0]) {
			t.Errorf("keys of the three attempts %q, want one UUID", keys)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(attempts, []int64{1, 2, 3}) {
			t.Errorf("attempts %v, want 1 2 3", attempts)
		}
	})
}

// A call that finds the first one in progress gets Unavailable with a
// pushback: gRPC's retry policy resends it after the delay, with its key,
// and it gets the first call's response, replayed.
func TestClientRetryPolicyAfterInProgress(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		h, started, release := blocking(c.debit())
		addr1 := serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b)))
		var once sync.Once
		s := seen{onAnswer: func(err error) {
			if grpcidem.Reason(err) == grpcidem.ReasonInProgress {
				once.Do(func() { close(release) }) // the first call may end now
			}
		}}
		addr2 := serve(t, &bank{debit: h}, s.interceptor, grpcidem.UnaryServerInterceptor(
			newIdem(t, b, idem.WithWait(50*time.Millisecond)), grpcidem.WithRetryAfter(time.Second)))

		ctx := grpcidem.NewContext(context.Background(), "busy")
		first := make(chan answer, 1)
		go func() {
			cc1 := dial(t, addr1, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
			first <- invokeCtx(ctx, cc1, methodDebit, "", mustStruct(nil))
		}()
		recv(t, started)
		cc2 := dial(t, addr2, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
			grpc.WithDefaultServiceConfig(retryPolicy))
		t0 := time.Now()
		a := invokeCtx(ctx, cc2, methodDebit, "", mustStruct(nil))
		if a.err != nil || !a.replayed() || a.field("run") != 1 {
			t.Fatalf("duplicate: %v, replayed %v, %v; want the first call's response replayed", a.err, a.replayed(), a.resp)
		}
		if f := recv(t, first); f.err != nil {
			t.Fatalf("first: %v", f.err)
		}
		if d := time.Since(t0); d < time.Second {
			t.Errorf("the retry came after %v, before the pushback of 1s", d)
		}
		if keys := s.all(); len(keys) < 2 || keys[0] != "busy" || keys[len(keys)-1] != "busy" {
			t.Errorf("keys of the duplicate's attempts %q, want busy in each (2 or more)", keys)
		}
		if got := c.runs(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// A caller's own retries with one context of NewContext carry one key,
// made at the first call; FromContext tells it.
func TestClientCallerRetriesKeepKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		inner := c.debit()
		var calls atomic.Int64
		h := func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			if calls.Add(1) == 1 {
				return nil, status.Error(codes.Unavailable, "bank down")
			}
			return inner(ctx, req)
		}
		var s seen
		cc := dial(t, serve(t, &bank{debit: h}, s.interceptor, grpcidem.UnaryServerInterceptor(newIdem(t, b))),
			grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
		ctx := grpcidem.NewContext(context.Background(), "")
		if k, ok := grpcidem.FromContext(ctx); ok || k != "" {
			t.Errorf("FromContext before the first call: %q %v, want none", k, ok)
		}
		var got []answer
		for range 3 {
			got = append(got, invokeCtx(ctx, cc, methodDebit, "", mustStruct(nil)))
		}
		if status.Code(got[0].err) != codes.Unavailable {
			t.Errorf("first: %v, want the handler's Unavailable", got[0].err)
		}
		if got[1].err != nil || got[1].replayed() || got[1].field("attempt") != 2 {
			t.Errorf("second: %v replayed %v %v, want a run as attempt 2", got[1].err, got[1].replayed(), got[1].resp)
		}
		if got[2].err != nil || !got[2].replayed() || got[2].field("run") != got[1].field("run") {
			t.Errorf("third: %v replayed %v, want the second replayed", got[2].err, got[2].replayed())
		}
		key, ok := grpcidem.FromContext(ctx)
		if keys := s.all(); !ok || len(keys) != 3 || keys[0] != key || keys[1] != key || keys[2] != key {
			t.Errorf("keys %q, FromContext %q %v; want one key for all three", keys, key, ok)
		}
	})
}

// A key the caller set (in the metadata, or given to NewContext) is the
// one sent, alone.
func TestClientCallerSetKeyKept(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		var s seen
		cc := dial(t, serve(t, &bank{debit: c.debit()}, s.interceptor, grpcidem.UnaryServerInterceptor(newIdem(t, b))),
			grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()))
		invoke(cc, methodDebit, "mine", 1) // set in the outgoing metadata
		invokeCtx(grpcidem.NewContext(context.Background(), "given"), cc, methodDebit, "", mustStruct(nil))
		// Both: the metadata wins.
		invokeCtx(grpcidem.NewContext(context.Background(), "given"), cc, methodDebit, "mine", mustStruct(map[string]any{"amount": 1}))
		if keys := s.all(); !slices.Equal(keys, []string{"mine", "given", "mine"}) {
			t.Errorf("keys %q, want mine, given, mine", keys)
		}
		if got := c.runs(); got != 2 {
			t.Errorf("handler ran %d times, want 2", got)
		}
	})
}

// WithClientMethods limits the methods that get a key; WithClientHeader
// and WithKeyGenerator name the metadata and make the keys.
func TestClientOptions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		var c counter
		var mu sync.Mutex
		var keys []string
		record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			keys = append(keys, join(md.Get("x-op"))+"/"+join(md.Get(grpcidem.HeaderIdempotencyKey)))
			mu.Unlock()
			return h(ctx, req)
		}
		addr := serve(t, &bank{debit: c.debit(), refund: c.debit()}, record,
			grpcidem.UnaryServerInterceptor(newIdem(t, b), grpcidem.WithHeader("x-op")))
		var n atomic.Int64
		cc := dial(t, addr, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor(
			grpcidem.WithClientMethods(methodDebit),
			grpcidem.WithClientHeader("X-Op"),
			grpcidem.WithKeyGenerator(func() string { return "op-" + string(rune('0'+n.Add(1))) }),
		)))
		invoke(cc, methodDebit, "", 1)
		invoke(cc, methodRefund, "", 1)
		invoke(cc, methodDebit, "", 1)
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"op-1/", "/", "op-2/"}; !slices.Equal(keys, want) {
			t.Errorf("x-op/idempotency-key of the calls %q, want %q", keys, want)
		}
	})
}
