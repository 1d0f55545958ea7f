// record.go: the record format in Go, mirroring lua/record.lua: building
// records and reading the scripts' replies.

package idem

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"
)

// keys returns the Redis keys of key's record and of its notification
// channel, built in one allocation: <prefix>:{<escaped key>} and the same
// with ":done" after it. The escaping ('\' to "\\", '}' to "\c") keeps the
// hash tag non-empty and exactly the key, so the record and its channel
// always share a cluster slot, whatever bytes the key holds.
func (c *Client) keys(key string) []string {
	var b strings.Builder
	b.Grow(len(c.cfg.prefix) + len(key) + 4 + len(doneSuffix))
	c.writeRecordKey(&b, key)
	b.WriteString(doneSuffix)
	ch := b.String()
	return []string{ch[:len(ch)-len(doneSuffix)], ch}
}

// callKeys returns the Redis keys of a call on key, as slices of set, with
// their text in one allocation: keys, the record's and its channel's (as
// Client.keys returns them), and claimKeys, the record's and its steps'
// checkpoints' (the KEYS of claim.lua, renew.lua and step.lua).
func (c *Client) callKeys(key string, set *[4]string) (keys, claimKeys []string) {
	var b strings.Builder
	b.Grow(2*(len(c.cfg.prefix)+len(key)+3) + len(doneSuffix) + len(stepsSuffix))
	c.writeRecordKey(&b, key)
	n := b.Len()
	b.WriteString(doneSuffix)
	b.WriteString(b.String()[:n]) // the record's key again, before the steps' suffix
	b.WriteString(stepsSuffix)
	s := b.String()
	set[0], set[1] = s[:n], s[:n+len(doneSuffix)]
	set[2], set[3] = set[0], s[n+len(doneSuffix):]
	return set[0:2:2], set[2:4:4]
}

// writeRecordKey writes the Redis key of key's record to b (see keys).
func (c *Client) writeRecordKey(b *strings.Builder, key string) {
	b.WriteString(c.cfg.prefix)
	b.WriteString(":{")
	if strings.IndexByte(key, '\\') >= 0 || strings.IndexByte(key, '}') >= 0 {
		for i := 0; i < len(key); i++ {
			switch key[i] {
			case '\\':
				b.WriteString(`\\`)
			case '}':
				b.WriteString(`\c`)
			default:
				b.WriteByte(key[i])
			}
		}
	} else {
		b.WriteString(key)
	}
	b.WriteByte('}')
}

const doneSuffix = ":done"

// recordKey is the Redis key of key's record.
func (c *Client) recordKey(key string) string { return c.keys(key)[0] }

// newToken returns a random owner token of 16 bytes.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return string(b[:])
}

// recordVersion is the first byte of every record this version writes
// and reads.
const recordVersion = '1'

// recordState is a record's state, its second byte (see lua/record.lua).
type recordState byte

// The states of a record.
const (
	recordInProgress recordState = 'p' // an attempt holds or held the lease
	recordReleased   recordState = 'r' // the last attempt gave its claim back
	recordDone       recordState = 'd' // a result is stored
	recordFailed     recordState = 'f' // a permanent failure is stored
)

// replyKind says what a claim found: the kind of a claimReply. The letters
// are those of lua/claim.lua's array replies.
type replyKind byte

// The kinds of claim replies.
const (
	replyClaimed   replyKind = 'c' // the caller owns the key now
	replyBusy      replyKind = 'b' // another owner holds a live lease
	replyDone      replyKind = 'd' // a stored result
	replyFailed    replyKind = 'f' // a stored permanent failure
	replyConflict  replyKind = 'x' // the key was used with another fingerprint
	replyLateRetry replyKind = 't' // no record, but its tombstone (WithTombstones)
	replyBadRecord replyKind = 'v' // a record this version does not understand
	replyParked    replyKind = 'k' // the operation is parked: nobody takes it over
	replyGone      replyKind = 'g' // a recovery's: nothing left to recover
)

// claimReply is a decoded reply of lua/claim.lua.
type claimReply struct {
	kind      replyKind
	n         int64         // attempt number (claimed, busy)
	leaseLeft time.Duration // (claimed, busy)
	payload   string        // result (done), message (failed), reason (bad record)
	owner     string        // the owner's token: of the live lease (busy; "" when the reply has none), of the finished attempt (done, failed)
	age       time.Duration // of a finished record (done, failed), when the claim asked for it; -1 unknown
}

// claimRecord builds the record of a claim (see lua/record.lua): attempt n
// in progress, with fingerprint digest fp, owner token and the lease mark,
// as claim.lua writes it and renew.lua keeps it. claim.lua stores it as it
// is when the key is new; complete.lua finds it unchanged while the claim
// is the caller's.
func (c *Client) claimRecord(fp, token string, n int64) []byte {
	b := make([]byte, 0, headerSize(fp, token)+len(c.mark))
	return append(appendHeader(b, recordInProgress, fp, token, n), c.mark...)
}

