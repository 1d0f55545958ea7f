package idemsql

import (
	"os"
	"testing"

	"github.com/idem-go/idem/ledgertest/dbtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	dbtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
