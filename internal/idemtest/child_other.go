//go:build !linux

package idemtest

import "syscall"

// childSysProcAttr sets nothing: outside Linux a child may outlive a test
// that dies, until its own timeout.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
