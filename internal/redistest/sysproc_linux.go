//go:build linux

package redistest

import "syscall"

// sysProcAttr makes the kernel kill the server when the thread that started
// it dies, so that a crashed or killed test binary leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
