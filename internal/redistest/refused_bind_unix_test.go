//go:build unix

package redistest

import (
	"net"
	"strconv"
	"syscall"
)

// bindExclusive binds a socket to addr, a loopback IPv4 address and port,
// without SO_REUSEADDR, and closes it.
func bindExclusive(addr string) error {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	sa := &syscall.SockaddrInet4{Port: port}
	copy(sa.Addr[:], net.ParseIP(host).To4())
	return syscall.Bind(fd, sa)
}
