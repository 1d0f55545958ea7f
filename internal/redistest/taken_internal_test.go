package redistest

import (
	"strconv"
	"testing"
	"time"
)

// A port that another process's redis-server holds is not taken for this
// one's: go test runs several test binaries at once, and two may pick one
// port. Before Start checked the answering server's process_id, the
// second Start took the first's PONG for its own server's, and its test
// ran on, and lost, a server it did not own.
func TestStartSkipsAPortAnotherServerHolds(t *testing.T) {
	t.Parallel()
	other := Start(t, Config{})
	if other == nil {
		return
	}
	s := &Server{tb: t, dir: t.TempDir()}
	picks := 0
	err := s.startFresh(func() (int, error) {
		picks++
		if picks == 1 {
			return other.port, nil
		}
		return freePort(false)
	})
	if err != nil {
		t.Fatalf("startFresh: %v", err)
	}
	t.Cleanup(s.stop)
	if s.port == other.port || picks < 2 {
		t.Fatalf("Start kept port %d, which another server holds (%d picks)", s.port, picks)
	}
	mine, err := rawDo(s.Addr(), 5*time.Second, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	pid := s.proc.cmd.Process.Pid
	s.mu.Unlock()
	if got := infoField(mine, "process_id"); got != strconv.Itoa(pid) {
		t.Fatalf("the server on %s is process %s; want the one started, %d", s.Addr(), got, pid)
	}
}
