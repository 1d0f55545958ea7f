// result.go: Result, the outcome of a key by its key, without running or
// waiting.

package idem

import (
	"context"
	"fmt"
	"reflect"

	"github.com/idem-go/idem/internal/codec"
)

// Result returns the outcome of key as Do would replay it, without
// running fn and without waiting: for a finished key, its stored result
// (the bytes Client.Do returned; the typed Result decodes a Do[T]'s) with
// its Status; for a stored failure, a *StoredError with
// its Status (StateFailed); otherwise a nil result and a nil error, and the
// Status says what the key is doing (in progress, released, parked,
// absent). A client that gave up on a request learns from it whether the
// operation happened, without creating a new one. It reads Redis only: with a
// ledger, an outcome Redis has lost is not found here (the next Do with
// the key finds it in the ledger).
func (c *Client) Result(ctx context.Context, key string) ([]byte, Status, error) {
	if err := c.checkCall(ctx, key); err != nil {
		return nil, Status{}, err
	}
	v, err := c.status(ctx, key, true)
	if err != nil {
		return nil, Status{}, fmt.Errorf("idem: result of key %q: %w", key, err)
	}
	st, err := parseStatus(key, v)
	if err != nil {
		return nil, Status{}, err
	}
	if st.State != StateDone && st.State != StateFailed {
		if len(v) == 7 {
			return nil, Status{}, fmt.Errorf("%w: key %q: a record returned for state %v", ErrCorrupt, key, st.State)
		}
		st, err = c.parked(ctx, key, st)
		if err != nil {
			return nil, Status{}, err
		}
		return nil, st, nil
	}
	if len(v) != 7 {
		return nil, Status{}, fmt.Errorf("%w: key %q: a finished record without its outcome", ErrCorrupt, key)
	}
	rec, ok := v[6].(string)
	if !ok {
		return nil, Status{}, fmt.Errorf("%w: key %q: a finished record without its outcome", ErrCorrupt, key)
	}
	r := readFinished(rec, "")
	switch r.kind {
	case replyDone:
		return []byte(r.payload), st, nil
	case replyFailed:
		return nil, st, readFailure(r.payload)
	}
	return nil, Status{}, fmt.Errorf("%w: key %q: %s", ErrCorrupt, key, r.payload)
}

// Result is the typed form of Client.Result, for keys of Do[T]: a
// finished key's result decoded into T (an error wrapping ErrDecode when
// it is not a T's encoding), a *StoredError for a stored failure, or the
// zero T and a nil error with the Status of an unfinished or absent key.
func Result[T any](ctx context.Context, c *Client, key string) (T, Status, error) {
	var zero T
	rc := codec.For(reflect.TypeFor[T]())
	if err := rc.Err(); err != nil {
		return zero, Status{}, fmt.Errorf("%w: %v", ErrEncode, err)
	}
	b, st, err := c.Result(ctx, key)
	if err != nil || st.State != StateDone {
		return zero, st, err
	}
	var v T
	if err := rc.Decode(b, &v); err != nil {
		return zero, st, fmt.Errorf("%w: key %q: %s: %v", ErrDecode, key, rc.Type(), err)
	}
	return v, st, nil
}
