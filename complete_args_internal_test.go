package idem

import (
	"reflect"
	"testing"
)

// TestCompleteArgsFilledOnce guards the claim that a completion's command
// list, which a pipeline a caller gave up on may still read, is never
// changed once made: completeArgs lays the first out in the call's own
// completeCmd, and a later one (another record) in a new slice, leaving
// the first as it was. It would fail if completeArgs reused completeCmd
// for every completion (the completeUsed guard dropped), which no test
// through Do reaches today, for a call completes once.
func TestCompleteArgsFilledOnce(t *testing.T) {
	t.Parallel()
	c := &Client{publish: "PUBLISH"}
	cl := &call{c: c, claimed: "claim"}
	cl.keys, cl.claimKeys = c.callKeys("k", &cl.keySet)
	cl.claimCmd = [8]any{2: len(cl.claimKeys), 3: cl.claimKeys[0], 4: cl.claimKeys[1]}
	want := func(record []byte, ttl any) []any {
		return []any{nil, nil, 2, cl.keys[0], cl.keys[1], "claim", record, ttl, "PUBLISH"}
	}
	first := cl.completeArgs([]byte("one"), 10)
	if !reflect.DeepEqual(first, want([]byte("one"), 10)) {
		t.Fatalf("the first completion's list: %v", first)
	}
	if &first[0] != &cl.completeCmd[0] {
		t.Fatal("the first completion's list is not the call's completeCmd")
	}
	second := cl.completeArgs([]byte("two"), 20)
	if !reflect.DeepEqual(second, want([]byte("two"), 20)) {
		t.Fatalf("the second completion's list: %v", second)
	}
	if !reflect.DeepEqual(first, want([]byte("one"), 10)) {
		t.Fatalf("the second completion changed the first's list: %v", first)
	}
}
