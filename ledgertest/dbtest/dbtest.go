// Package dbtest runs real database servers for the tests of idem's ledger
// drivers, and of anyone's: PostgreSQL and redis-server processes (and
// MariaDB), started by the tests themselves, as the root module's
// internal/redistest does for the core (which another module cannot
// import).
//
// Every server listens on a free loopback port (never 6379, 5432 or 3306),
// keeps its data in a new temporary directory, is stopped when its test
// (or, for a shared server, the test binary) ends, and dies with the test
// binary if that dies first (Linux). PostgreSQL refuses to run as root, so
// when the tests run as root its processes run as the "postgres" system
// user that Debian's package creates (or "nobody").
//
// When a server is not installed, the tests that need it are skipped,
// unless the environment variable IDEM_REQUIRE_REDIS is "1" (CI sets it):
// then they fail, so that CI cannot pass by running nothing.
package dbtest

import (
	"errors"
	"net"
	"os"
	"sync"
	"testing"
)

// RequireEnv is the environment variable that turns a missing server from
// a skipped test into a failed one when it is set to "1".
const RequireEnv = "IDEM_REQUIRE_REDIS"

// missing skips the test, or fails it under RequireEnv=1, because program
// (from the Debian package pkg) is not installed.
func missing(tb testing.TB, program, pkg string) {
	tb.Helper()
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("dbtest: %s not found, and %s=1 requires the tests that need it to run; install it (apt-get install %s)", program, RequireEnv, pkg)
		return
	}
	tb.Skipf("dbtest: %s not found; install it (apt-get install %s) or these tests do not run", program, pkg)
}

var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{} // ports freePort returned in this process
)

// freePort returns a loopback port that was free a moment ago and that no
// other server of this process was given.
func freePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if handedOut[port] || port == 6379 || port == 5432 || port == 3306 {
			continue
		}
		handedOut[port] = true
		return port, nil
	}
	return 0, errors.New("dbtest: found no free loopback port")
}