// headerSize bounds the size of a record's header (appendHeader).
func headerSize(fp, token string) int { return 3 + len(fp) + 1 + len(token) + 20 + 1 }

// appendHeader appends the header of a record in state st (see
// lua/record.lua), "1" st len(fp) fp len(token) token n ":", to b.
func appendHeader(b []byte, st recordState, fp, token string, n int64) []byte {
	b = append(b, recordVersion, byte(st), byte(len(fp)))
	b = append(b, fp...)
	b = append(b, byte(len(token)))
	b = append(b, token...)
	b = strconv.AppendInt(b, n, 10)
	return append(b, ':')
}

// replyBytes returns the bytes of s, a string cut from a go-redis reply,
// without copying them: a replayed result may be large. go-redis reads each
// bulk reply into a []byte of its own and hands it out as a string without
// a copy (as its StringCmd.Bytes hands such bytes back without one); once
// the command is dropped, nothing else refers to them, so they can be the
// caller's.
func replyBytes(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// claimResult reads a reply of lua/claim.lua to a call with fingerprint
// digest fp and the given lease: an attempt number (claimed, with the whole
// lease), 0 (a conflict), a finished record (see readFinished), or an array
// (see parseClaim).
func claimResult(v any, fp string, lease, retention time.Duration) (claimReply, error) {
	switch v := v.(type) {
	case int64:
		switch {
		case v == 0:
			return claimReply{kind: replyConflict}, nil
		case v >= 1:
			return claimReply{kind: replyClaimed, n: v, leaseLeft: lease}, nil
		}
	case string:
		return readFinished(v, fp), nil
	case []any:
		if len(v) == 2 {
			if s, ok := v[0].(string); ok && len(s) > 1 {
				// A finished record and its PTTL (claim.lua's ARGV[3]).
				pttl, ok := v[1].(int64)
				if !ok {
					break
				}
				r := readFinished(s, fp)
				r.age = -1
				if pttl >= 0 && retention > 0 {
					r.age = max(retention-time.Duration(pttl)*time.Millisecond, 0)
				}
				return r, nil
			}
		}
		return parseClaim(v)
	}
	return claimReply{}, fmt.Errorf("%w: unexpected claim reply %v", ErrCorrupt, v)
}

// readFinished reads a finished record, which claim.lua returns whole (see
// lua/record.lua for the format), for a call with fingerprint digest fp:
// its outcome (done or failed, with the payload), a conflict when the
// stored fingerprint differs, or a bad record with the reason when the
// record is not one this version understands. It checks what
// lua/record.lua's parse checks.
func readFinished(s, fp string) claimReply {
	bad := claimReply{kind: replyBadRecord, payload: "malformed record"}
	if s == "" || s[0] != recordVersion {
		return claimReply{kind: replyBadRecord, payload: "unknown record version"}
	}
	kind := replyDone
	switch {
	case len(s) < 3:
		return bad
	case recordState(s[1]) == recordFailed:
		kind = replyFailed
	case recordState(s[1]) != recordDone:
		return bad
	}
	fpEnd := 3 + int(s[2]) // fp is s[3:fpEnd]; the owner's length byte is at fpEnd
	if fpEnd+1 > len(s) || fpEnd+1+int(s[fpEnd]) >= len(s) {
		return bad // lengths past the end, or no attempt number after the owner
	}
	nStart := fpEnd + 1 + int(s[fpEnd])
	colon := strings.IndexByte(s[nStart:], ':')
	if colon < 1 || colon > 15 {
		return bad
	}
	n := s[nStart : nStart+colon]
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return bad
		}
	}
	if strings.Trim(n, "0") == "" {
		return bad // attempt 0
	}
	if stored := s[3:fpEnd]; fp != "" && stored != "" && stored != fp {
		return claimReply{kind: replyConflict}
	}
	return claimReply{kind: kind, payload: s[nStart+colon+1:], owner: s[fpEnd+1 : nStart]}
}

// notified reads a notification that complete.lua published (see there)
// to a waiter with fingerprint digest fp that saw the key busy with
// owner's attempt: the outcome it carries (done or failed, as readFinished
// reads it) when it is a finished record of owner's attempt, else
// ok=false: the waiter claims again.
func notified(msg, fp, owner string) (r claimReply, ok bool) {
	r = readFinished(msg, fp)
	return r, (r.kind == replyDone || r.kind == replyFailed) && owner != "" && r.owner == owner
}

