package faultconn_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultconn"
)

// fakeServer accepts one connection on a loopback port and returns what
// the client sent within wait, then closes it.
func fakeServer(t *testing.T, wait time.Duration) (addr string, received <-chan []byte) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan []byte, 1)
	go func() {
		defer l.Close()
		c, err := l.Accept()
		if err != nil {
			ch <- nil
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(wait))
		b, _ := io.ReadAll(c)
		ch <- b
	}()
	return l.Addr().String(), ch
}

func TestCloseBeforeSplitWrite(t *testing.T) {
	t.Parallel()
	addr, received := fakeServer(t, 300*time.Millisecond)
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Action: faultconn.CloseBefore})
	conn, err := in.Dialer(addr)(context.Background(), "tcp", "ignored:1")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ping := "*1\r\n$4\r\nPING\r\n"
	set := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
	// One byte at a time: the start of the SET must not leak out before
	// the rule sees the whole command.
	for _, b := range []byte(ping + set + ping) {
		if n, err := conn.Write([]byte{b}); n != 1 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if got := string(<-received); got != ping {
		t.Errorf("the server received %q, want only %q", got, ping)
	}
}

func TestReadAfterFaultIsEOF(t *testing.T) {
	t.Parallel()
	addr, received := fakeServer(t, 100*time.Millisecond)
	in := faultconn.New(faultconn.Rule{Action: faultconn.CloseBefore})
	conn, err := in.Dialer(addr)(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	for range 2 {
		if n, err := conn.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("Read = %d, %v; want io.EOF", n, err)
		}
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after the fault: %v, want net.ErrClosed", err)
	}
	if got := <-received; len(got) != 0 {
		t.Errorf("the server received %q, want nothing", got)
	}
}

func TestNotRESPPassesThrough(t *testing.T) {
	t.Parallel()
	addr, received := fakeServer(t, 200*time.Millisecond)
	in := faultconn.New(faultconn.Rule{Action: faultconn.CloseBefore})
	conn, err := in.Dialer(addr)(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if got := string(<-received); got != "PING\r\n" {
		t.Errorf("the server received %q, want the inline command as written", got)
	}
	conn.Close()
	if in.Hits() != 0 {
		t.Errorf("Hits() = %d, want 0", in.Hits())
	}
}

// A write that ends inside a command forwards the complete commands before
// it unchanged, however long the rest is: go-redis's buffered writer cuts a
// pipeline of large scripts anywhere.
func TestWriteEndingInsideACommand(t *testing.T) {
	t.Parallel()
	addr, received := fakeServer(t, 300*time.Millisecond)
	in := faultconn.New()
	conn, err := in.Dialer(addr)(context.Background(), "tcp", "ignored:1")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ping := "*1\r\n$4\r\nPING\r\n"
	set := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$20\r\n" + "vvvvvvvvvvvvvvvvvvvv\r\n"
	for _, part := range []string{ping + set[:len(set)-6], set[len(set)-6:]} {
		if n, err := conn.Write([]byte(part)); n != len(part) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if got := string(<-received); got != ping+set {
		t.Errorf("the server received %q, want %q", got, ping+set)
	}
}
