//go:build !unix

package redistest

import (
	"net"
	"testing"
)

// RefusedAddr returns a loopback address where connections are refused:
// here a port found free and closed again, which another process may take
// (on Unix the port stays bound to the test and never listens).
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// HoldPort would keep addr's port from other processes once its server
// is gone (see the Unix version); here it holds nothing and reports true.
func HoldPort(tb testing.TB, addr string) bool { return true }
