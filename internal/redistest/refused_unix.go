//go:build unix

package redistest

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback address where connections are refused,
// and which no other process can take while the test runs: a socket bound
// to the port and never listening. (A port found free and closed again
// is free for anyone: go test runs several test binaries at once, and
// another's redis-server may start on it, which a test "without Redis"
// then talks to.)
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatalf("redistest: socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("redistest: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("redistest: getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		tb.Fatalf("redistest: getsockname gave %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}

// HoldPort keeps addr's port, once its server is gone, from the ports
// handed out while the test runs: a socket bound to it that never
// listens, so that a client still dialling addr is refused, not answered
// by another test's server on the freed port (go test runs several test
// binaries at once, each starting servers on ports the kernel hands out
// for port 0, as miniredis and Start do; the kernel hands out no port a
// socket is bound to). A process that names the port itself with
// SO_REUSEADDR could still listen there; no test does. It reports false
// when the port was taken already, in the moment since the server closed
// it. addr is a loopback IPv4 address with its port.
func HoldPort(tb testing.TB, addr string) bool {
	tb.Helper()
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatalf("redistest: HoldPort(%q): %v", addr, err)
	}
	port, err := strconv.Atoi(portText)
	ip := net.ParseIP(host).To4()
	if err != nil || ip == nil {
		tb.Fatalf("redistest: HoldPort(%q): not an IPv4 address with a port", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatalf("redistest: socket: %v", err)
	}
	// The closed server's side of its connections is in TIME_WAIT on
	// the port: SO_REUSEADDR binds beside them, as a server restarted
	// there would. It binds beside no listening socket.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		_ = syscall.Close(fd)
		tb.Fatalf("redistest: SO_REUSEADDR: %v", err)
	}
	sa := &syscall.SockaddrInet4{Port: port}
	copy(sa.Addr[:], ip)
	if err := syscall.Bind(fd, sa); err != nil {
		_ = syscall.Close(fd)
		return false
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	return true
}
