//go:build linux

package dbtest

import "syscall"

// sysProcAttr runs a server as cred (nil: the test's user) and makes the
// kernel kill it when the thread that started it dies, so that a crashed
// test binary leaves no server behind. Go sets the signal after switching
// to cred, which would otherwise clear it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
}
