package idemsql

import (
	"os"
	"testing"

	"github.com/idem-go/idem/idemsql/internal/servertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
