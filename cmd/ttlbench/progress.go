package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// startProgress draws a progress bar on w while a run goes on, when w is a
// terminal and the run has lasted a second (shorter runs do not flicker a
// bar). done counts finished requests out of total. The returned stop
// erases the bar and returns once nothing more is drawn.
func startProgress(w io.Writer, done *atomic.Int64, total int64) (stop func()) {
	f, ok := w.(*os.File)
	if !ok || total <= 0 || !isTerminal(f) {
		return func() {}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		begin := time.Now()
		drawn := false
		for {
			select {
			case <-quit:
				if drawn {
					fmt.Fprint(f, "\r\033[K")
				}
				return
			case <-t.C:
			}
			if elapsed := time.Since(begin); elapsed >= time.Second {
				fmt.Fprint(f, progressLine(done.Load(), total, elapsed))
				drawn = true
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

// progressLine renders the bar: "\r[=====>    ]  45%  1234/2743 requests, 3s left".
func progressLine(n, total int64, elapsed time.Duration) string {
	const width = 30
	n = min(max(n, 0), total)
	filled := int(int64(width) * n / total)
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	left := "?"
	if n > 0 {
		left = (time.Duration(float64(elapsed) * float64(total-n) / float64(n))).Round(time.Second).String()
	}
	return fmt.Sprintf("\r[%s] %3d%%  %d/%d requests, %s left\033[K", bar, 100*n/total, n, total, left)
}

// isTerminal reports whether f is a character device, such as a terminal.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
