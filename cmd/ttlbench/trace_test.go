package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReadTrace(t *testing.T) {
	t.Parallel()
	in := `# a comment
key,unix_ms,fingerprint

b,1700000001000,fp-b
a,1700000000000
"a,b",1700000000500,"x"
  a,1700000002000
b,1700000001000,fp-other
`
	p, err := ReadTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(p.Keys, "|"), "a|a,b|b"; got != want {
		t.Errorf("keys %q, want %q", got, want)
	}
	if !p.Start.Equal(time.UnixMilli(1700000000000)) {
		t.Errorf("start %v, want the earliest request", p.Start)
	}
	type ev struct {
		at   time.Duration
		op   int32
		kind Kind
		fp   string
	}
	want := []ev{
		{0, 0, First, ""},
		{500 * time.Millisecond, 1, First, "x"},
		{time.Second, 2, First, "fp-b"},
		{time.Second, 2, Retry, "fp-other"}, // same time: file order kept
		{2 * time.Second, 0, Retry, ""},
	}
	if len(p.Events) != len(want) {
		t.Fatalf("got %d events, want %d", len(p.Events), len(want))
	}
	for i, w := range want {
		e := p.Events[i]
		if got := (ev{e.At, e.Op, e.Kind, e.Fingerprint}); got != w {
			t.Errorf("event %d: got %+v, want %+v", i, got, w)
		}
	}
}

func TestReadTraceErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		line int
		want string
	}{
		{"a,1\nb,x\n", 2, "unix_ms"},
		{"# c\n\na,1\nb\n", 4, "fields"},
		{"a,1,fp,extra\n", 1, "fields"},
		{"a,1\n,2\n", 2, "empty key"},
		{"a,1\nb,-5\n", 2, "unix_ms"},
		{"a,1\nb\"c,2\n", 2, "quote"},
		{"a,1\n" + strings.Repeat("k", maxKeyLen+1) + ",2\n", 2, "longer"},
		{"a,1\nb,999999999999999\n", 2, "after the earliest"},
	} {
		_, err := ReadTrace(strings.NewReader(tc.in))
		var te *TraceError
		if !errors.As(err, &te) {
			t.Errorf("%q: got %v, want a TraceError", tc.in, err)
			continue
		}
		if te.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %q (line %d), want line %d and %q", tc.in, err, te.Line, tc.line, tc.want)
		}
	}
	if _, err := ReadTrace(strings.NewReader("# nothing\n\n")); err == nil {
		t.Error("an empty trace was accepted")
	}
}
