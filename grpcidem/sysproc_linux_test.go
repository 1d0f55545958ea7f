package grpcidem_test

import "syscall"

// sysProcAttr makes the kernel kill the server when the test binary dies,
// so that a crashed test leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
