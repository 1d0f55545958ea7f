//go:build !linux

package main

import "testing"

// TestConsumerKilledMidHandler needs Linux: its consumer process must die
// with the test (Pdeathsig). See kill_test.go.
func TestConsumerKilledMidHandler(t *testing.T) {
	t.Skip("kills a consumer process mid-handler; runs on Linux only")
}
