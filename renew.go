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
// first renewal is due, two thirds of a lease before the owner's deadline.
// Most fns end before that; such an fn costs a place in a queue kept in
// order of due, and neither a timer nor a goroutine: one timer serves the
// whole queue. Leases of one Client have one length, so a new renewal
// almost always goes at the tail; one that falls due earlier (its claim's
// reply was slow) is put in its place, never behind a later one.
type renewals struct {
	c     *Client
	every time.Duration

	mu         sync.Mutex
	head, tail *renewal    // guarded by mu; the queue, in order of due
	timer      *time.Timer // guarded by mu; runs fire
	armed      bool        // guarded by mu; timer is set
	armedAt    time.Time   // guarded by mu; when the armed timer fires
}

// renewal is one fn's lease.
type renewal struct {
	// Guarded by renewals.mu.
	prev, next *renewal
	due        time.Time
	state      renewalState
	quit       chan struct{} // made when the renewer starts; closed by stop
	finished   chan struct{} // made when the renewer starts; closed when it ends

	ctx *attemptCtx // fn's: its deadline is the owner's lease deadline; its call, the owner
}

type renewalState uint8

const (
	renewalQueued renewalState = iota
	renewalRunning
	renewalStopped
)

// start queues r, whose renewer starts at r.due.
func (q *renewals) start(r *renewal) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// Walk back from the tail to r's place: almost always the tail itself.
	p := q.tail
	for p != nil && r.due.Before(p.due) {
		p = p.prev
	}
	r.prev = p
	if p != nil {
		r.next, p.next = p.next, r
	} else {
		r.next, q.head = q.head, r
	}
	if r.next != nil {
		r.next.prev = r
	} else {
		q.tail = r
	}
	if q.armed && !r.due.Before(q.armedAt) {
		return
	}
	q.armed, q.armedAt = true, r.due
	d := time.Until(r.due)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.fire)
	} else {
		q.timer.Reset(d)
	}
}

// stop ends r's renewals, and waits for its renewer if it started. A
// renewal call still under way is left to finish in the background.
func (q *renewals) stop(r *renewal) {
	q.mu.Lock()
	state := r.state
	r.state = renewalStopped
	if state == renewalQueued {
		q.unlink(r)
	}
	q.mu.Unlock()
	if state == renewalRunning {
		close(r.quit)
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
		r.quit = make(chan struct{})
		r.finished = make(chan struct{})
		go q.c.renewLoop(r)
	}
	if q.head == nil {
		q.armed = false
		return
	}
	q.armedAt = q.head.due
	q.timer.Reset(q.head.due.Sub(now))
}

// renewReply is the outcome of one renewal call sent at sent (mono).
type renewReply struct {
	renewed bool
	err     error
	sent    int64
}

// renewLoop renews r's lease every third of it until stop. Each call runs
// in a goroutine of its own, so that a reply that hangs holds up neither
// the next renewal nor the deadline: when the owner's deadline passes (the
// send time of the last renewal that succeeded, plus the lease, less the
// margin), fn's context is cancelled with errLeaseEnded, whether or not a
// call is still under way. A renewal that finds the key no longer ours
// cancels it with a cause wrapping ErrLeaseLost.
//
// Model: step Renew (the owner's side) and step Tick (the context
// cancelled at the deadline) in model/idem.pml.
func (c *Client) renewLoop(r *renewal) {
	defer close(r.finished)
	cl := r.ctx.call
	every := c.renewals.every
	lease := int64(c.cfg.lease - c.margin)
	deadline := time.NewTimer(time.Duration(r.ctx.deadline.Load() - mono()))
	defer deadline.Stop()
	tick := time.NewTimer(0)
	defer tick.Stop()
	replies := make(chan renewReply, maxPendingRenewals)
	pending := 0
	for {
		select {
		case <-r.quit:
			return
		case <-deadline.C:
			if left := r.ctx.deadline.Load() - mono(); left > 0 {
				deadline.Reset(time.Duration(left)) // moved by a renewal meanwhile
				continue
			}
			r.ctx.cancel(errLeaseEnded)
			return
		case <-tick.C:
			tick.Reset(every)
			if pending == maxPendingRenewals {
				continue // the replies hang: the deadline decides
			}
			pending++
			c.bg.Add()
			go func() {
				defer c.bg.Done()
				rctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), every)
				renewed, sent, err := cl.renew(rctx)
				cancel()
				replies <- renewReply{renewed: renewed, err: err, sent: sent}
			}()
		case rep := <-replies:
			pending--
			switch {
			case rep.renewed:
				// The server acted after rep.sent: the lease lasts at least
				// until then plus the lease. An older reply that comes late
				// moves nothing back.
				for {
					old := r.ctx.deadline.Load()
					if rep.sent+lease <= old || r.ctx.deadline.CompareAndSwap(old, rep.sent+lease) {
						break
					}
				}
			case rep.err == nil:
				r.ctx.cancel(fmt.Errorf("%w: another caller took over the key", ErrLeaseLost))
				return
			default:
				c.warnKey(context.Background(), "idem: lease renewal failed", cl.key, rep.err)
			}
		}
	}
}

// maxPendingRenewals bounds the renewal calls of one lease under way at
// once: a renewal is sent every third of a lease even while an earlier
// one's reply hangs (it may be one bad connection), but not without end.
const maxPendingRenewals = 2

// renew runs lua/renew.lua once: for renewLoop, and before fn starts when
// a claim's reply came with too little of the lease left. It reports
// whether the claim is still the call's, and when the renewal was sent
// (mono).
func (cl *call) renew(ctx context.Context) (renewed bool, sent int64, err error) {
	c := cl.c
	sent = mono()
	// The steps' checkpoints are renewed with the record: a checkpoint
	// must last as long as the record it belongs to, however long fn runs
	// after it (see lua/step.lua).
	var n int64
	if cl.op != nil {
		// A registered operation's renewal moves its index entry: due
		// when the new lease and WithRecoverAfter have passed.
		rk := []string{cl.claimKeys[0], cl.claimKeys[1], c.pendingKey(cl.claimKeys[0])}
		n, err = c.scripts.Run(ctx, renewScript, rk, cl.token, c.leaseMs, c.retentionMs, cl.key, c.dueMs).Int64()
	} else {
		n, err = c.scripts.Run(ctx, renewScript, cl.claimKeys, cl.token, c.leaseMs, c.retentionMs).Int64()
	}
	return err == nil && n == 1, sent, err
}
