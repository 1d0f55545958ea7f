package door

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/idem-go/idem"
)

// The framing of a stored response, which every door that stores one
// shares: a magic byte naming the door's format ('h' for httpidem, 'g'
// for grpcidem), a version byte, then fields of unsigned varints,
// strings (a varint length and the bytes) and pair lists (a varint count
// and that many name and value strings, names sorted, one pair per
// value), in the door's own order, the body running to the end.
//
// AppendFrame and the Append functions write it; ReadFrame and Reader
// read it, returning errors that wrap idem.ErrCorrupt, which idem and
// every door report as an unusable record.

// AppendFrame appends the frame's first two bytes, magic and version, to b.
func AppendFrame(b []byte, magic, version byte) []byte { return append(b, magic, version) }

// ReadFrame checks that b starts with the frame of magic at version, and
// returns a Reader of the rest.
func ReadFrame(b []byte, magic, version byte) (*Reader, error) {
	if len(b) < 2 || b[0] != magic {
		return nil, Corrupt("not a stored response")
	}
	if b[1] != version {
		return nil, Corrupt(fmt.Sprintf("unknown format version %d", b[1]))
	}
	return &Reader{b: b[2:]}, nil
}

// Corrupt returns the error of a stored response that cannot be read: it
// wraps idem.ErrCorrupt.
func Corrupt(why string) error {
	return fmt.Errorf("%w: stored response: %s", idem.ErrCorrupt, why)
}

// AppendUvarint appends x as an unsigned varint.
func AppendUvarint(b []byte, x uint64) []byte { return binary.AppendUvarint(b, x) }

// AppendString appends s with its length.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendPairs appends the pairs of m (HTTP headers, gRPC metadata): their
// count, then each name with each of its values, names sorted.
func AppendPairs(b []byte, m map[string][]string) []byte {
	n := 0
	for _, vs := range m {
		n += len(vs)
	}
	b = binary.AppendUvarint(b, uint64(n))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		for _, v := range m[k] {
			b = AppendString(b, k)
			b = AppendString(b, v)
		}
	}
	return b
}

// PairsSize is the size of m's pairs, as AppendPairs writes them.
func PairsSize(m map[string][]string) int {
	n, size := 0, 0
	for k, vs := range m {
		for _, v := range vs {
			size += UvarintLen(uint64(len(k))) + len(k) + UvarintLen(uint64(len(v))) + len(v)
			n++
		}
	}
	return UvarintLen(uint64(n)) + size
}

// UvarintLen is the size of x as an unsigned varint.
func UvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// Reader reads the fields of a frame, from ReadFrame.
type Reader struct{ b []byte }

// Uvarint reads an unsigned varint; ok is false when there is none.
func (r *Reader) Uvarint() (x uint64, ok bool) {
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		return 0, false
	}
	r.b = r.b[n:]
	return x, true
}

// String reads a string; ok is false when it is cut short.
func (r *Reader) String() (s string, ok bool) {
	n, ok := r.Uvarint()
	if !ok || n > uint64(len(r.b)) {
		return "", false
	}
	s = string(r.b[:n])
	r.b = r.b[n:]
	return s, true
}

// Pairs reads pairs written by AppendPairs; ok is false when they are cut
// short or a name is empty. No pairs give a nil map.
func (r *Reader) Pairs() (m map[string][]string, ok bool) {
	n, ok := r.Uvarint()
	// Each pair takes at least two bytes: a bound before allocating.
	if !ok || n > uint64(len(r.b))/2 {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	m = make(map[string][]string)
	for range n {
		k, ok1 := r.String()
		v, ok2 := r.String()
		if !ok1 || !ok2 || k == "" {
			return nil, false
		}
		m[k] = append(m[k], v)
	}
	return m, true
}

// Rest returns what is left: the body. It shares the frame's memory.
func (r *Reader) Rest() []byte { return r.b }
