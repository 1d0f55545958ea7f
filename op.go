// op.go: named operations with stored inputs (Register, Op), which a
// recoverer can run again from their input.

package idem

import (
	"context"
	"fmt"
	"reflect"

	"github.com/idem-go/idem/internal/codec"
)

// MaxInputSize is the largest encoded input (msgpack) that Op.Do stores
// beside its claim. A larger input is refused with an error wrapping
// ErrInputTooLarge before fn runs.
const MaxInputSize = 64 << 10

// inputSuffix follows the record's key in the key of its stored input
// (same hash slot).
const inputSuffix = ":in"

// inputKey is the context key under which Op.Do hands its encoded input
// to Client.Do, for that call's claim only.
type inputKey struct{}

// Op is an operation registered under a name on one Client (Register): Do
// runs it with an input that is stored beside its claim until it finishes.
type Op[In, Out any] struct {
	c    *Client
	name string
	fn   func(ctx context.Context, in In) (Out, error)
	in   *codec.Codec
}

// Register registers fn under name on c and returns the operation. Its
// Do stores the input beside the claim, so that the operation can be run
// again from it. Register panics when name is empty, when fn is nil, when
// In cannot round-trip through msgpack, or when name is already
// registered on c: that is a programming error.
func Register[In, Out any](c *Client, name string, fn func(ctx context.Context, in In) (Out, error)) *Op[In, Out] {
	if name == "" {
		panic("idem: Register with an empty name")
	}
	if fn == nil {
		panic(fmt.Sprintf("idem: Register of %q with a nil fn", name))
	}
	ic := codec.For(reflect.TypeFor[In]())
	if err := ic.Err(); err != nil {
		panic(fmt.Sprintf("idem: Register of %q: input type: %v", name, err))
	}
	o := &Op[In, Out]{c: c, name: name, fn: fn, in: ic}
	c.opsMu.Lock()
	defer c.opsMu.Unlock()
	if _, dup := c.ops[name]; dup {
		panic(fmt.Sprintf("idem: operation %q registered twice on one Client", name))
	}
	if c.ops == nil {
		c.ops = make(map[string]any)
	}
	c.ops[name] = o
	return o
}

// Name returns the name the operation was registered under.
func (o *Op[In, Out]) Name() string { return o.name }

// Do is the typed Do with Fingerprint(in) as the fingerprint: it runs the
// registered fn with in at most once per key, as Do does. in, encoded with
// msgpack (at most MaxInputSize bytes, else ErrInputTooLarge), is stored
// beside the key's record in the claim's own round trip, for as long as the
// operation is unfinished; storing the outcome deletes it.
func (o *Op[In, Out]) Do(ctx context.Context, key string, in In) (Out, error) {
	var zero Out
	b, err := o.in.Encode(&in)
	if err != nil {
		return zero, fmt.Errorf("%w: operation %q: input: %v", ErrEncode, o.name, err)
	}
	if len(b) > MaxInputSize {
		return zero, fmt.Errorf("%w: operation %q: %d bytes, at most %d", ErrInputTooLarge, o.name, len(b), MaxInputSize)
	}
	if b == nil {
		b = []byte{}
	}
	ctx = context.WithValue(ctx, inputKey{}, b)
	return Do(ctx, o.c, key, Fingerprint(in), func(ctx context.Context) (Out, error) {
		return o.fn(ctx, in)
	})
}

// Result returns the outcome of key as Do would replay it, decoded into
// Out, without running fn and without waiting (see Client.Result).
func (o *Op[In, Out]) Result(ctx context.Context, key string) (Out, Status, error) {
	return Result[Out](ctx, o.c, key)
}
