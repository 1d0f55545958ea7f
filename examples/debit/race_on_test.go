//go:build race

package main

// raceEnabled: the race detector slows SQLite (C translated to Go) many
// times over, so the tests scale the workload's timings up.
const raceEnabled = true
