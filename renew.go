// renew.go: the renewal queue and its timer, which keep the leases of
// running fns.

package idem

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// renewals keeps the leases of a Client's running fns: each is renewed
// every third of the lease, by a goroutine of its own that starts when its
// first renewal is due. The leases of one Client have one length, so their
// first renewals fall due in the order the fns started: one queue and one
// timer serve them all. Most fns end before a renewal is due; such an fn
// costs a place in the queue, and neither a timer nor a goroutine.
type renewals struct {
	c     *Client
	every time.Duration

	mu         sync.Mutex
	head, tail *renewal    // guarded by mu; the queue, in order of due
	timer      *time.Timer // guarded by mu; runs fire
	armed      bool        // guarded by mu; timer is set, for the head's due time or earlier
}

// renewal is one fn's lease.
type renewal struct {
	// Guarded by renewals.mu.
	prev, next *renewal
	due        time.Time
	state      renewalState
	done       chan struct{} // made when the renewer starts; closed by stop
	finished   chan struct{} // made when the renewer starts; closed when it ends

	ctx     context.Context // fn's
	cancel  context.CancelCauseFunc
	keys    []string // the record's key alone
	token   string
	claimed time.Time // when the claim was sent: the lease counts from then
}

type renewalState uint8

const (
	renewalQueued renewalState = iota
	renewalRunning
	renewalStopped
)

// start queues r; its renewer starts a third of a lease after r.claimed,
// or later, as soon as the renewals queued before it are due.
func (q *renewals) start(r *renewal) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r.due = r.claimed.Add(q.every)
	if q.tail != nil {
		if r.due.Before(q.tail.due) {
			r.due = q.tail.due // keep the queue in order
		}
		q.tail.next, r.prev = r, q.tail
	} else {
		q.head = r
	}
	q.tail = r
	if q.armed {
		return
	}
	q.armed = true
	d := time.Until(r.due)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.fire)
	} else {
		q.timer.Reset(d)
	}
}

// stop ends r's renewals, and waits for its renewer if it started.
func (q *renewals) stop(r *renewal) {
	q.mu.Lock()
	state := r.state
	r.state = renewalStopped
	if state == renewalQueued {
		q.unlink(r)
	}
	q.mu.Unlock()
	if state == renewalRunning {
		close(r.done)
		<-r.finished
	}
}

func (q *renewals) unlink(r *renewal) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		q.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		q.tail = r.prev
	}
	r.prev, r.next = nil, nil
}

// fire starts the renewers that are due, and sets the timer for the next.
func (q *renewals) fire() {
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	for r := q.head; r != nil && !r.due.After(now); r = q.head {
		q.unlink(r)
		r.state = renewalRunning
		r.done = make(chan struct{})
		r.finished = make(chan struct{})
		go q.c.renewLoop(r)
	}
	if q.head == nil {
		q.armed = false
		return
	}
	q.timer.Reset(q.head.due.Sub(now))
}

// renewLoop renews r's lease every third of it until stop. If the lease is
// lost, or cannot be renewed before it ends (counted from when the claim
// was sent, then from each renewal that succeeded), fn's context is
// cancelled with a cause wrapping ErrLeaseLost.
func (c *Client) renewLoop(r *renewal) {
	defer close(r.finished)
	every := c.renewals.every
	bg := context.WithoutCancel(r.ctx)
	t := time.NewTicker(every)
	defer t.Stop()
	lastOK := r.claimed
	for {
		select {
		case <-r.done:
			return
		default:
		}
		start := time.Now()
		rctx, rcancel := context.WithTimeout(bg, every)
		n, err := renewScript.Run(rctx, c.rdb, r.keys, r.token, c.leaseMs, c.retentionMs).Int64()
		rcancel()
		switch {
		case err == nil && n == 1:
			lastOK = start
		case err == nil:
			r.cancel(fmt.Errorf("%w: another caller took over the key", ErrLeaseLost))
			return
		default:
			c.cfg.logger.Warn("idem: lease renewal failed", "record", r.keys[0], "error", err)
			if time.Since(lastOK) >= c.cfg.lease {
				r.cancel(fmt.Errorf("%w: the lease could not be renewed: %w", ErrLeaseLost, err))
				return
			}
		}
		select {
		case <-r.done:
			return
		case <-t.C:
		}
	}
}
