// Package pipeline runs the Lua scripts of concurrent callers in shared
// pipelines, so that a crowd shares round trips, and the server's and the
// client's read and write system calls.
//
// A call that finds a place free (fewer than max pipelines in flight) and
// nobody queued sends its script at once, from its own goroutine, as a plain
// script run (EVALSHA, with the EVAL fallback), with its own context: a lone
// call costs what an EVALSHA costs. Otherwise it queues, and a sender
// goroutine writes every queued call, up to MaxBatch, as one pipeline. Each
// call keeps its own reply and errors: a script that fails, or NOSCRIPT,
// fails only its call (scripts the server had not cached are sent whole, in
// a second pipeline). A pipeline in flight for longer than SlowSend stops
// holding its place, so that a reply held up holds up only its own calls;
// at most MaxInFlight pipelines are in flight.
//
// # When a script ran
//
// A call whose context ends while it is queued returns at once with an
// error for which NotSent reports true: its script was never sent, and
// never will be. A call whose context ends while its pipeline is under way
// returns then too, with its context's error wrapped so that InFlight
// returns a channel that receives once the pipeline is over (go-redis's
// retries included): until then the script may still run. Whatever undoes
// the script must wait for that channel. Any other failure of a sent script
// (a lost reply, a timeout) leaves it unknown whether it ran, as for a
// single command.
//
// # Contexts
//
// A shared pipeline runs with a context of its own that carries no
// caller's values, so that go-redis hooks (tracing, metrics) never see one
// request's values beside another request's scripts; it is never cancelled
// by a caller, and ends at the latest of the callers' deadlines when every
// caller has one. A script sent alone runs with its caller's context.
package pipeline

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script is a Lua script with its source at hand, for the EVAL fallback
// in a pipeline.
type Script struct {
	*redis.Script
	Src string
	// sha and src are the script's digest and source, boxed once: an
	// argument of every command, they would cost an allocation each.
	sha, src any
}

// NewScript returns the Script of src.
func NewScript(src string) Script {
	s := redis.NewScript(src)
	return Script{Script: s, Src: src, sha: s.Hash(), src: src}
}

// Args returns the arguments of a run of s with keys and args, as Run
// sends them (see RunArgs), in one allocation.
func (s Script) Args(keys []string, args ...any) []any {
	a := make([]any, 3+len(keys)+len(args))
	a[0], a[1] = "evalsha", s.sha
	a[2] = len(keys) // below 256: boxed without an allocation
	for i, k := range keys {
		a[3+i] = k
	}
	copy(a[3+len(keys):], args)
	return a
}

// cmd returns the command of a, not yet sent: the EVALSHA of s that
// RunArgs laid out (sha), or an EVAL (sha false: a must be a new slice,
// which cmd turns into one). It never writes into an EVALSHA's a: a
// pipeline that a caller gave up on may still read it while the caller
// runs the same a again.
func (s Script) cmd(ctx context.Context, a []any, sha bool) *redis.Cmd {
	if !sha {
		a[0], a[1] = "eval", s.src
	}
	cmd := redis.NewCmd(ctx, a...)
	if n, _ := a[2].(int); n > 0 {
		cmd.SetFirstKeyPos(3) // as go-redis's Eval: the cluster's slot is the first key's
	}
	return cmd
}

// processor sends a command: a client, or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run runs s with the arguments a (see RunArgs) through rdb as go-redis's
// Script.Run does: an EVALSHA, and an EVAL if the server had not cached
// the script.
func (s Script) run(ctx context.Context, rdb processor, a []any) *redis.Cmd {
	cmd := s.cmd(ctx, a, true)
	_ = rdb.Process(ctx, cmd)
	// HasErrorPrefix allocates even for a nil error: only a failure pays.
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// A new slice: the EVALSHA's command keeps its arguments.
		cmd = s.cmd(ctx, append([]any(nil), a...), false)
		_ = rdb.Process(ctx, cmd)
	}
	return cmd
}

