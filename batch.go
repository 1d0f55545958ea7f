// batch.go: the scripts of concurrent calls share round trips: while a few
// pipelines are in flight, calls queue, and a sender writes all that are
// queued as one pipeline.

package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// runner runs the scripts of a Client that change records: through one
// batcher, or on a Redis Cluster through one per master, so that a slow
// or failed master holds up only the calls of its own keys. Every batcher
// sends through the Client's own go-redis client (the ClusterClient in a
// cluster, which follows MOVED and ASK), so that its hooks (tracing,
// metrics) see every script.
type runner struct {
	rdb   redis.UniversalClient
	max   int // pipelines in flight per batcher; 0: no batching
	slow  time.Duration
	bg    *background
	one   batcher
	cc    *redis.ClusterClient // a cluster's client, else nil
	nodes sync.Map             // on a cluster: *redis.Client of a master -> *batcher
}

func (r *runner) init(rdb redis.UniversalClient, max int, bg *background) {
	r.rdb, r.max, r.bg, r.slow = rdb, max, bg, slowSend
	r.one = batcher{rdb: rdb, max: max, bg: bg, slow: r.slow}
	r.cc, _ = rdb.(*redis.ClusterClient)
}

// run runs s with keys and args.
func (r *runner) run(ctx context.Context, s script, keys []string, args []any) *redis.Cmd {
	if r.max == 0 {
		return s.Run(ctx, r.rdb, keys, args...)
	}
	if r.cc == nil {
		return r.one.run(ctx, s, keys, args)
	}
	// The master that serves the key, as the cluster's client last knew
	// it: its batcher queues the call. The pipeline goes through the
	// cluster's client all the same, which sends a moved key's script to
	// its new master.
	node, err := r.cc.MasterForKey(ctx, keys[0])
	if err != nil {
		return s.Run(ctx, r.cc, keys, args...)
	}
	b, ok := r.nodes.Load(node)
	if !ok {
		b, _ = r.nodes.LoadOrStore(node, &batcher{rdb: r.cc, max: r.max, bg: r.bg, slow: r.slow})
	}
	return b.(*batcher).run(ctx, s, keys, args)
}

// batcher runs the scripts of a Client (of one master, on a cluster). A call that finds fewer than max
// pipelines in flight and nobody queued sends at once, from its own
// goroutine, as a plain script run: a lone call costs what an EVALSHA
// costs, and its context bounds it as go-redis lets it. Otherwise it
// queues, and a sender goroutine (at most max, each started when a queue
// forms and ending when none is left) writes every queued call, up to
// maxBatch, as one pipeline: a crowd shares round trips, and the server's
// and the client's read and write system calls.
//
// A pipeline is one round trip for all its calls, but each call's script
// and reply are its own: a script that fails, or NOSCRIPT, fails only its
// call (the scripts the server had not cached are sent whole, in a second
// pipeline). A pipeline whose reply is lost fails each of its calls as a
// lost reply fails a single call, and every script is safe to repeat.
//
// A queued call returns when its context ends, whether its pipeline was
// sent or not: unsent, with an error that says it did not run
// (notSentError); sent, with its context's error, which mayHaveRun counts
// as a reply that may be lost, as for a single call cut by its deadline.
// The pipeline runs on without it.
//
// A pipeline (or plain run) in flight for longer than slowSend stops
// holding its place: a reply held up (a slow network, a paused server, a
// large value) holds up the calls of its own pipeline, not every call
// after it. Up to maxInFlight pipelines may then be in flight.
type batcher struct {
	rdb  redis.UniversalClient
	max  int           // pipelines (or plain runs) in flight at most, but slow ones
	slow time.Duration // slowSend (tests change it)
	bg   *background   // counts the senders, for Close

	mu      sync.Mutex
	senders int            // guarded by mu; pipelines (or plain runs) in flight
	slowNow int            // guarded by mu; of them, those in flight for longer than slow
	queue   []*batchedCall // guarded by mu; calls waiting for a sender

	watches sync.Pool // of *sendWatch, of this batcher, free
}

