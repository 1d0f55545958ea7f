package idempgx_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/idem-go/idem/ledgertest/dbtest"
	"go.uber.org/goleak"
)

// exampleDSN is the database of Example, made by TestMain (an Example
// takes no testing.TB to start a server with).
var exampleDSN string

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_LEDGERTEST_CHILD") != "" {
		// A child of ledgertest's kill scenario: it runs one test, on its
		// parent's server, and is killed; it must start no server.
		os.Exit(m.Run())
	}
	tb := &mainTB{}
	done := make(chan struct{})
	go func() { // Skipf and Fatalf end the goroutine, as they end a test
		defer close(done)
		exampleDSN = dbtest.SharedPostgres(tb).NewDatabase(tb)
	}()
	<-done
	code := 0
	switch {
	case tb.failed != "":
		fmt.Fprintln(os.Stderr, "idempgx:", tb.failed)
		code = 1
	case tb.skipped != "":
		// Every test of this package needs PostgreSQL.
		fmt.Println("idempgx: every test skipped:", tb.skipped)
	default:
		code = m.Run()
	}
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	dbtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// mainTB is the testing.TB of TestMain, for dbtest's calls: the methods
// that dbtest uses, and no others (the nil TB panics on them).
type mainTB struct {
	testing.TB
	cleanups        []func()
	skipped, failed string
}

func (t *mainTB) Helper()           {}
func (t *mainTB) Cleanup(f func())  { t.cleanups = append(t.cleanups, f) }
func (t *mainTB) Fatal(args ...any) { t.failed = fmt.Sprint(args...); runtime.Goexit() }
func (t *mainTB) Fatalf(format string, a ...any) {
	t.failed = fmt.Sprintf(format, a...)
	runtime.Goexit()
}
func (t *mainTB) Skipf(format string, a ...any) {
	t.skipped = fmt.Sprintf(format, a...)
	runtime.Goexit()
}
