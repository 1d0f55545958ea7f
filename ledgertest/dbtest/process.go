package dbtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// process is one run of a server program, its output going to a log file.
type process struct {
	cmd     *exec.Cmd
	log     string        // the log file's path
	logFrom int64         // where this run's output starts in the log
	done    chan struct{} // closed once cmd.Wait returned
	err     error         // cmd.Wait's error, valid after done is closed
}

// start starts cmd as a, appending its output to logPath.
func start(cmd *exec.Cmd, a *account, logPath string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	from, _ := log.Seek(0, 2)
	// An *os.File is handed to the child as is: no copying goroutine.
	cmd.Stdout, cmd.Stderr = log, log
	a.runAs(cmd)
	err = cmd.Start()
	log.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &process{cmd: cmd, log: logPath, logFrom: from, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig (when not nil) and waits for the process to exit for up
// to wait, then kills it and waits for that.
func (p *process) stop(sig os.Signal, wait time.Duration) {
	if sig != nil && p.cmd.Process.Signal(sig) == nil {
		select {
		case <-p.done:
			return
		case <-time.After(wait):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// output returns what this run wrote to its log, at most its last 4 KiB.
func (p *process) output() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.log, err)
	}
	if int64(len(b)) > p.logFrom {
		b = b[p.logFrom:]
	}
	if len(b) > 4096 {
		b = append([]byte("..."), b[len(b)-4096:]...)
	}
	return string(bytes.TrimSpace(b))
}

// waitFor polls ready every 20ms until it returns nil, the process exits,
// or timeout passes.
func (p *process) waitFor(ready func() error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return fmt.Errorf("exited before it was ready (%v)", p.err)
		}
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("not ready within %v", timeout), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
