package redistest

import (
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// RefusedAddr refuses connections, and its port cannot be listened on by
// anyone else while the test runs.
func TestRefusedAddr(t *testing.T) {
	t.Parallel()
	addr := RefusedAddr(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v; want connection refused", addr, err)
	}
	if runtime.GOOS == "windows" {
		return
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s", addr)
	}
}

// HoldPort, once a server that clients were connected to has closed its
// port, keeps it: dials are refused, and the port is bound (a bind of it
// without SO_REUSEADDR, which the kernel's hand-out of free ports obeys
// as well, fails). It reports false for a port that someone listens on.
func TestHoldPort(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("HoldPort holds nothing on Windows")
	}
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if HoldPort(t, addr) {
		t.Fatalf("HoldPort(%s) held a port a listener has", addr)
	}
	// A connection closed by the server's side leaves its half in
	// TIME_WAIT on the port, as a killed server's do.
	served := make(chan struct{})
	go func() {
		defer close(served)
		if c, err := ln.Accept(); err == nil {
			_ = c.Close()
		}
	}()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	<-served
	_, _ = c.Read(make([]byte, 1)) // EOF: the server closed first
	_ = c.Close()
	_ = ln.Close()
	if !HoldPort(t, addr) {
		t.Fatalf("HoldPort(%s) did not hold the port its listener left", addr)
	}
	if _, err := net.DialTimeout("tcp", addr, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v; want connection refused", addr, err)
	}
	if err := bindExclusive(addr); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("bind %s without SO_REUSEADDR: %v; want address in use", addr, err)
	}
}
