//go:build !unix

package bench

import "time"

// processCPU reports no CPU time where getrusage is missing: the
// benchmarks then leave out the client's CPU per op.
func processCPU() (time.Duration, bool) { return 0, false }