// parseClaim reads the array replies of lua/claim.lua: claimed before,
// busy, or a record this version does not understand.
func parseClaim(v []any) (claimReply, error) {
	bad := func() (claimReply, error) {
		return claimReply{}, fmt.Errorf("%w: unexpected claim reply %v", ErrCorrupt, v)
	}
	if len(v) == 0 {
		return bad()
	}
	kind, _ := v[0].(string)
	if len(kind) != 1 {
		return bad()
	}
	r := claimReply{kind: replyKind(kind[0])}
	switch r.kind {
	case replyClaimed, replyBusy:
		if len(v) == 4 && r.kind == replyBusy {
			owner, ok := v[3].(string)
			if !ok {
				return bad()
			}
			r.owner, v = owner, v[:3]
		}
		if len(v) != 3 {
			return bad()
		}
		a, ok1 := v[1].(int64)
		b, ok2 := v[2].(int64)
		if !ok1 || !ok2 {
			return bad()
		}
		if r.kind == replyBusy {
			a, b = b, a
		}
		// a is the attempt number, b the lease left in ms: a busy lease has
		// some left; none lasts 30 years.
		if a < 1 || b < 0 || b > 1<<40 || (r.kind == replyBusy && b == 0) {
			return bad()
		}
		r.n, r.leaseLeft = a, time.Duration(b)*time.Millisecond
	case replyLateRetry, replyGone:
		if len(v) != 1 {
			return bad()
		}
	case replyParked:
		n, ok1 := v[1%len(v)].(int64)
		step, ok2 := v[2%len(v)].(string)
		if len(v) != 3 || !ok1 || !ok2 || n < 1 {
			return bad()
		}
		r.n, r.payload = n, step
	case replyBadRecord:
		if len(v) != 2 {
			return bad()
		}
		s, ok := v[1].(string)
		if !ok {
			return bad()
		}
		r.payload = s
	default:
		return bad()
	}
	return r, nil
}

// finishedRecord builds the record that stores an outcome (see
// lua/record.lua): state done with the result, or failed with the
// permanent error's message, as payload, after the header of attempt n claimed with
// fingerprint digest fp and owner token. Built here, it reaches Redis as
// one argument that complete.lua stores as it is: Lua copies nothing.
//
// A large record's buffer comes from recordBufs and goes back there when
// free is called, once the record is sent for good: go-redis writes a
// command's arguments while it runs and keeps nothing of them after.
func finishedRecord(state recordState, fp, token string, n int64, payload []byte) (record []byte, free func()) {
	size := headerSize(fp, token) + len(payload)
	var buf *[]byte
	if size >= pooledRecord {
		buf, _ = recordBufs.Get().(*[]byte)
		if buf == nil || cap(*buf) < size {
			buf = new([]byte)
			*buf = make([]byte, 0, size)
		}
		record = (*buf)[:0]
	} else {
		record = make([]byte, 0, size)
	}
	record = append(appendHeader(record, state, fp, token, n), payload...)
	if buf == nil {
		return record, func() {}
	}
	return record, func() { recordBufs.Put(buf) }
}

// recordBufs recycles the buffers of finished records of at least
// pooledRecord bytes (as *[]byte): without it, every large result would
// cost an allocation of its size, and the garbage collections that follow.
var recordBufs sync.Pool

const pooledRecord = 64 << 10

// A failed record's payload (its tail) is either of
//
//	message                         an error without a code
//	0x00 0x01 len(code) code message an error with a code, or a message
//	                                that starts with 0x00
//
// len(code) is one byte. lua/*.lua treat the payload as opaque bytes;
// readFailure reads any payload that is not a well-formed coded one as a
// message.
const failureCoded = "\x00\x01"

// minFailureSize is the least room a failure's payload gets, whatever
// WithMaxResultSize says: enough for the code and a readable message.
const minFailureSize = 256

// failurePayload builds the payload of a failed record for err: its code
// (see Code) and its message, cut to fit max(limit, minFailureSize) bytes
// with a note saying so. fn has acted, so a long message is cut, never
// refused.
func failurePayload(err error, limit int) []byte {
	code, msg := Code(err), err.Error()
	if len(code) > maxCodeLen {
		code = code[:maxCodeLen] // a StoredError made by hand
	}
	limit = max(limit, minFailureSize)
	head := 0
	if code != "" || strings.HasPrefix(msg, "\x00") {
		head = len(failureCoded) + 1 + len(code)
	}
	if head+len(msg) > limit {
		note := fmt.Sprintf(" [idem: message cut from %d bytes]", len(msg))
		n := max(limit-head-len(note), 0)
		for n > 0 && n < len(msg) && !utf8.RuneStart(msg[n]) {
			n-- // not in the middle of a character
		}
		msg = msg[:n] + note
	}
	b := make([]byte, 0, head+len(msg))
	if head > 0 {
		b = append(b, failureCoded...)
		b = append(b, byte(len(code)))
		b = append(b, code...)
	}
	return append(b, msg...)
}

// readFailure reads the payload of a failed record (see failurePayload)
// into the error that replays it.
func readFailure(payload string) *StoredError {
	if rest, ok := strings.CutPrefix(payload, failureCoded); ok && len(rest) > 0 && 1+int(rest[0]) <= len(rest) {
		n := 1 + int(rest[0])
		return &StoredError{Code: rest[1:n], Message: rest[n:]}
	}
	return &StoredError{Message: payload}
}
