package faultconn

import (
	"fmt"
	"slices"
	"testing"
)

func TestParseCommand(t *testing.T) {
	set := "*3\r\n$3\r\nset\r\n$1\r\nk\r\n$5\r\na\r\nb\x00\r\n"
	get := "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
	b := []byte(set + get)

	cmd, n, err := parseCommand(b)
	if err != nil || n != len(set) {
		t.Fatalf("parseCommand(set+get) = %q, %d, %v; want the SET, %d bytes", cmd, n, err, len(set))
	}
	if want := []string{"SET", "k", "a\r\nb\x00"}; !slices.Equal(cmd, want) {
		t.Errorf("cmd = %q, want %q", cmd, want)
	}
	cmd, n, err = parseCommand(b[n:])
	if err != nil || n != len(get) || !slices.Equal(cmd, []string{"GET", "k"}) {
		t.Errorf("second command = %q, %d, %v; want GET k, %d bytes", cmd, n, err, len(get))
	}

	// Every proper prefix is incomplete, not an error.
	for i := range len(set) {
		if cmd, n, err := parseCommand([]byte(set[:i])); n != 0 || err != nil {
			t.Errorf("parseCommand(%q) = %q, %d, %v; want incomplete", set[:i], cmd, n, err)
		}
	}

	for _, bad := range []string{"PING\r\n", "*1\r\n+OK\r\n", "*x\r\n", "*1\r\n$3\r\nabcd\r\n", "*-1\r\n"} {
		if _, _, err := parseCommand([]byte(bad)); err == nil {
			t.Errorf("parseCommand(%q) accepted it", bad)
		}
	}

	cmd, n, err = parseCommand([]byte("*0\r\n"))
	if err != nil || n != 4 || len(cmd) != 0 {
		t.Errorf("parseCommand(*0) = %q, %d, %v; want an empty command of 4 bytes", cmd, n, err)
	}
}

var replies = []string{
	"+OK\r\n",
	"-ERR wrong\r\n",
	":42\r\n",
	"$5\r\nhello\r\n",
	"$-1\r\n",
	"$0\r\n\r\n",
	"$4\r\n\r\n\r\n\r\n",
	"*-1\r\n",
	"*0\r\n",
	"*2\r\n$1\r\na\r\n:1\r\n",
	"*2\r\n*1\r\n+x\r\n$-1\r\n",
	"_\r\n",
	",3.14\r\n",
	"#t\r\n",
	"(123456789012345678901234567890\r\n",
	"!3\r\nerr\r\n",
	"=7\r\ntxt:abc\r\n",
	"%1\r\n+k\r\n:1\r\n",
	"~2\r\n+a\r\n+b\r\n",
	">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n",
	"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
	"*1\r\n|1\r\n+a\r\n:1\r\n+inner\r\n",
}

func TestReplyEnd(t *testing.T) {
	for _, r := range replies {
		b := []byte(r + "+next\r\n")
		n, err := replyEnd(b)
		if err != nil || n != len(r) {
			t.Errorf("replyEnd(%q) = %d, %v; want %d", b, n, err, len(r))
		}
		for i := range len(r) {
			if n, err := replyEnd([]byte(r[:i])); n != 0 || err != nil {
				t.Errorf("replyEnd(%q) = %d, %v; want incomplete", r[:i], n, err)
			}
		}
	}
	for _, bad := range []string{"x\r\n", "$3\r\nabcd\r\n", "*1\r\n?\r\n", "+OK\n", "$99999999999999999\r\n"} {
		if n, err := replyEnd([]byte(bad)); err == nil {
			t.Errorf("replyEnd(%q) = %d, nil; want an error", bad, n)
		}
	}
}

func FuzzReplyEnd(f *testing.F) {
	for _, r := range replies {
		f.Add([]byte(r))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := replyEnd(b)
		if err != nil {
			return
		}
		if n < 0 || n > len(b) {
			t.Fatalf("replyEnd(%q) = %d, outside the input", b, n)
		}
		if n == 0 {
			return
		}
		// A complete value stays complete, with the same length, whatever
		// follows it, and none of its prefixes is complete.
		if m, err := replyEnd(append(b[:n:n], "+x\r\n"...)); m != n || err != nil {
			t.Fatalf("replyEnd(%q + more) = %d, %v; want %d", b[:n], m, err, n)
		}
		for i := range n {
			if m, err := replyEnd(b[:i]); m != 0 || err != nil {
				t.Fatalf("replyEnd(prefix %q of %q) = %d, %v; want incomplete", b[:i], b[:n], m, err)
			}
		}
	})
}

func TestIsScriptAndIsCommand(t *testing.T) {
	const body = "return 1"
	const sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db" // sha1("return 1")
	for _, tc := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"EVALSHA", sha, "0"}, true},
		{[]string{"EVALSHA", "E0E1F9FABFC9D4800C877A703B823AC0578FF8DB", "0"}, true},
		{[]string{"EVALSHA_RO", sha, "0"}, true},
		{[]string{"EVAL", body, "0"}, true},
		{[]string{"EVAL_RO", body, "0"}, true},
		{[]string{"EVAL", "return 2", "0"}, false},
		{[]string{"EVALSHA", "0000000000000000000000000000000000000000", "0"}, false},
		{[]string{"GET", sha}, false},
		{[]string{"EVALSHA"}, false},
		{nil, false},
	} {
		if got := IsScript(sha)(tc.cmd); got != tc.want {
			t.Errorf("IsScript(%s)(%q) = %v, want %v", sha, tc.cmd, got, tc.want)
		}
	}
	isSet := IsCommand("set")
	for _, tc := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"SET", "k", "v"}, true},
		{[]string{"SETEX", "k", "1", "v"}, false},
		{[]string{"GET", "SET"}, false},
		{nil, false},
	} {
		if got := isSet(tc.cmd); got != tc.want {
			t.Errorf("IsCommand(set)(%q) = %v, want %v", tc.cmd, got, tc.want)
		}
	}
}

func TestAddPanicsOnBadRule(t *testing.T) {
	for _, r := range []Rule{{}, {Action: Action(9)}, {Action: DropReply, Nth: -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Add(%+v) did not panic", r)
				}
			}()
			New().Add(r)
		}()
	}
	if got := fmt.Sprint(DropReply, DelayReply, CloseBefore); got != "DropReply DelayReply CloseBefore" {
		t.Errorf("Action names = %q", got)
	}
}
