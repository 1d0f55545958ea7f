package idemtest

import "syscall"

// childSysProcAttr makes a child die with the test (Pdeathsig).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
