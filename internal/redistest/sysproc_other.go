//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux can tie the server's life to the test
// binary's, so elsewhere a killed test binary can leave a server running.
func sysProcAttr() *syscall.SysProcAttr { return nil }
