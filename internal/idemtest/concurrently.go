package idemtest

import "sync"

// Concurrently calls f 50 times from each of 8 goroutines and returns when
// all are done. The tests of options shared by many constructors use it:
// an option that writes what it captured is a data race that -race
// reports.
func Concurrently(f func()) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				f()
			}
		})
	}
	wg.Wait()
}
