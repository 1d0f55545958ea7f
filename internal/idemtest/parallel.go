package idemtest

import (
	"flag"
	"runtime"
	"strconv"
)

// SetParallel sets -test.parallel to perCPU times GOMAXPROCS, unless the
// command line gave it: most tests wait on servers and timers rather than
// use the CPU, so more of them run at once than there are processors. Call
// it from TestMain, before m.Run.
func SetParallel(perCPU int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(perCPU*runtime.GOMAXPROCS(0)))
	}
}
