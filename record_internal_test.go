package idem

import (
	"strings"
	"testing"
)

// notified trusts a notification only as the finished record of the owner
// the waiter saw, with a fingerprint that does not conflict.
func TestNotified(t *testing.T) {
	t.Parallel()
	rec := func(st byte, fp, owner string, n int64, payload string) string {
		return string(append(appendHeader(nil, recordState(st), fp, owner, n), payload...))
	}
	cases := []struct {
		name, msg, fp, owner string
		ok                   bool
		kind                 byte
		payload              string
	}{
		{"done, the owner's", rec('d', "F", "tokA", 3, "result"), "F", "tokA", true, 'd', "result"},
		{"failed, the owner's", rec('f', "F", "tokA", 1, "boom"), "F", "tokA", true, 'f', "boom"},
		{"empty result", rec('d', "F", "tokA", 1, ""), "F", "tokA", true, 'd', ""},
		{"fingerprint not checked by the owner", rec('d', "", "tokA", 1, "r"), "F", "tokA", true, 'd', "r"},
		{"another owner's", rec('d', "F", "tokB", 2, "stale"), "F", "tokA", false, 0, ""},
		{"owner token is a prefix", rec('d', "F", "tok", 1, "r"), "F", "tokA", false, 0, ""},
		{"conflicting fingerprint", rec('d', "G", "tokA", 1, "r"), "F", "tokA", false, 0, ""},
		{"in progress, not finished", rec('p', "F", "tokA", 1, "100"), "F", "tokA", false, 0, ""},
		{"released", rec('r', "F", "tokA", 1, "100"), "F", "tokA", false, 0, ""},
		{"a state only", "d", "F", "tokA", false, 0, ""},
		{"unknown owner (an older script's busy reply)", rec('d', "F", "", 1, "r"), "F", "", false, 0, ""},
		{"lengths past the end", "1d\x05F\x04tokA1:r", "F", "tokA", false, 0, ""},
		{"owner length past the end", "1d\x01F\x7ftokA1:r", "F", "tokA", false, 0, ""},
		{"no attempt number", "1d\x01F\x04tokA:r", "F", "tokA", false, 0, ""},
		{"unknown version", "2" + rec('d', "F", "tokA", 1, "r")[1:], "F", "tokA", false, 0, ""},
	}
	for _, tc := range cases {
		r, ok := notified(tc.msg, tc.fp, tc.owner)
		if ok != tc.ok || (ok && (byte(r.kind) != tc.kind || r.payload != tc.payload)) {
			t.Errorf("%s: notified(%q) = %c %q %v; want %c %q %v", tc.name, tc.msg, r.kind, r.payload, ok, tc.kind, tc.payload, tc.ok)
		}
	}
}

// callKeys builds the keys that Client.keys and the steps' suffix make,
// escaped keys included, in one allocation for a key without '\' or '}'. (Not parallel:
// AllocsPerRun counts the whole process's allocations.)
func TestCallKeys(t *testing.T) {
	c := &Client{cfg: config{prefix: "idem"}}
	for _, key := range []string{"k", "", `a\b}c`, "}}}}\\\\", "a-much-longer-key-0123456789abcdef"} {
		var set [4]string
		keys, claimKeys := c.callKeys(key, &set)
		want := c.keys(key)
		if len(keys) != 2 || keys[0] != want[0] || keys[1] != want[1] {
			t.Errorf("callKeys(%q) keys = %q, want %q", key, keys, want)
		}
		if len(claimKeys) != 2 || claimKeys[0] != want[0] || claimKeys[1] != want[0]+stepsSuffix {
			t.Errorf("callKeys(%q) claimKeys = %q, want %q", key, claimKeys, []string{want[0], want[0] + stepsSuffix})
		}
		if strings.ContainsAny(key, `\}`) {
			continue // escaping may grow the text past its first guess
		}
		if got := testing.AllocsPerRun(100, func() { c.callKeys(key, &set) }); got > 1 {
			t.Errorf("callKeys(%q) allocates %v times, want 1", key, got)
		}
	}
}
