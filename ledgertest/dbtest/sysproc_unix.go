//go:build unix && !linux

package dbtest

import "syscall"

// sysProcAttr runs a server as cred (nil: the test's user).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
