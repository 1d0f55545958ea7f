package redistest

import (
	"errors"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// RefusedAddr refuses connections, and its port cannot be listened on by
// anyone else while the test runs.
func TestRefusedAddr(t *testing.T) {
	t.Parallel()
	addr := RefusedAddr(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v; want connection refused", addr, err)
	}
	if runtime.GOOS == "windows" {
		return
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took %s", addr)
	}
}
