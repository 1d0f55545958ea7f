//go:build !unix

package idem_test

import "time"

// processCPU reports no CPU time where getrusage is missing: the
// benchmarks then leave out cli-us/op.
func processCPU() (time.Duration, bool) { return 0, false }
