package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// capture records the header and trailer metadata a handler sets. What
// the handler sets (SetHeader, SetTrailer) is held until it returns, then
// set on the call's real stream (flush), or dropped when the ledger
// decided another outcome, whose metadata the replay sets instead; what it
// sends (SendHeader) goes out at once.
type capture struct {
	grpc.ServerTransportStream

	mu      sync.Mutex
	header  metadata.MD // guarded by mu; all the header set or sent
	trailer metadata.MD // guarded by mu
	held    metadata.MD // guarded by mu; the header set and not yet on the stream
	sent    bool        // guarded by mu; the header went out (SendHeader)
	closed  bool        // guarded by mu; the interceptor returned: nothing more reaches the stream
}

// errCallGone is what a detached handler's SendHeader returns once the
// interceptor has returned.
var errCallGone = errors.New("grpcidem: the call has ended; the handler runs on detached, and its outcome goes to the retry")

// close makes the capture hold on to what the handler sends from now on:
// the interceptor has returned, or is about to answer.
func (c *capture) close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
}

// captureMetadata returns a context whose stream records what the handler
// sets, and the record; ctx itself and nil outside a gRPC server.
func captureMetadata(ctx context.Context) (context.Context, *capture) {
	inner := grpc.ServerTransportStreamFromContext(ctx)
	if inner == nil {
		return ctx, nil
	}
	c := &capture{ServerTransportStream: inner}
	return grpc.NewContextWithServerTransportStream(ctx, c), c
}

// SetHeader records the header, for the real stream once the handler
// returns; after SendHeader, it goes to the real stream, which refuses it.
func (c *capture) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent {
		if c.closed {
			return errCallGone
		}
		return c.ServerTransportStream.SetHeader(md)
	}
	c.header = metadata.Join(c.header, md)
	c.held = metadata.Join(c.held, md)
	return nil
}

// SendHeader sends the header held and md on the real stream, and
// records md.
func (c *capture) SendHeader(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errCallGone
	}
	if err := c.ServerTransportStream.SendHeader(metadata.Join(c.held, md)); err != nil {
		return err
	}
	c.header = metadata.Join(c.header, md)
	c.held, c.sent = nil, true
	return nil
}

// SetTrailer records the trailer, for the real stream once the handler
// returns.
func (c *capture) SetTrailer(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trailer = metadata.Join(c.trailer, md)
	return nil
}

// flush sets what the handler set on the real stream: its outcome is the
// call's answer.
func (c *capture) flush() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.held) > 0 && !c.sent {
		_ = c.ServerTransportStream.SetHeader(c.held)
	}
	if len(c.trailer) > 0 {
		_ = c.ServerTransportStream.SetTrailer(c.trailer)
	}
	c.held = nil
}

// recorded returns the header and trailer recorded.
func (c *capture) recorded() (header, trailer metadata.MD) {
	if c == nil {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header.Copy(), c.trailer.Copy()
}

// response is a response as the interceptor stores and replays it.
type response struct {
	typeName        protoreflect.FullName
	header, trailer metadata.MD
	body            []byte // the message, encoded
}

// The stored form of a response, version 1:
//
//	"g" 0x01 len(type) type n (len(key) key len(value) value)×n
//	         m (len(key) key len(value) value)×m body
//
// with the lengths, n and m as unsigned varints: the response message's
// full type name, n header and m trailer pairs (one per value, keys
// sorted), and the encoded message running to the end.
const (
	formatMagic   = 'g'
	formatVersion = 1
)

// encodeResponse returns the stored form of the handler's response and
// the metadata it set (c, possibly nil).
func encodeResponse(resp any, c *capture) ([]byte, error) {
	m, ok := resp.(proto.Message)
	if !ok || m == nil {
		return nil, fmt.Errorf("grpcidem: the response, of type %T, is not a protocol buffer message", resp)
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("grpcidem: the response cannot be encoded: %w", err)
	}
	header, trailer := c.recorded()
	header = header.Copy()
	delete(header, HeaderReplayed)
	r := response{typeName: m.ProtoReflect().Descriptor().FullName(), header: header, trailer: trailer, body: body}
	return r.encode(), nil
}

// encode returns the stored form of r.
func (r response) encode() []byte {
	b := make([]byte, 0, 2+door.UvarintLen(uint64(len(r.typeName)))+len(r.typeName)+
		door.PairsSize(r.header)+door.PairsSize(r.trailer)+len(r.body))
	b = door.AppendFrame(b, formatMagic, formatVersion)
	b = door.AppendString(b, string(r.typeName))
	b = door.AppendPairs(b, r.header)
	b = door.AppendPairs(b, r.trailer)
	return append(b, r.body...)
}

// decodeResponse reads the stored form of a response. The body it returns
// shares b's memory.
func decodeResponse(b []byte) (response, error) {
	d, err := door.ReadFrame(b, formatMagic, formatVersion)
	if err != nil {
		return response{}, err
	}
	var r response
	name, ok := d.String()
	if !ok || !protoreflect.FullName(name).IsValid() {
		return response{}, door.Corrupt("bad type name")
	}
	r.typeName = protoreflect.FullName(name)
	if r.header, ok = d.Pairs(); !ok {
		return response{}, door.Corrupt("bad header")
	}
	if r.trailer, ok = d.Pairs(); !ok {
		return response{}, door.Corrupt("bad trailer")
	}
	r.body = d.Rest()
	return r, nil
}

// errUnknownType means the stored response's type is not registered.
var errUnknownType = errors.New("grpcidem: the stored response's type is not registered")

// message returns a new message of the stored type, decoded from the
// stored body.
func (r response) message() (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(r.typeName)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errUnknownType, r.typeName, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.body, m); err != nil {
		return nil, fmt.Errorf("%w: stored response of type %s: %v", idem.ErrCorrupt, r.typeName, err)
	}
	return m, nil
}
