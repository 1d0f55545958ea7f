// tombstone.go: what is left of a record after its retention, with
// WithTombstones: enough to refuse a late retry (ErrLateRetry) instead of
// running fn again. The layout is lua/tombstone.lua's; this file builds
// the arguments that claim.lua, complete.lua and forget.lua take, and
// answers a claim that found a tombstone (lateRetry).

package idem

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// lateRetry answers a call whose claim found the key's tombstone and no
// record. With a ledger (WithLedger), the ledger may still hold the
// outcome (rows are kept longer than records): the call gets it, as it
// would without tombstones, and ErrConflict when it is of other
// parameters; a failed lookup fails closed (fn does not run). Otherwise,
// or when the ledger holds nothing for the key, ErrLateRetry.
func (cl *call) lateRetry(ctx context.Context) ([]byte, error) {
	late := fmt.Errorf("%w: key %q", ErrLateRetry, cl.key)
	if cl.c.cfg.ledger == nil {
		return nil, late
	}
	d, err := cl.lookup(ctx)
	switch {
	case err != nil:
		return nil, err
	case d.e == nil:
		return nil, late
	}
	cl.observeLedger(false, d.e.Failed, conflicts(cl.fp, d.e.FingerprintDigest), d.e.Age)
	return ledgerOutcome(cl.key, cl.fp, d.e)
}

// tombstones holds a Client's tombstone settings, fixed at New.
type tombstones struct {
	on bool
	// buckets is the number of level-0 buckets of a window (see
	// lua/tombstone.lua): one per cluster slot on a Redis Cluster, where a
	// key's bucket must share its slot; fewer on one server, where fuller
	// buckets cost less memory a tombstone.
	buckets uint16
	// span is how long a tombstone must outlive its completion: the
	// retention and then the tombstone time, in milliseconds; window is the
	// width of the time windows its buckets are grouped by (see
	// lua/tombstone.lua), in milliseconds.
	span, window any
}

// tombstoneWindow returns the width of the time windows of tombstones
// that must last span after their completion: a quarter of it (so a
// tombstone lasts at most a quarter longer than asked, and a new key is
// checked against at most six windows), and at least a second.
func tombstoneWindow(span time.Duration) time.Duration {
	return max(span/4, time.Second)
}

// tombstoneField returns the tombstone of the record at recordKey (its
// Redis key): the first 8 bytes of its SHA-256, which stand for the record
// in its bucket. Two records of one slot share a field with the
// probability of a 64-bit collision.
func tombstoneField(recordKey string) string {
	sum := sha256.Sum256([]byte(recordKey))
	return string(sum[:8])
}

// base returns the stem of the keys of the tombstone buckets of the record
// at recordKey: <prefix>:t:{<tag>}. On a cluster, tag hashes to the
// record's slot, so that a script that changes the record may change its
// buckets too.
func (t *tombstones) base(prefix, recordKey string) string {
	return prefix + ":t:{" + slotTags()[slot(recordKey)%t.buckets] + "}"
}

// Level-0 buckets of a window on one server (not a cluster): 100,000
// tombstones fill them about 100 to a bucket, below the 128 that a compact
// hash holds.
const serverBuckets = 1024

// slot returns the Redis Cluster hash slot of a Redis key: CRC-16/XMODEM
// of its hash tag (the part between the first '{' and the next '}', when
// not empty), or of the whole key, modulo 16384.
func slot(key string) uint16 {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) % 16384
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotTags returns, for each of the 16384 slots, the first base-36 number
// whose CRC-16 falls in it: a hash tag that places a key in that slot.
var slotTags = sync.OnceValue(func() *[16384]string {
	var tags [16384]string
	for n, left := 0, len(tags); left > 0; n++ {
		t := strconv.FormatInt(int64(n), 36)
		if s := crc16(t) % 16384; tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return &tags
})
