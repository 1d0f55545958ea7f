//go:build unix

package redistest

import "syscall"

// bindExclusive binds a socket to addr, an IPv4 address and port, without
// SO_REUSEADDR, and closes it.
func bindExclusive(addr string) error {
	ip, port, err := ipv4Port(addr)
	if err != nil {
		return err
	}
	fd, err := bindSocket(ip, port, false)
	if err == nil {
		_ = syscall.Close(fd)
	}
	return err
}
