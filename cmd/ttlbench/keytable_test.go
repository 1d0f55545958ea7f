package main

import (
	"math/rand/v2"
	"testing"
)

// TestKeyTable checks that keys get indexes in order of first appearance,
// the same index every time, through the table's growth, and that keys
// whose hashes differ in one half only are kept apart.
func TestKeyTable(t *testing.T) {
	t.Parallel()
	var kt keyTable
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct {
		h1 uint64
		h2 uint32
	}
	var keys []key
	for i := range 300_000 {
		var k key
		switch {
		case i > 0 && i%7 == 0: // same high half as an earlier key
			k = key{keys[i/2].h1&^0xffffffff | uint64(rng.Uint32()), rng.Uint32()}
		case i > 0 && i%11 == 0: // same h1, another h2
			k = key{keys[i/3].h1, keys[i/3].h2 + 1}
		default:
			k = key{rng.Uint64(), rng.Uint32()}
		}
		keys = append(keys, k)
		op, seen := kt.index(k.h1, k.h2)
		if seen || op != int32(i) {
			t.Fatalf("key %d: got index %d, seen %v; want %d, new", i, op, seen, i)
		}
	}
	for i, k := range keys {
		if op, seen := kt.index(k.h1, k.h2); !seen || op != int32(i) {
			t.Fatalf("key %d again: got index %d, seen %v", i, op, seen)
		}
	}
}
