// op.go: named operations with stored inputs (Register, Op), which a
// recoverer can run again from their input.

package idem

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/idem-go/idem/internal/codec"
)

// MaxInputSize is the largest encoded input (msgpack) that Op.Do stores
// beside its claim. A larger input is refused with an error wrapping
// ErrInputTooLarge before fn runs.
const MaxInputSize = 64 << 10

// inputSuffix follows the record's key in the key of its stored input
// (same hash slot).
const inputSuffix = ":in"

// inputKey is the context key under which Op.Do (or a recovery) hands its
// *opCall to Client.Do, for that call only.
type inputKey struct{}

// opCall is what a call of a registered operation carries beside a plain
// Do's: its input as stored, and whether it is a recovery.
type opCall struct {
	key      string // the idempotency key: the index's member
	input    []byte // the stored input (see inputHeader); "" for a recovery, which keeps the stored one
	recovery bool   // a Recover loop's takeover (WithMaxRecoveries counts it)
	parked   bool   // its release parked the operation (WithMaxRecoveries)
}

// inputHeader returns the header of the stored input of the operation
// called name (see lua/record.lua): the version, the name, and the
// recoveries, 0.
func inputHeader(name string) []byte {
	return append(append([]byte{'1', byte(len(name))}, name...), 0)
}

// parseInput splits a stored input into the operation's name and its
// encoded input; ok is false when it is not one this version wrote.
func parseInput(b []byte) (name string, recoveries int, in []byte, ok bool) {
	if len(b) < 3 || b[0] != '1' || len(b) < 3+int(b[1]) {
		return "", 0, nil, false
	}
	n := int(b[1])
	return string(b[2 : 2+n]), int(b[2+n]), b[3+n:], true
}

// recoverer is a registered operation as Recover sees it.
type recoverer interface {
	// recover runs the operation of key again from its encoded input, as
	// a recovery (see Recover), and returns the attempt that ran fn (0
	// when fn did not run) and Do's error.
	recover(ctx context.Context, key string, in []byte) (int64, error)
}

// Op is an operation registered under a name on one Client (Register): Do
// runs it with an input that is stored beside its claim until it finishes.
type Op[In, Out any] struct {
	c    *Client
	name string
	fn   func(ctx context.Context, in In) (Out, error)
	in   *codec.Codec
	// header is the stored input's (see inputHeader).
	header []byte
}

// Register registers fn under name on c and returns the operation. Its
// Do stores the input, and name, beside the claim, so that the operation
// can be run again from it: a Recover loop of a Client where name is
// registered finishes it when its caller does not (see Client.Recover).
// Register panics when name is empty or longer than 255 bytes, when fn is
// nil, when In cannot round-trip through msgpack, or when name is already
// registered on c: that is a programming error.
func Register[In, Out any](c *Client, name string, fn func(ctx context.Context, in In) (Out, error)) *Op[In, Out] {
	if name == "" || len(name) > 255 {
		panic(fmt.Sprintf("idem: Register with a name of %d bytes (1 to 255)", len(name)))
	}
	if fn == nil {
		panic(fmt.Sprintf("idem: Register of %q with a nil fn", name))
	}
	ic := codec.For(reflect.TypeFor[In]())
	if err := ic.Err(); err != nil {
		panic(fmt.Sprintf("idem: Register of %q: input type: %v", name, err))
	}
	o := &Op[In, Out]{c: c, name: name, fn: fn, in: ic, header: inputHeader(name)}
	c.opsMu.Lock()
	defer c.opsMu.Unlock()
	if _, dup := c.ops[name]; dup {
		panic(fmt.Sprintf("idem: operation %q registered twice on one Client", name))
	}
	if c.ops == nil {
		c.ops = make(map[string]recoverer)
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
	stored := append(append(make([]byte, 0, len(o.header)+len(b)), o.header...), b...)
	ctx = context.WithValue(ctx, inputKey{}, &opCall{input: stored})
	return Do(ctx, o.c, key, Fingerprint(in), func(ctx context.Context) (Out, error) {
		return o.fn(ctx, in)
	})
}

// recover runs the operation of key from its stored input b, encoded, as a
// recovery: the fenced takeover of Do, that waits for no live owner.
func (o *Op[In, Out]) recover(ctx context.Context, key string, b []byte) (int64, error) {
	var in In
	if err := o.in.Decode(b, &in); err != nil {
		return 0, fmt.Errorf("%w: operation %q, key %q: stored input: %v", ErrDecode, o.name, key, err)
	}
	op := &opCall{input: []byte{}, recovery: true}
	ctx = context.WithValue(ctx, inputKey{}, op)
	var n atomic.Int64
	_, err := Do(ctx, o.c, key, Fingerprint(in), func(ctx context.Context) (Out, error) {
		a, _ := AttemptFrom(ctx)
		n.Store(a.Number)
		return o.fn(ctx, in)
	})
	if op.parked && err != nil {
		err = fmt.Errorf("%w: key %q: WithMaxRecoveries recoveries did not finish it: %w", ErrParked, key, err)
	}
	return n.Load(), err
}

// Result returns the outcome of key as Do would replay it, decoded into
// Out, without running fn and without waiting (see Client.Result).
func (o *Op[In, Out]) Result(ctx context.Context, key string) (Out, Status, error) {
	return Result[Out](ctx, o.c, key)
}
