package idemstream_test

import (
	"testing"

	"github.com/idem-go/idem/internal/idemtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	idemtest.SetParallel(4)
	goleak.VerifyTestMain(m)
}