// A Runner runs scripts through one go-redis client: through one batcher,
// or on a Redis Cluster through one per master, so that a slow or failed
// master holds up only the calls of its own keys. Every batcher sends
// through the client given to NewRunner (the ClusterClient on a cluster,
// which follows MOVED and ASK), so that its hooks see every script. It is
// safe for concurrent use.
type Runner struct {
	rdb   redis.UniversalClient
	max   int // pipelines in flight per batcher; 0: no batching
	slow  time.Duration
	work  *Work
	one   batcher
	cc    *redis.ClusterClient // a cluster's client, else nil
	nodes sync.Map             // on a cluster: *redis.Client of a master -> *batcher
}

// NewRunner returns a Runner that keeps up to max pipelines in flight (per
// master on a cluster; 0: every script goes alone, as go-redis sends it).
// work counts its sender goroutines, so that their owner can wait for them.
func NewRunner(rdb redis.UniversalClient, max int, work *Work) *Runner {
	r := &Runner{rdb: rdb, max: max, work: work, slow: SlowSend}
	r.one = batcher{rdb: rdb, max: max, work: work, slow: r.slow}
	r.cc, _ = rdb.(*redis.ClusterClient)
	return r
}

// SetSlow sets how long a pipeline may be in flight before it stops
// holding its place (SlowSend): tests that hold a pipeline and need the
// calls behind it to stay queued set it long. Set it before the first Run.
func (r *Runner) SetSlow(d time.Duration) { r.slow, r.one.slow = d, d }

// Queued returns the number of calls waiting for a pipeline (outside a
// cluster).
func (r *Runner) Queued() int {
	r.one.mu.Lock()
	defer r.one.mu.Unlock()
	return len(r.one.queue)
}

// Run runs s with keys and args, alone or in a pipeline with other calls'
// scripts, and returns its command, done.
func (r *Runner) Run(ctx context.Context, s Script, keys []string, args ...any) *redis.Cmd {
	return r.RunArgs(ctx, s, s.Args(keys, args...))
}

// RunArgs runs s as Run does, with the arguments a of its command: two
// places that RunArgs fills (the command and the script's digest), the
// number of keys (an int, at least 1), the keys (strings), then the
// script's arguments, as Script.Args lays them out. A caller that keeps
// them in memory it allocates anyway saves Args's allocation; a must not
// change until the command is done (see InFlight), and RunArgs keeps no
// reference to it after. RunArgs fills the two places in the caller's
// goroutine, before any sender may read a, and only when they are empty:
// a run of the same a while an earlier one's pipeline is under way
// writes nothing into it.
func (r *Runner) RunArgs(ctx context.Context, s Script, a []any) *redis.Cmd {
	if a[0] == nil {
		a[0], a[1] = "evalsha", s.sha
	}
	if r.max == 0 {
		return s.run(ctx, r.rdb, a)
	}
	if r.cc == nil {
		return r.one.run(ctx, s, a)
	}
	// The master that serves the key, as the cluster's client last knew
	// it: its batcher queues the call. The pipeline goes through the
	// cluster's client all the same, which sends a moved key's script to
	// its new master.
	key, _ := a[3].(string)
	node, err := r.cc.MasterForKey(ctx, key)
	if err != nil {
		return s.run(ctx, r.cc, a)
	}
	b, ok := r.nodes.Load(node)
	if !ok {
		b, _ = r.nodes.LoadOrStore(node, &batcher{rdb: r.cc, max: r.max, work: r.work, slow: r.slow})
	}
	return b.(*batcher).run(ctx, s, a)
}

// batcher runs the scripts of one Runner (of one master, on a cluster).
// Its senders (at most max, each started when a queue forms and ending when
// none is left) write the queue as pipelines. A pipeline whose reply is lost
// fails each of its calls as a lost reply fails a single call.
//
// A pipeline (or plain run) in flight for longer than slow stops holding
// its place: a reply held up (a slow network, a paused server, a large
// value) holds up the calls of its own pipeline, not every call after it.
// Up to MaxInFlight pipelines may then be in flight.
type batcher struct {
	rdb  redis.UniversalClient
	max  int           // pipelines (or plain runs) in flight at most, but slow ones
	slow time.Duration // SlowSend (tests change it)
	work *Work         // counts the senders

	mu      sync.Mutex
	senders int            // guarded by mu; pipelines (or plain runs) in flight
	slowNow int            // guarded by mu; of them, those in flight for longer than slow
	queue   []*batchedCall // guarded by mu; calls waiting for a sender

	watches sync.Pool // of *sendWatch, of this batcher, free
}

