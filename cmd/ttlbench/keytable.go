package main

import "slices"

// keyTable assigns each distinct key (by its 96-bit hash) an operation
// index, in order of first appearance. It holds 8 bytes a key (the hash's
// low half and a second hash) and a table of slots of 8 bytes, the high
// half of the hash and the index, kept at most three quarters full: about
// 19 bytes a key, against some 38 for a Go map of 128-bit keys, which at
// ten million keys is the difference that keeps a big trace under 1 GiB.
// A probe compares the slot's half of the hash first, so it reads nothing
// else for the keys it passes. Two keys share an index only if their
// 96-bit hashes are equal: among ten million keys, a chance of about one
// in 10^15.
type keyTable struct {
	slots []keySlot
	lo    []uint32 // by operation: the low half of the hash that picks the slot
	h2    []uint32 // by operation: a second, independent hash
}

// keySlot is a slot of the table: op is the operation index + 1 (0: an
// empty slot), hi the high half of its key's hash.
type keySlot struct {
	hi uint32
	op int32
}

// index returns the operation of the key with hashes h1, h2, and whether
// it was seen before; a new key gets the next index.
func (t *keyTable) index(h1 uint64, h2 uint32) (int32, bool) {
	if 4*(len(t.lo)+1) > 3*len(t.slots) {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	hi, lo := uint32(h1>>32), uint32(h1)
	for s := slotOf(h1, mask); ; s = (s + 1) & mask {
		v := t.slots[s]
		if v.op == 0 {
			op := int32(len(t.lo))
			t.slots[s] = keySlot{hi: hi, op: op + 1}
			t.lo = append(t.lo, lo)
			t.h2 = append(t.h2, h2)
			return op, false
		}
		if op := v.op - 1; v.hi == hi && t.lo[op] == lo && t.h2[op] == h2 {
			return op, true
		}
	}
}

// slotOf picks a key's first slot from its hash: the high bits, which the
// slot also stores, are the ones most likely to differ.
func slotOf(h1 uint64, mask uint64) uint64 { return (h1 ^ h1>>29) & mask }

// grow doubles the table (or makes its first) and puts the keys back.
func (t *keyTable) grow() {
	old := t.slots
	n := max(1<<16, 2*len(old))
	t.slots = make([]keySlot, n)
	mask := uint64(n - 1)
	for _, v := range old {
		if v.op == 0 {
			continue
		}
		h1 := uint64(v.hi)<<32 | uint64(t.lo[v.op-1])
		s := slotOf(h1, mask)
		for t.slots[s].op != 0 {
			s = (s + 1) & mask
		}
		t.slots[s] = v
	}
}

// reserve makes the table big enough for n keys.
func (t *keyTable) reserve(n int) {
	t.lo = slices.Grow(t.lo, n-len(t.lo))
	t.h2 = slices.Grow(t.h2, n-len(t.h2))
	for 4*n > 3*len(t.slots) {
		t.grow()
	}
}
