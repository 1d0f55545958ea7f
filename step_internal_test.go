package idem

import (
	"testing"
	"unsafe"
)

// TestOwningHoldsNoSteps holds an owner's allocation (own's owning: fn's
// context, its lease's renewal) to the size class it has without the
// steps' state, which the first step makes (attemptCtx.stepsOf): a Do
// without steps should not pay for them, even in bytes.
func TestOwningHoldsNoSteps(t *testing.T) {
	const max = 256 // the steps' state inline made it 360 bytes
	if got := unsafe.Sizeof(owning{}); got > max {
		t.Errorf("owning is %d bytes, want at most %d: does it hold the steps' state again?", got, max)
	}
}
