//go:build race

package pipeline

// raceEnabled: the race detector adds allocations of its own, and
// sync.Pool drops what it is given at random, so the tests that count
// allocations skip.
const raceEnabled = true
