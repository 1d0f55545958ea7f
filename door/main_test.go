package door_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: a
// detached call that never ends, a leaked Client.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
