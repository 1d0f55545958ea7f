package idemtest

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Child is this test binary run again as a child process that runs one
// test, which talks to its parent through its stdin and stdout: it reports
// lines that start with a tag, and may wait for lines on its stdin. Kill it
// (kill -9) to crash it; on Linux it dies with its parent (see
// childSysProcAttr).
type Child struct {
	cmd    *exec.Cmd
	tag    string
	Stdin  io.WriteCloser // the child's stdin
	lines  chan string    // the child's reports, without the tag; closed at its exit
	exited chan struct{}  // closed once the child was waited for
	stderr bytes.Buffer   // read only after exited is closed
	err    error          // cmd.Wait's error, after exited is closed
}

// StartChild runs the test named test of this binary in a child process,
// with env added to this process's environment. The child reports lines
// starting with tag and a space. It is killed, if still running, when the
// test ends.
func StartChild(t testing.TB, test, tag string, env ...string) *Child {
	t.Helper()
	c := &Child{tag: tag, lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.timeout=2m")
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = &c.stderr
	c.cmd.SysProcAttr = childSysProcAttr()
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.Stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), tag+" "); ok {
				c.lines <- line
			}
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.Kill)
	return c
}

// Reports returns the child's reports, without the tag, in order; it is
// closed when the child's stdout is. Read reports with Expect or with
// Reports, not both at once.
func (c *Child) Reports() <-chan string { return c.lines }

// State returns the state of the child's process once Exited returned
// (nil before).
func (c *Child) State() *os.ProcessState { return c.cmd.ProcessState }

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Expect returns the rest of the child's next report, which must start
// with prefix; it fails the test, killing the child, when another report
// comes, or none within 30 seconds.
func (c *Child) Expect(t testing.TB, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if rest, found := strings.CutPrefix(line, prefix); ok && found {
			return strings.TrimSpace(rest)
		}
		if ok {
			t.Fatalf("the child reported %q, want %q...", line, prefix)
		}
	case <-time.After(30 * time.Second):
	}
	c.Kill()
	t.Fatalf("the child did not report %q (%v); its stderr:\n%s", prefix, c.err, c.stderr.String())
	return ""
}

// Kill kills the child with SIGKILL, if it still runs, and waits until it
// is gone.
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	for range c.lines {
	}
	<-c.exited
}

// Signal sends sig to the child.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Exited waits for the child to exit on its own, skipping its reports,
// and returns cmd.Wait's error and its stderr; it kills the child and
// fails the test when it has not exited within 30 seconds.
func (c *Child) Exited(t testing.TB) (stderr string, err error) {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-c.lines:
			if !ok {
				<-c.exited
				return c.stderr.String(), c.err
			}
		case <-timeout.C:
			c.Kill()
			t.Fatalf("the child did not exit within 30s; its stderr:\n%s", c.stderr.String())
		}
	}
}
