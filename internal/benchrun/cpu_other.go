//go:build !unix

package benchrun

import "time"

// ProcessCPU reports no CPU time where getrusage is missing: the
// benchmarks then leave out the client's CPU per op.
func ProcessCPU() (time.Duration, bool) { return 0, false }
