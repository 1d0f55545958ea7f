package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
)

// TestHostileKeysAndFingerprints: FAULTS.md row 41. A 1 MB key is refused
// (ErrInvalidKey) before anything is sent, and costs no copy of it; a
// 100 MB fingerprint is hashed where it lies: Do allocates a few
// kilobytes for it, not another 100 MB, and tells it apart from one that
// differs in its last byte. Fingerprint of a 100 MB part streams it into
// the hash as well.
func TestHostileKeysAndFingerprints(t *testing.T) {
	// Not parallel: it counts the bytes allocated process-wide, which parallel tests would add to.
	if testing.Short() {
		t.Skip("-short: hashes 100 MB several times")
	}
	b := idemtest.Miniredis(t)
	c := b.Idem(t)
	ctx := context.Background()
	ran := 0
	fn := func(context.Context) ([]byte, error) { ran++; return []byte("ok"), nil }

	key := strings.Repeat("k", 1<<20)
	var err error
	if n := allocated(func() { _, err = c.Do(ctx, key, "", fn) }); !errors.Is(err, idem.ErrInvalidKey) || ran != 0 || n > 512<<10 {
		t.Errorf("1 MB key: %v, fn ran %d times, %d bytes allocated; want ErrInvalidKey, fn not run, no copy of the key", err, ran, n)
	}

	// A first call sets up what every client sets up once (its
	// connection, its buffers): counted, it reads as a copy.
	if _, err := c.Do(ctx, "warm-up", "fp", fn); err != nil {
		t.Fatal(err)
	}
	ran = 0
	fp := strings.Repeat("f", 100<<20)
	other := fp[:len(fp)-1] + "g"
	for i, want := range []error{nil, nil, idem.ErrConflict} {
		p := fp
		if want != nil {
			p = other
		}
		n := allocated(func() { _, err = c.Do(ctx, "big-fingerprint", p, fn) })
		if !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("call %d: %v, want %v", i, err, want)
		}
		if n > 1<<20 {
			t.Errorf("call %d with a 100 MB fingerprint allocated %d bytes; want no copy of it", i, n)
		}
	}
	if ran != 1 {
		t.Errorf("fn ran %d times, want 1", ran)
	}
	var f1, f2 string
	if n := allocated(func() { f1, f2 = idem.Fingerprint(fp), idem.Fingerprint(other) }); n > 1<<20 || f1 == f2 {
		t.Errorf("Fingerprint of two 100 MB strings: %d bytes allocated, digests %s %s; want no copy, and two digests", n, f1, f2)
	}
}

// allocated returns the bytes f allocates (and, a little, what other
// goroutines allocate meanwhile).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestFingerprintLargeParts: Fingerprint streams a large encoding into the
// hash; the digest is the one of the whole encoding, as for a small one:
// a string ('s', its length in 8 bytes, its bytes), and a slice of 20,000
// ints ('l', its length, then 'i' and 8 bytes each), computed here apart.
func TestFingerprintLargeParts(t *testing.T) {
	t.Parallel()
	u64 := func(x int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(x)) }
	want := func(enc []byte) string {
		sum := sha256.Sum256(enc)
		return hex.EncodeToString(sum[:16])
	}
	s := strings.Repeat("ab", 300<<10)
	enc := append(append([]byte{'s'}, u64(len(s))...), s...)
	if got := idem.Fingerprint(s); got != want(enc) {
		t.Errorf("a %d-byte string: %s, want %s", len(s), got, want(enc))
	}
	if got := idem.Fingerprint([]byte(s)); got != want(append(append([]byte{'B'}, u64(len(s))...), s...)) {
		t.Errorf("a %d-byte slice: %s", len(s), got)
	}
	ints := make([]int, 20000)
	enc = append([]byte{'l'}, u64(len(ints))...)
	for i := range ints {
		ints[i] = i * 7
		enc = append(append(enc, 'i'), u64(ints[i])...)
	}
	if got := idem.Fingerprint(ints); got != want(enc) {
		t.Errorf("%d ints: %s, want %s", len(ints), got, want(enc))
	}
}
