//go:build unix

package benchrun

import (
	"syscall"
	"time"
)

// ProcessCPU returns this process's CPU time so far (user and system, all
// threads).
func ProcessCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