const (
	// SlowSend is how long a pipeline may be in flight before it stops
	// holding one of the max places.
	SlowSend = 50 * time.Millisecond
	// MaxInFlight bounds the pipelines in flight, slow ones included.
	MaxInFlight = 64
	// MaxBatch bounds the calls in one pipeline: go-redis writes a whole
	// pipeline before it reads a reply.
	MaxBatch = 256
)

// free reports whether a place is free for a pipeline. b.mu is held.
func (b *batcher) free() bool {
	return b.senders-b.slowNow < b.max && b.senders < MaxInFlight
}

// A sendWatch marks a pipeline (or plain run) slow once it has been in
// flight for slow, and then lets a new sender take the place it held.
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
	s    Script
	args []any         // its command's (see RunArgs)
	cmd  *redis.Cmd    // set by the sender before done receives
	done chan struct{} // receives once the sender has set cmd
}

// notSentError is the error of a call whose context ended while it was
// queued: its script was never sent, so it did not run.
type notSentError struct{ err error }

func (e notSentError) Error() string { return "not sent: " + e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// run runs s with the arguments args (see RunArgs), alone or in a pipeline
// with other calls'.
func (b *batcher) run(ctx context.Context, s Script, args []any) *redis.Cmd {
	b.mu.Lock()
	if b.free() && len(b.queue) == 0 {
		b.senders++
		b.mu.Unlock()
		w := b.watch()
		cmd := s.run(ctx, b.rdb, args)
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
		return ErrCmd(ctx, notSentError{err})
	}
	bc, _ := batchedCalls.Get().(*batchedCall)
	if bc == nil {
		bc = &batchedCall{done: make(chan struct{}, 1)}
	}
	bc.ctx, bc.s, bc.args = ctx, s, args
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
			return ErrCmd(ctx, notSentError{ctx.Err()})
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
		return ErrCmd(ctx, inFlightError{ctx.Err(), bc.done})
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

// InFlight returns the channel that receives once the pipeline that
// carried the failed call of err is over, or nil when err is not one of a
// call that left its pipeline under way.
func InFlight(err error) <-chan struct{} {
	if err == nil {
		return nil // before e, which escapes to the heap: a success allocates nothing
	}
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
	b.work.Add()
	go b.sender()
}

// sender sends the queue, batch after batch, until none is left; then it
// gives its place up.
func (b *batcher) sender() {
	defer b.work.Done()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.senders--
			b.mu.Unlock()
			return
		}
		n := min(len(b.queue), MaxBatch)
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
		bc.cmd = bc.s.run(bc.ctx, b.rdb, bc.args)
		bc.done <- struct{}{}
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	pipe := b.rdb.Pipeline()
	for _, bc := range batch {
		bc.cmd = bc.s.cmd(ctx, bc.args, true)
		_ = pipe.Process(ctx, bc.cmd)
	}
	_, _ = pipe.Exec(ctx)
	var again redis.Pipeliner
	for _, bc := range batch {
		// HasErrorPrefix allocates even for a nil error: only a failure pays.
		if err := bc.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if again == nil {
				again = b.rdb.Pipeline()
			}
			// A new slice: the EVALSHA's command keeps its arguments.
			bc.cmd = bc.s.cmd(ctx, append([]any(nil), bc.args...), false)
			_ = again.Process(ctx, bc.cmd)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	for _, bc := range batch {
		bc.done <- struct{}{}
	}
}

// batchContext is the context of a pipeline shared by the calls of batch.
// It carries no call's values: the client's hooks (tracing) must not see
// one request's values beside the others' scripts. No call's end cancels
// it (the others still wait for its reply), and when every call has a
// deadline, it ends at the latest one, when nobody waits any more (go-redis
// applies it to the connection's reads with ContextTimeoutEnabled; else the
// client's timeouts bound the pipeline).
func batchContext(batch []*batchedCall) (context.Context, context.CancelFunc) {
	ctx := context.Background()
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

// ErrCmd returns a command that failed with err before it was sent.
func ErrCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// NotSent reports whether err is that of a call whose script was never
// sent: its context ended while it was queued.
func NotSent(err error) bool {
	if err == nil {
		return false // before ns, which escapes to the heap
	}
	var ns notSentError
	return errors.As(err, &ns)
}
