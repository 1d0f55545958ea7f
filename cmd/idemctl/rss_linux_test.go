package main

import (
	"os"
	"syscall"
)

// maxRSS is the most memory the process held, in bytes.
func maxRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss * 1024 // Linux counts kilobytes
	}
	return 0
}
