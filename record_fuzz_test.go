package idem

// FuzzRecord and FuzzStatus: records as stored (built field by field, or
// arbitrary bytes) read by Do and Status, on miniredis or a real server.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// recordInt parses an integer field of a record (an attempt number, a
// lease mark) as lua/record.lua's count does: 1 to 15 decimal digits and
// nothing else (no sign, space, fraction, exponent or hex), so exact in
// Lua's doubles. Anything else is a damaged record.
func recordInt(s string) (int64, bool) {
	if len(s) < 1 || len(s) > 15 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// wantStatus is the contract of lua/status.lua's reply (see its header):
// what parseStatus must accept, and how it must read it. A reply is
// {nowMs, pttlMs, st, n, lu, tomb}: absent ("", PTTL -2, n and lu 0, tomb
// 1 with a tombstone, else 0), in progress or released ("p", "r": attempt
// n of at least 1, lease end lu of at least 0), done or failed ("d", "f":
// attempt n of at least 1, lu 0), and a present record has PTTL -1 or at
// least 0 and tomb 0. {"v", reason} and everything else is ErrCorrupt.
func wantStatus(v []any) (Status, bool) {
	if len(v) != 6 {
		return Status{}, false
	}
	tomb, ok := v[5].(int64)
	if !ok || tomb != 0 && tomb != 1 || tomb == 1 && v[2] != "" {
		return Status{}, false
	}
	now, ok1 := v[0].(int64)
	pttl, ok2 := v[1].(int64)
	st, ok3 := v[2].(string)
	n, ok4 := v[3].(int64)
	lu, ok5 := v[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return Status{}, false
	}
	var s Status
	switch st {
	case "":
		return Status{Tombstone: tomb == 1}, pttl == -2 && n == 0 && lu == 0
	case "p":
		s.State = StateInProgress
	case "r":
		s.State = StateReleased
	case "d":
		s.State = StateDone
	case "f":
		s.State = StateFailed
	default:
		return Status{}, false
	}
	if n < 1 || lu < 0 || pttl < -1 || ((st == "d" || st == "f") && lu != 0) {
		return Status{}, false
	}
	s.Attempt = n
	if lu > 0 {
		s.LeaseEnds = time.UnixMilli(lu)
	}
	if pttl >= 0 {
		s.Expires = time.UnixMilli(now + pttl)
	}
	return s, true
}

func FuzzStatus(f *testing.F) {
	const now = int64(1700000000000)
	for _, v := range [][]any{
		{now, int64(-2), "", int64(0), int64(0), int64(0)},
		{now, int64(-2), "", int64(0), int64(0), int64(1)}, // a tombstone
		{now, int64(86400000), "p", int64(1), now + 30000, int64(0)},
		{now, int64(86400000), "r", int64(3), now - 1, int64(0)},
		{now, int64(86400000), "d", int64(2), int64(0), int64(0)},
		{now, int64(-1), "f", int64(1), int64(0), int64(0)},
		// Malformed.
		{now, int64(86400000), "d", int64(2), int64(0), int64(1)}, // a tombstone beside a record
		{now, int64(-2), "", int64(0), int64(0), int64(2)},
		{now, int64(-2), "", int64(0), int64(0), "1"},
		{now, int64(-2), "", int64(0), int64(0)}, // the reply of before tombstones
		{"v", "malformed record"},
		{"v", "unknown record version"},
		{"v"},
		{now, int64(5000), "?", int64(1), int64(0), int64(0)},
		{now, int64(5000), "", int64(0), int64(0), int64(0)},
		{now, int64(-2), "", int64(4), int64(0), int64(0)},
		{now, int64(5000), "r", int64(0), int64(0), int64(0)},
		{now, int64(5000), "r", int64(-1), int64(0), int64(0)},
		{now, int64(5000), "p", int64(1), int64(-5), int64(0)},
		{now, int64(5000), "d", int64(1), now, int64(0)},
		{now, int64(-7), "d", int64(1), int64(0), int64(0)},
		{"now", int64(5000), "d", int64(1), int64(0)},
		{now, "ttl", "d", int64(1), int64(0), int64(0)},
		{now, int64(5000), "d", "1", int64(0), int64(0)},
		{now, int64(5000), "d", int64(1), nil, int64(0)},
		{now, int64(5000), nil, int64(1), int64(0), int64(0)},
		{now, int64(5000), "d", int64(1)},
		{},
	} {
		f.Add("k", encodeReply(v))
	}
	f.Fuzz(func(t *testing.T, key string, data []byte) {
		v := decodeReply(data)
		got, err := parseStatus(key, v)
		want, ok := wantStatus(v)
		switch {
		case !ok && err == nil:
			t.Fatalf("parseStatus(%#v) accepted a malformed reply: %+v", v, got)
		case !ok && !errors.Is(err, ErrCorrupt):
			t.Fatalf("parseStatus(%#v): error %v does not wrap ErrCorrupt", v, err)
		case ok && err != nil:
			t.Fatalf("parseStatus(%#v): %v, want %+v", v, err, want)
		case ok && got != want:
			t.Fatalf("parseStatus(%#v) = %+v, want %+v", v, got, want)
		}
	})
}

// recordFields names FuzzRecord's field arguments, in order. formString
// builds a record from v, st, fp, own and n, with lu (the lease mark) as
// the tail when st is "p" or "r" and the payload otherwise. formHash
// writes them as the fields of a hash instead, bit i of the present mask
// saying whether field i is written: these were the fields of the
// in-progress record when it was a hash, but a record is now always a
// string, so a hash is corrupt whatever it holds.
var recordFields = []string{"v", "st", "fp", "own", "n", "lu"}

// recordTTL is the TTL of the strings FuzzRecord writes. A lease mark is
// read against it: a "p" record written with mark m has recordTTL - m of
// its lease left, less the time since it was written (Redis counts the
// TTL down; miniredis does not).
const recordTTL = time.Hour

// maxExactAttempt bounds the attempt numbers after which FuzzRecord checks
// the outcome exactly: a record holds at most 15 digits, so the attempt
// after 999999999999999 cannot be recorded (a damage the scripts would
// cause themselves after 10^15 attempts).
const maxExactAttempt = 1e15 - 1

// buildRecord builds a record string (lua/record.lua):
// "1" st len(fp) fp len(own) own n ":" tail, with v in place of "1". fp
// and own are cut to 255 bytes, the most a length byte can say.
func buildRecord(v, st, fp, own, n, tail string) string {
	fp, own = fp[:min(len(fp), 255)], own[:min(len(own), 255)]
	return v + st + string([]byte{byte(len(fp))}) + fp +
		string([]byte{byte(len(own))}) + own + n + ":" + tail
}

// fuzzRecord is the meaning of a record, by the data model of
// lua/record.lua, read independently of the scripts.
type fuzzRecord struct {
	raw       string // what was written, for messages
	absent    bool
	malformed string // why, if it is
	st        string // p, r, d, f
	fp        string
	own       string // the owner's token
	n         int64  // attempt number
	mark      int64  // lease mark ("p", "r"): the PTTL at which the lease ends
	payload   string // result or message ("d", "f")
}

// readString reads a record string: "1" st len(fp) fp len(own) own n ":"
// tail, with st one of "p", "r", "d", "f", fp and own within the string,
// n a record integer (recordInt) of at least 1 up to the first ':' after
// own, and the tail, for "p" and "r", a record integer too (the lease
// mark; recordInt takes no sign, so it is at least 0). The tail of "d"
// and "f" (the result, the message) is any bytes.
func readString(s string) fuzzRecord {
	bad := func(why string) fuzzRecord { return fuzzRecord{malformed: why} }
	if len(s) < 1 || s[0] != '1' {
		return bad("version")
	}
	if len(s) < 3 {
		return bad("too short")
	}
	r := fuzzRecord{st: s[1:2]}
	switch r.st {
	case "p", "r", "d", "f":
	default:
		return bad("state")
	}
	rest := s[2:]
	fl := int(rest[0])
	if len(rest) < 1+fl+1 {
		return bad("fp length")
	}
	r.fp, rest = rest[1:1+fl], rest[1+fl:]
	ol := int(rest[0])
	if len(rest) < 1+ol {
		return bad("own length")
	}
	r.own = rest[1 : 1+ol]
	ns, tail, ok := strings.Cut(rest[1+ol:], ":")
	if !ok {
		return bad("no ':'")
	}
	n, ok := recordInt(ns)
	if !ok || n < 1 {
		return bad("attempt")
	}
	r.n = n
	if r.st == "p" || r.st == "r" {
		m, ok := recordInt(tail)
		if !ok {
			return bad("lease mark")
		}
		r.mark = m
	} else {
		r.payload = tail
	}
	return r
}

// recordSeed is one case of FuzzRecord.
type recordSeed struct {
	form                           uint8
	v, st, fp, own, n, lu, payload string
	present, mode                  uint8
}

// recordSeeds are FuzzRecord's seeds, also run on a real redis-server by
// TestFuzzRecordSeedsOnRedis.
func recordSeeds() []recordSeed {
	const hashAll = 0x3f
	// mark is the lease mark of a record written with recordTTL whose
	// lease has left to run (ended left ago if left < 0).
	mark := func(left time.Duration) string { return strconv.FormatInt((recordTTL - left).Milliseconds(), 10) }
	live, ended := mark(30*time.Second), mark(0)
	return []recordSeed{
		// Released, whatever the mark: fn runs as attempt n+1.
		{formString, "1", "r", "", "", "1", mark(-time.Second), "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "41", "0", "", 0, modeMatching},
		{formString, "1", "r", "", "owner", "2", live, "", 0, modeFieldAsIs},
		{formRaw, "", "", "", "", "", "", "1r\x00\x001:0", 0, modeNoFingerprint},
		// In progress, the lease ended (a mark of at least recordTTL): fn
		// runs as attempt n+1.
		{formString, "1", "p", "", "dead-owner", "3", ended, "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "3", mark(-time.Minute), "", 0, modeMatching},
		{formString, "1", "p", "", "dead-owner", "9", "999999999999999", "", 0, modeNoFingerprint},
		// In progress, the lease live: ErrInProgress.
		{formString, "1", "p", "", "live-owner", "1", live, "", 0, modeMatching},
		{formString, "1", "p", "", "live-owner", "2", "0", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "live-owner", "5", "000" + live, "", 0, modeFieldAsIs},
		{formRaw, "", "", "", "", "", "", "1p\x00\x00" + "1:0", 0, modeNoFingerprint},
		// Done and failed: the stored outcome, whatever its bytes.
		{formString, "1", "d", "", "owner", "1", "", "stored", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "2", "", "", 0, modeMatching},
		{formString, "1", "d", "", "owner", "7", "", "a:b:c", 0, modeMatching},
		{formString, "1", "d", "", "o:w:n", "4", "later", "1p\x00\x001:0", 0, modeNoFingerprint},
		{formString, "1", "f", "", "owner", "2", "", "declined", 0, modeFieldAsIs},
		{formString, "1", "f", "", "owner", "1", "", "", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d\x00\x001:stored", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1f\x02::\x01:1:x:\x00", 0, modeNoFingerprint},
		// Another fingerprint: ErrConflict, in every state.
		{formString, "1", "r", "other", "", "1", "0", "", 0, modeFieldAsIs},
		{formString, "1", "p", "other", "live-owner", "1", live, "", 0, modeFieldAsIs},
		{formString, "1", "p", "other", "dead-owner", "1", "999999999999999", "", 0, modeFieldAsIs},
		{formString, "1", "d", "other", "owner", "1", "", "x", 0, modeFieldAsIs},
		{formString, "1", "f", strings.Repeat("f", 255), "owner", "1", "", "x", 0, modeFieldAsIs},
		// Attempt numbers: leading zeros, and 15 digits, the most a record
		// holds.
		{formString, "1", "r", "", "", "007", "0", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "123456789012345", "0", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "live-owner", "999999999999999", "0", "", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "999999999999999", "", "x", 0, modeNoFingerprint},
		// Absent: fn runs as attempt 1.
		{formHash, "", "", "", "", "", "", "", 0, modeMatching},
		// Malformed. The version:
		{formString, "2", "d", "", "owner", "1", "", "x", 0, modeNoFingerprint},
		{formString, "0", "p", "", "owner", "1", "0", "", 0, modeNoFingerprint},
		{formString, "", "r", "", "", "1", "0", "", 0, modeNoFingerprint},
		// The state:
		{formString, "1", "?", "", "owner", "1", "", "x", 0, modeNoFingerprint},
		{formString, "1", "P", "", "owner", "1", "0", "", 0, modeNoFingerprint},
		{formString, "1", "", "", "owner", "1", "", "x", 0, modeNoFingerprint},
		// The attempt number: empty, not a decimal count, below 1, or more
		// than 15 digits.
		{formString, "1", "d", "", "owner", "", "", "x", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "x", "0", "", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "0", "", "x", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "0", "0", "", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "-4", "", "x", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "-1", "0", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "+1", "0", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "0x10", "0", "", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "0x1", "", "x", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", " 2", "0", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2 ", live, "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1.5", "0", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "1e3", "0", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1234567890123456", "0", "", 0, modeNoFingerprint},
		{formString, "1", "d", "", "owner", "99999999999999999999", "", "x", 0, modeNoFingerprint},
		// The lease mark of "p" and "r": empty, or not a decimal count of
		// at most 15 digits.
		{formString, "1", "p", "", "", "2", "later", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", "-1", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", "1e3", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "owner", "2", "", "x", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", " 5", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", "0x10", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", "1.5", "", 0, modeNoFingerprint},
		{formString, "1", "p", "", "", "2", "1234567890123456", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1", "later", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1", "-1", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1", "1e3", "", 0, modeMatching},
		{formString, "1", "r", "", "", "1", "", "", 0, modeNoFingerprint},
		{formString, "1", "r", "", "", "1", "0:0", "", 0, modeNoFingerprint},
		// Truncated: too short, lengths past the end, no attempt, no ':'.
		{formRaw, "", "", "", "", "", "", "", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d\x05ab", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1p\x00", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d\x00\x00", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1r\x00\x05abcde", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d\x00\x09own:1:x", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1d\x00\x001", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1p\x00\x00:0", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "1r\x00\x001:", 0, modeNoFingerprint},
		// Not a string: a hash, whatever its fields (even all those of the
		// in-progress record when it was a hash), and a list; and garbage.
		{formHash, "1", "r", "", "", "1", "0", "", hashAll, modeNoFingerprint},
		{formHash, "1", "p", "", "live-owner", "1", "0", "", hashAll, modeMatching},
		{formHash, "", "", "", "", "3", "", "", 1 << 4, modeNoFingerprint},
		{formHash, "1", "p", strings.Repeat("f", 300), "dead-owner", "3", "0", "", hashAll, modeFieldAsIs},
		{formList, "", "", "", "", "", "", "x", 0, modeNoFingerprint},
		{formList, "", "", "", "", "", "", "1d\x00\x001:stored", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "garbage", 0, modeNoFingerprint},
		{formRaw, "", "", "", "", "", "", "\xff\x00\xfe", 0, modeNoFingerprint},
	}
}

// recordEnv is where FuzzRecord writes its records.
type recordEnv struct {
	rdb *redis.Client
	c   *Client
	seq atomic.Int64
}

func newRecordEnv(tb testing.TB, real bool) *recordEnv {
	var addr string
	if real {
		addr = redistest.Start(tb, redistest.Config{}).Addr()
	} else {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(mr.Close)
		addr = mr.Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	c := New(rdb, WithWait(0), WithStoreTimeout(time.Second))
	tb.Cleanup(func() { _ = c.Close() })
	return &recordEnv{rdb: rdb, c: c}
}

// FuzzRecord writes an arbitrary record and runs Do on it: on miniredis,
// or on a real redis-server when IDEM_FUZZ_REDIS=1. A record is a string,
// written with a TTL of recordTTL. Do must never panic, and must do what
// the record calls for:
//
//   - malformed (see readString), or not a string at all (a hash, a
//     list): ErrCorrupt, fn not run, and Status fails too;
//   - another fingerprint: ErrConflict, fn not run;
//   - done: the stored result; failed: a *StoredError with the message
//     and code that the payload holds (see readFailure);
//   - in progress with a live lease (a mark well below recordTTL):
//     ErrInProgress (Do does not wait here);
//   - released (whatever its mark), in progress with an ended lease (a
//     mark of at least recordTTL), or absent: fn runs, as attempt n+1 (1
//     when absent), and the record is then done with it;
//   - in progress with a lease that ends about when Do reads it: either
//     of the last two.
//
// Status must agree with Do: it fails on a malformed record, and otherwise
// reports the state and attempt that Do left, and for a record that is
// still "p" or "r" the lease end its mark gives (the record's expiry less
// the mark; none when that is not after 1970).
func FuzzRecord(f *testing.F) {
	for _, s := range recordSeeds() {
		f.Add(s.form, s.v, s.st, s.fp, s.own, s.n, s.lu, s.payload, s.present, s.mode)
	}
	env := newRecordEnv(f, os.Getenv("IDEM_FUZZ_REDIS") == "1")
	f.Fuzz(func(t *testing.T, form uint8, v, st, fp, own, n, lu, payload string, present, mode uint8) {
		env.check(t, recordSeed{form, v, st, fp, own, n, lu, payload, present, mode})
	})
}

// TestFuzzRecordSeedsOnRedis runs FuzzRecord's seeds on a real redis-server,
// whose Lua is not miniredis's.
func TestFuzzRecordSeedsOnRedis(t *testing.T) {
	t.Parallel()
	env := newRecordEnv(t, true)
	for i, s := range recordSeeds() {
		t.Run(strconv.Itoa(i), func(t *testing.T) { env.check(t, s) })
	}
}

func (env *recordEnv) check(t *testing.T, s recordSeed) {
	ctx := context.Background()
	rdb, c := env.rdb, env.c
	key := fmt.Sprintf("fuzz-%d", env.seq.Add(1))
	rk := c.recordKey(key)
	defer rdb.Del(ctx, rk)
	form, mode, fp := s.form%4, s.mode%3, s.fp
	callFP := "fp"
	if mode == modeNoFingerprint {
		callFP = ""
	}
	if mode == modeMatching {
		fp = digest(callFP)
	}

	written := time.Now().UnixMilli()
	var rec fuzzRecord
	var err error
	switch form {
	case formHash:
		values := []string{s.v, s.st, fp, s.own, s.n, s.lu}
		var args []any
		fields := map[string]string{}
		for i, name := range recordFields {
			if s.present&(1<<i) != 0 {
				args = append(args, name, values[i])
				fields[name] = values[i]
			}
		}
		// A hash is not a record, whatever its fields; no field at all
		// writes nothing.
		rec = fuzzRecord{malformed: "a hash"}
		if len(args) > 0 {
			err = rdb.HSet(ctx, rk, args...).Err()
		} else {
			rec = fuzzRecord{absent: true}
		}
		var fs []string
		for _, name := range recordFields {
			if v, ok := fields[name]; ok {
				fs = append(fs, name+"="+short(v))
			}
		}
		rec.raw = "hash {" + strings.Join(fs, " ") + "}"
	case formString:
		tail := s.payload
		if s.st == "p" || s.st == "r" {
			tail = s.lu
		}
		str := buildRecord(s.v, s.st, fp, s.own, s.n, tail)
		err = rdb.Set(ctx, rk, str, recordTTL).Err()
		rec = readString(str)
		rec.raw = "string " + short(str)
	case formRaw:
		err = rdb.Set(ctx, rk, s.payload, recordTTL).Err()
		rec = readString(s.payload)
		rec.raw = "string " + short(s.payload)
	case formList:
		err = rdb.RPush(ctx, rk, s.payload).Err()
		rec = fuzzRecord{malformed: "a list", raw: "list [" + short(s.payload) + "]"}
	}
	if err != nil {
		t.Fatal(err)
	}
	conflict := !rec.absent && rec.malformed == "" && callFP != "" && rec.fp != "" && rec.fp != digest(callFP)

	var ran []int64
	got, err := c.Do(ctx, key, callFP, func(ctx context.Context) ([]byte, error) {
		a, _ := AttemptFrom(ctx)
		ran = append(ran, a.Number)
		return []byte("ran"), nil
	})
	claimed := time.Now().UnixMilli()
	status, serr := c.Status(ctx, key)
	after := time.Now().UnixMilli()

	// A "p" record's lease had recordTTL - mark left when it was written,
	// and as much less as its TTL has counted down since, at most the time
	// until Do returned: live for sure below a slack of that (and at least
	// 5 s), ended for sure from recordTTL on.
	ttl := recordTTL.Milliseconds()
	slack := max(5000, claimed-written+1000)
	liveLease := rec.st == "p" && rec.mark < ttl-slack
	endedLease := rec.st == "p" && rec.mark >= ttl

	verdict := fmt.Sprintf("state %q, attempt %d, fp %s", rec.st, rec.n, short(rec.fp))
	switch {
	case rec.absent:
		verdict = "absent"
	case rec.malformed != "":
		verdict = "malformed: " + rec.malformed
	case rec.st == "p" || rec.st == "r":
		verdict += fmt.Sprintf(", lease mark %d", rec.mark)
	}
	desc := fmt.Sprintf("%s (%s), Do with fingerprint %q", rec.raw, verdict, callFP)
	if len(ran) > 1 {
		t.Fatalf("%s: fn ran %d times", desc, len(ran))
	}
	claimable := func() {
		want := rec.n + 1
		if rec.n >= maxExactAttempt {
			// fn runs, but the record cannot hold the next attempt number.
			if len(ran) != 1 {
				t.Fatalf("%s: claimable: Do gave (%q, %v) and did not run fn; want fn to run", desc, got, err)
			}
			return
		}
		if len(ran) != 1 || err != nil || string(got) != "ran" {
			t.Fatalf("%s: claimable: Do gave (%q, %v), ran fn %v; want fn to run", desc, got, err, ran)
		}
		if ran[0] != want {
			t.Fatalf("%s: fn ran as attempt %d, want %d", desc, ran[0], want)
		}
		if serr != nil || status.State != StateDone || status.Attempt != want || !status.LeaseEnds.IsZero() {
			t.Fatalf("%s: after fn ran: Status %+v, %v; want done, attempt %d, no lease end", desc, status, serr, want)
		}
	}
	switch {
	case rec.malformed != "":
		if len(ran) > 0 || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: malformed record: Do gave (%q, %v) and ran fn %v; want ErrCorrupt and fn not run", desc, got, err, ran)
		}
		if serr == nil {
			t.Fatalf("%s: malformed record: Status gave %+v, want an error", desc, status)
		}
		return
	case conflict:
		if len(ran) > 0 || !errors.Is(err, ErrConflict) {
			t.Fatalf("%s: Do gave (%q, %v), ran fn %v; want ErrConflict", desc, got, err, ran)
		}
	case rec.st == "d":
		if len(ran) > 0 || err != nil || string(got) != rec.payload {
			t.Fatalf("%s: Do gave (%q, %v), ran fn %v; want the stored result", desc, got, err, ran)
		}
	case rec.st == "f":
		var se *StoredError
		if len(ran) > 0 || !errors.As(err, &se) || *se != *readFailure(rec.payload) {
			t.Fatalf("%s: Do gave (%q, %v), ran fn %v; want the stored error", desc, got, err, ran)
		}
	case rec.st == "p" && !liveLease && !endedLease:
		// The lease ends about now: either answer is right.
		if len(ran) > 0 {
			claimable()
			return
		}
		if !errors.Is(err, ErrInProgress) {
			t.Fatalf("%s: Do gave (%q, %v); want fn to run or ErrInProgress", desc, got, err)
		}
	case liveLease:
		if len(ran) > 0 || !errors.Is(err, ErrInProgress) {
			t.Fatalf("%s: live lease: Do gave (%q, %v), ran fn %v; want ErrInProgress", desc, got, err, ran)
		}
	default: // absent, released, or a lease that ended
		claimable()
		return
	}
	// fn did not run: the record is as it was.
	wantState := map[string]State{"p": StateInProgress, "r": StateReleased, "d": StateDone, "f": StateFailed}[rec.st]
	if serr != nil || status.State != wantState || status.Attempt != rec.n {
		t.Fatalf("%s: Status %+v, %v; want %v, attempt %d", desc, status, serr, wantState, rec.n)
	}
	// The lease end is the record's expiry less the mark, none if that is
	// not after 1970 (and none for "d" and "f"). The expiry is recordTTL
	// after the write on Redis, whose TTLs count down, and recordTTL after
	// Status ran on miniredis, whose TTLs do not: either way between
	// written and after, give or take a second.
	var lo, hi int64
	if rec.st == "p" || rec.st == "r" {
		lo = max(written+ttl-rec.mark-1000, 0)
		hi = max(after+ttl-rec.mark+1000, 0)
	}
	var ends int64
	if !status.LeaseEnds.IsZero() {
		ends = status.LeaseEnds.UnixMilli()
	}
	if ends < lo || ends > hi {
		t.Fatalf("%s: Status %+v: lease end %d ms, want between %d and %d (0 = none)", desc, status, ends, lo, hi)
	}
}

// short quotes s for a message, cut to its first 40 bytes.
func short(s string) string {
	if len(s) <= 40 {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q…(%d bytes)", s[:40], len(s))
}

// Forms of the record FuzzRecord writes, by its form argument (mod 4).
const (
	formHash   = iota // not a record: a hash of the fields given (see recordFields)
	formString        // a record string built from the fields given (buildRecord)
	formRaw           // a string of arbitrary bytes (the payload argument)
	formList          // not a record: a list
)

// Ways FuzzRecord calls Do, by its mode argument (mod 3).
const (
	modeNoFingerprint = iota // Do with the empty fingerprint: not checked
	modeFieldAsIs            // Do with fingerprint "fp"; the record's fp is the fuzzed bytes
	modeMatching             // Do with fingerprint "fp"; the record's fp is its digest
)
