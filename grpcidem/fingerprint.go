package grpcidem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"

	"google.golang.org/protobuf/proto"
)

// DefaultFingerprint is the fingerprint of a call unless WithFingerprint
// sets another: a digest of the full method name and the request's
// deterministic protobuf encoding (proto.MarshalOptions{Deterministic:
// true}). See the package documentation for what that encoding does not
// make equal. It returns an error for a request that is not a protocol
// buffer message (another codec: give WithFingerprint) or that cannot be
// encoded.
func DefaultFingerprint(_ context.Context, fullMethod string, req any) (string, error) {
	m, ok := req.(proto.Message)
	if !ok || m == nil {
		return "", fmt.Errorf("grpcidem: the request, of type %T, is not a protocol buffer message", req)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("grpcidem: the request cannot be encoded: %w", err)
	}
	h := sha256.New()
	field(h, "grpcidem/v1")
	field(h, fullMethod)
	field(h, body)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16]), nil
}

// field writes s to h after its length, so that no two lists of fields
// write the same bytes.
func field[S string | []byte](h hash.Hash, s S) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