const (
	// slowSend is how long a pipeline may be in flight before it stops
	// holding one of the max places (see batcher).
	slowSend = 50 * time.Millisecond
	// maxInFlight bounds the pipelines in flight, slow ones included.
	maxInFlight = 64
)

// free reports whether a place is free for a pipeline. b.mu is held.
func (b *batcher) free() bool {
	return b.senders-b.slowNow < b.max && b.senders < maxInFlight
}

// A sendWatch marks a pipeline (or plain run) slow once it has been in
// flight for slowSend, and then lets a new sender take the place it held.
type sendWatch struct {
	b     *batcher
	t     *time.Timer
	fired bool // guarded by b.mu
	over  bool // guarded by b.mu
}

// watch starts watching a pipeline (or plain run) that starts now.
func (b *batcher) watch() *sendWatch {
	w, _ := b.watches.Get().(*sendWatch)
	if w == nil {
		w = &sendWatch{b: b}
		w.t = time.AfterFunc(b.slow, w.fire)
		return w
	}
	w.fired, w.over = false, false
	w.t.Reset(b.slow)
	return w
}

func (w *sendWatch) fire() {
	b := w.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.over {
		return
	}
	w.fired = true
	b.slowNow++
	if len(b.queue) > 0 && b.free() {
		b.senders++
		b.startSender()
	}
}

// end ends the watch of a pipeline that is over. b.mu is held.
func (w *sendWatch) end() {
	w.over = true
	stopped := w.t.Stop()
	if w.fired {
		w.b.slowNow--
	}
	if stopped || w.fired {
		// fire will not run for this watch: it may serve another.
		w.b.watches.Put(w)
	}
}

// batchedCall is one script run that waits in the queue.
type batchedCall struct {
	ctx  context.Context
	s    script
	keys []string
	args []any
	cmd  *redis.Cmd    // set by the sender before done receives
	done chan struct{} // receives once the sender has set cmd
}

const (
	// defaultPipelines is the number of pipelines in flight at once
	// (WithPipelines).
	defaultPipelines = 4
	// maxBatch bounds the calls in one pipeline: the client writes a whole
	// pipeline before it reads a reply.
	maxBatch = 256
)

// notSentError is the error of a call whose context ended while it was
// queued: its script was never sent, so it did not run.
type notSentError struct{ err error }

