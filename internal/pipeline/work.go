package pipeline

import "sync"

// Work counts goroutines under way, so that their owner can wait for
// them: a Runner's senders, and whatever else the owner counts with it.
// Unlike a sync.WaitGroup, it may be added to while Wait waits. The zero
// value is ready to use.
type Work struct {
	mu   sync.Mutex
	n    int           // guarded by mu; work under way
	idle chan struct{} // guarded by mu; closed when n falls to 0, if Wait waits
}

// Add notes one more piece of work under way.
func (b *Work) Add() {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
}

// Done notes the end of one piece of work.
func (b *Work) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n--; b.n == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
}

// Wait returns once no work is under way.
func (b *Work) Wait() {
	b.mu.Lock()
	if b.n == 0 {
		b.mu.Unlock()
		return
	}
	if b.idle == nil {
		b.idle = make(chan struct{})
	}
	idle := b.idle
	b.mu.Unlock()
	<-idle
}
