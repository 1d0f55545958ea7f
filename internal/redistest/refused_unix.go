//go:build unix

package redistest

import (
	"errors"
	"fmt"
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
	fd, err := bindSocket([4]byte{127, 0, 0, 1}, 0, false)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
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

// bindSocket returns a new TCP socket bound to ip and port (0: a port the
// kernel hands out), with SO_REUSEADDR when reuse, that never listens; on
// an error (Bind's as it is, to be matched with errors.Is) the socket is
// closed.
func bindSocket(ip [4]byte, port int, reuse bool) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if reuse {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			_ = syscall.Close(fd)
			return -1, fmt.Errorf("SO_REUSEADDR: %w", err)
		}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: ip, Port: port}); err != nil {
		_ = syscall.Close(fd)
		return -1, fmt.Errorf("bind: %w", err)
	}
	return fd, nil
}

// ipv4Port splits addr, an IPv4 address with its port.
func ipv4Port(addr string) (ip [4]byte, port int, err error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return ip, 0, err
	}
	port, err = strconv.Atoi(portText)
	ip4 := net.ParseIP(host).To4()
	if err != nil || ip4 == nil {
		return ip, 0, fmt.Errorf("%q is not an IPv4 address with a port", addr)
	}
	copy(ip[:], ip4)
	return ip, port, nil
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
	ip, port, err := ipv4Port(addr)
	if err != nil {
		tb.Fatalf("redistest: HoldPort: %v", err)
	}
	// The closed server's side of its connections is in TIME_WAIT on
	// the port: SO_REUSEADDR binds beside them, as a server restarted
	// there would. It binds beside no listening socket.
	fd, err := bindSocket(ip, port, true)
	if errors.Is(err, syscall.EADDRINUSE) {
		return false
	}
	if err != nil {
		tb.Fatalf("redistest: HoldPort(%s): %v", addr, err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	return true
}
