//go:build !linux

package grpcidem_test

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
