package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A progress draws a bar on a terminal while a run goes on: the phase,
// how far it is, its rate and the time left. Each phase counts its own
// work (bytes read, requests replayed) in Done. On anything but a terminal
// it draws nothing, and a run shorter than a second draws nothing either.
type progress struct {
	Done atomic.Int64 // work done in the current phase

	f     *os.File // nil: draw nothing
	mu    sync.Mutex
	label string // guarded by mu
	unit  string // guarded by mu
	total int64  // guarded by mu; 0 when unknown
	began time.Time

	quit, finished chan struct{}
}

// newProgress returns a progress that draws on w if w is a terminal.
func newProgress(w io.Writer) *progress {
	p := &progress{quit: make(chan struct{}), finished: make(chan struct{})}
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		p.f = f
	}
	if p.f == nil {
		close(p.finished)
		return p
	}
	go p.draw()
	return p
}

// phase starts a phase of work counted in unit, with total units (0 when
// unknown).
func (p *progress) phase(label, unit string, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label, p.unit, p.total, p.began = label, unit, total, time.Now()
	p.Done.Store(0)
}

// stop erases the bar and returns once nothing more is drawn.
func (p *progress) stop() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.finished
}

// draw redraws the bar every tenth of a second until stop.
func (p *progress) draw() {
	defer close(p.finished)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	drawn := false
	for {
		select {
		case <-p.quit:
			if drawn {
				fmt.Fprint(p.f, "\r\033[K")
			}
			return
		case <-t.C:
		}
		if time.Since(start) < time.Second {
			continue
		}
		p.mu.Lock()
		line := progressLine(p.label, p.unit, p.Done.Load(), p.total, time.Since(p.began))
		p.mu.Unlock()
		if line != "" {
			fmt.Fprint(p.f, line)
			drawn = true
		}
	}
}

// progressLine renders the bar:
// "\r[=====>    ]  45%  replaying: 1.2M/2.7M requests, 850k requests/s, 2s left".
// With no total it shows the count and the rate only.
func progressLine(label, unit string, n, total int64, elapsed time.Duration) string {
	if label == "" {
		return ""
	}
	if unit == "" { // a phase that counts nothing
		return fmt.Sprintf("\r%s… %s\033[K", label, elapsed.Round(time.Second))
	}
	word := " " + unit
	if unit == "bytes" {
		word = ""
	}
	rate := ""
	if s := elapsed.Seconds(); s > 0 && n > 0 {
		rate = fmt.Sprintf(", %s%s/s", count(unit, float64(n)/s), word)
	}
	if total <= 0 {
		return fmt.Sprintf("\r%s: %s%s%s\033[K", label, count(unit, float64(n)), word, rate)
	}
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
	return fmt.Sprintf("\r[%s] %3d%%  %s: %s/%s%s%s, %s left\033[K",
		bar, 100*n/total, label, count(unit, float64(n)), count(unit, float64(total)), word, rate, left)
}

// count formats a number of units briefly: 950, 12.3k, 4.5M; bytes in
// binary units.
func count(unit string, v float64) string {
	if unit == "bytes" {
		return formatBytes(int64(v))
	}
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// isTerminal reports whether f is a character device, such as a terminal.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