func (e notSentError) Error() string { return "not sent: " + e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// run runs s with keys and args, alone or in a pipeline with other calls'.
func (b *batcher) run(ctx context.Context, s script, keys []string, args []any) *redis.Cmd {
	b.mu.Lock()
	if b.free() && len(b.queue) == 0 {
		b.senders++
		b.mu.Unlock()
		w := b.watch()
		cmd := s.Run(ctx, b.rdb, keys, args...)
		b.mu.Lock()
		w.end()
		b.senders--
		if len(b.queue) > 0 && b.free() {
			// Calls queued meanwhile: hand this place to a sender.
			b.senders++
			b.startSender()
		}
		b.mu.Unlock()
		return cmd
	}
	if err := ctx.Err(); err != nil {
		b.mu.Unlock()
		return errCmd(ctx, notSentError{err})
	}
	bc, _ := batchedCalls.Get().(*batchedCall)
	if bc == nil {
		bc = &batchedCall{done: make(chan struct{}, 1)}
	}
	bc.ctx, bc.s, bc.keys, bc.args = ctx, s, keys, args
	b.queue = append(b.queue, bc)
	if b.free() {
		b.senders++
		b.startSender()
	}
	b.mu.Unlock()
	select {
	case <-bc.done:
		return bc.recycle()
	case <-ctx.Done():
	}
	b.mu.Lock()
	for i, q := range b.queue {
		if q == bc {
			b.queue = append(b.queue[:i:i], b.queue[i+1:]...)
			b.mu.Unlock()
			bc.recycle()
			return errCmd(ctx, notSentError{ctx.Err()})
		}
	}
	b.mu.Unlock()
	select {
	case <-bc.done: // the reply came as the context ended: keep it
		return bc.recycle()
	default:
		// The sender will still set cmd and signal done: bc is left to
		// the garbage collector, and done to whoever must wait for the
		// pipeline to be over (see inFlightError).
		return errCmd(ctx, inFlightError{ctx.Err(), bc.done})
	}
}

// inFlightError is the error of a call whose context ended while its
// script was in a pipeline under way: the script may have run, or may still
// run, later (the sender may not have written it yet, and go-redis sends a
// pipeline whose reply was lost again). Whatever undoes it (the release of
// a claim) must wait for done, which receives once the pipeline is over,
// go-redis's retries included; else the script could land after it.
type inFlightError struct {
	err  error
	done <-chan struct{}
}

func (e inFlightError) Error() string { return e.err.Error() }
func (e inFlightError) Unwrap() error { return e.err }

// inFlight returns the channel that receives once the pipeline that
// carried the failed call of err is over, or nil when err is not one of a
// call that left its pipeline under way.
func inFlight(err error) <-chan struct{} {
	var e inFlightError
	if errors.As(err, &e) {
		return e.done
	}
	return nil
}

// batchedCalls recycles batchedCalls (with their done channels) whose
// sender is done with them.
var batchedCalls sync.Pool

// recycle returns bc's command and puts bc back in batchedCalls: the sender
// has signalled done, its last use of bc, or bc was never sent.
func (bc *batchedCall) recycle() *redis.Cmd {
	cmd := bc.cmd
	*bc = batchedCall{done: bc.done}
	batchedCalls.Put(bc)
	return cmd
}

// startSender starts a goroutine that sends what is queued, in the place
// (one of max) its caller holds. b.mu is held.
func (b *batcher) startSender() {
	b.bg.Add()
	go b.sender()
}

// sender sends the queue, batch after batch, until none is left; then it
// gives its place up.
func (b *batcher) sender() {
	defer b.bg.Done()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.senders--
			b.mu.Unlock()
			return
		}
		n := min(len(b.queue), maxBatch)
		batch := b.queue[:n:n]
		if n == len(b.queue) {
			b.queue = nil
		} else {
			b.queue = b.queue[n:]
		}
		b.mu.Unlock()
		w := b.watch()
		b.send(batch)
		b.mu.Lock()
		w.end()
		if b.senders-b.slowNow > b.max {
			// This place was freed while the pipeline was slow, and
			// taken: give it up.
			b.senders--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
}

// send runs a batch: one call as a plain script run, more as one pipeline
// of EVALSHAs (and the scripts the server had not cached, whole, in a
// second one). It sets every call's cmd, then signals done.
func (b *batcher) send(batch []*batchedCall) {
	if len(batch) == 1 {
		bc := batch[0]
		bc.cmd = bc.s.Run(bc.ctx, b.rdb, bc.keys, bc.args...)
		bc.done <- struct{}{}
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	pipe := b.rdb.Pipeline()
	for _, bc := range batch {
		bc.cmd = pipe.EvalSha(ctx, bc.s.Hash(), bc.keys, bc.args...)
	}
	_, _ = pipe.Exec(ctx)
	var again redis.Pipeliner
	for _, bc := range batch {
		if redis.HasErrorPrefix(bc.cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = b.rdb.Pipeline()
			}
			bc.cmd = again.Eval(ctx, bc.s.src, bc.keys, bc.args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for _, bc := range batch {
		bc.done <- struct{}{}
	}
}

// batchContext is the context of a pipeline shared by the calls of batch:
// no call's end cancels it (the others still wait for its reply), and when
// every call has a deadline, it ends at the latest one, when nobody waits
// any more (go-redis applies it to the connection's reads with
// ContextTimeoutEnabled; else the client's timeouts bound the pipeline).
// Its values are the first call's.
func batchContext(batch []*batchedCall) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var last time.Time
	for _, bc := range batch {
		d, ok := bc.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(ctx, last)
}

// errCmd returns a command that failed with err before it was sent.
func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// notSent reports whether err says that a script was never sent.
func notSent(err error) bool {
	var ns notSentError
	return errors.As(err, &ns)
}
