package faultconn

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// readChunk is how much a connection reads from the server at a time.
const readChunk = 32 << 10

// pending is a command sent (or cut off) whose reply has not been
// delivered yet.
type pending struct {
	action    Action // 0: deliver the reply as it comes
	delay     time.Duration
	holdUntil time.Time // DelayReply: set when the reply's first byte arrived
}

// conn is a net.Conn that applies an Injector's rules.
//
// It implements syscall.Conn so that go-redis's health check of idle pooled
// connections (a MSG_PEEK on the socket) works as on a plain TCP connection
// and notices connections the server closed. An idle connection holds no
// undelivered data, so the peek cannot miss any. It does not implement
// NetConn, which would let go-redis read past the rules.
type conn struct {
	nc net.Conn
	in *Injector

	wmu  sync.Mutex // serializes Write; guards wbuf and wraw
	wbuf []byte     // the start of a command whose end has not been written yet
	wraw bool       // the client wrote something that is not RESP: forward as is

	rmu    sync.Mutex // serializes Read; guards rbuf, rx, rxDone, rxSent and rxErr
	rbuf   []byte     // scratch buffer for reads from nc
	rx     []byte     // received from the server; starts at a value boundary
	rxDone int        // rx[:rxDone] holds complete values, accounted for in queue
	rxSent int        // rx[:rxSent] has been handed to the client
	rxErr  error      // the error that ended reading from nc, after rx is drained

	mu       sync.Mutex    // guards the fields below; never held while blocking
	queue    []pending     // replies to come, oldest first; the CloseBefore entry is last
	unpaired bool          // replies no longer match commands one to one
	loose    *pending      // the action for the next data when unpaired
	resp3    bool          // the client switched to RESP3 with HELLO 3
	cut      bool          // nothing more is forwarded to the server
	failed   bool          // the fault fired: nc is closed and Read returns io.EOF
	closed   bool          // Close was called
	deadline time.Time     // the client's read deadline
	wake     chan struct{} // closed and replaced when deadline or closed change
}

func newConn(nc net.Conn, in *Injector) *conn {
	return &conn{nc: nc, in: in, wake: make(chan struct{})}
}

// Write parses the commands in p, offers each complete one to the rules and
// forwards to the server those that may pass. It holds back the start of a
// command until its end is written, so that a command cut off by
// CloseBefore never partly reaches the server. Write reports success for
// bytes it discards after a fault, as a socket does whose peer is gone.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	closed, failed, cut := c.closed, c.failed, c.cut
	c.mu.Unlock()
	if closed || failed {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
	}
	if cut {
		return len(p), nil
	}
	if c.wraw {
		return c.nc.Write(p)
	}

	c.wbuf = append(c.wbuf, p...)
	send := 0 // c.wbuf[:send] is forwarded
	for send < len(c.wbuf) {
		cmd, n, err := parseCommand(c.wbuf[send:])
		if err != nil {
			// Not RESP from here on: stop judging and pairing.
			c.wraw = true
			c.mu.Lock()
			c.unpaired = true
			c.mu.Unlock()
			send = len(c.wbuf)
			break
		}
		if n == 0 {
			break // the rest of this command is yet to be written
		}
		if c.admit(cmd) {
			send += n
		}
		c.mu.Lock()
		cut = c.cut
		c.mu.Unlock()
		if cut {
			break
		}
	}
	// Forward before keeping the rest: the rest moves to the start of
	// c.wbuf, over the bytes being forwarded.
	var err error
	if send > 0 {
		_, err = c.nc.Write(c.wbuf[:send])
	}
	if cut {
		c.wbuf = nil
	} else {
		c.wbuf = append(c.wbuf[:0], c.wbuf[send:]...)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// admit offers cmd to the rules, records the reply it expects and reports
// whether cmd is to be forwarded.
func (c *conn) admit(cmd []string) bool {
	if len(cmd) == 0 {
		return true // an empty array: the server skips it and answers nothing
	}
	rule, acts := c.in.decide(cmd)
	c.mu.Lock()
	defer c.mu.Unlock()
	p := pending{}
	if acts {
		p.action, p.delay = rule.Action, rule.Delay
	}
	if p.action == CloseBefore {
		// Read returns io.EOF where the reply would be; nothing more is sent.
		c.cut = true
		if c.unpaired {
			c.loose = &p
		} else {
			c.queue = append(c.queue, p)
		}
		return false
	}
	if p.action == DropReply {
		c.cut = true
	}

	switch cmd[0] {
	case "HELLO":
		if len(cmd) > 1 {
			c.resp3 = cmd[1] == "3"
		}
	case "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE":
		// RESP2 answers with one array per channel, and messages look
		// alike: replies can no longer be paired with commands. RESP3
		// answers with push messages, which belong to no command: an
		// action on the command can only apply to the next data.
		if !c.resp3 || p.action != 0 {
			c.unpaired = true
		}
		if p.action != 0 {
			c.loose = &p
		}
		return true
	case "MONITOR":
		c.unpaired = true
	}
	if c.unpaired {
		if p.action != 0 {
			c.loose = &p
		}
		return true
	}
	c.queue = append(c.queue, p)
	return true
}

// Read delivers the server's replies, except where a rule drops or holds
// one.
func (c *conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		avail, fault, hold := c.classify()
		if avail > c.rxSent {
			n := copy(p, c.rx[c.rxSent:avail])
			c.rxSent += n
			c.trim()
			return n, nil
		}
		if fault {
			c.fail()
			return 0, io.EOF
		}
		if !hold.IsZero() {
			if err := c.sleepUntil(hold); err != nil {
				return 0, err
			}
			continue
		}
		c.mu.Lock()
		failed := c.failed
		c.mu.Unlock()
		if failed {
			return 0, io.EOF
		}
		if c.rxErr != nil {
			return 0, c.rxErr
		}
		if err := c.fill(); err != nil {
			return 0, err
		}
	}
}

// fill reads once from the server into rx. A timeout is returned at once
// and leaves the connection usable; any other error ends reading once the
// data before it is delivered.
func (c *conn) fill() error {
	if c.rbuf == nil {
		c.rbuf = make([]byte, readChunk)
	}
	n, err := c.nc.Read(c.rbuf)
	c.rx = append(c.rx, c.rbuf[:n]...)
	if err == nil {
		return nil
	}
	var ne net.Error
	if n == 0 && errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	if !(errors.As(err, &ne) && ne.Timeout()) {
		c.rxErr = err
	}
	return nil
}

// classify walks the values received so far, pairing replies with queued
// commands. It returns how much of rx may be handed to the client now, and
// whether a fault is due (once everything before it was delivered), or a
// time to hold the data until.
func (c *conn) classify() (avail int, fault bool, hold time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed {
		return 0, false, time.Time{}
	}
	for {
		if c.unpaired {
			return c.classifyLoose()
		}
		var head *pending
		if len(c.queue) > 0 {
			head = &c.queue[0]
		}
		if head != nil && head.action == CloseBefore {
			return c.rxDone, c.rxSent >= c.rxDone, time.Time{}
		}
		if c.rxDone == len(c.rx) {
			return c.rxDone, false, time.Time{}
		}
		isPush := c.rx[c.rxDone] == '>'
		if !isPush && head != nil && c.rxSent >= c.rxDone {
			switch head.action {
			case DropReply:
				// The reply has begun: the command ran.
				return c.rxDone, true, time.Time{}
			case DelayReply:
				if head.holdUntil.IsZero() {
					head.holdUntil = time.Now().Add(head.delay)
				}
				if time.Now().Before(head.holdUntil) {
					return c.rxDone, false, head.holdUntil
				}
				head.action = 0
			}
		}
		if !isPush && head != nil && head.action != 0 {
			// Deliver what precedes the reply first.
			return c.rxDone, false, time.Time{}
		}
		n, err := replyEnd(c.rx[c.rxDone:])
		if err != nil {
			c.unpaired = true
			continue
		}
		if n == 0 {
			// Incomplete: stream what has come of it.
			return len(c.rx), false, time.Time{}
		}
		c.rxDone += n
		if !isPush && head != nil {
			c.queue = c.queue[1:]
		}
	}
}

// classifyLoose is classify for a connection whose replies are no longer
// paired with commands: a pending action applies to the next data. c.mu
// must be held.
func (c *conn) classifyLoose() (avail int, fault bool, hold time.Time) {
	// Whatever was paired before still goes out first.
	if c.rxSent < c.rxDone {
		return c.rxDone, false, time.Time{}
	}
	c.rxDone = c.rxSent
	// Queued entries can no longer be paired: the first action among them
	// applies to the next data.
	for _, q := range c.queue {
		if q.action != 0 && c.loose == nil {
			c.loose = &q
		}
	}
	c.queue = nil
	if c.loose == nil {
		return len(c.rx), false, time.Time{}
	}
	if c.loose.action == CloseBefore {
		return c.rxDone, true, time.Time{}
	}
	if len(c.rx) == c.rxSent {
		return c.rxSent, false, time.Time{}
	}
	switch c.loose.action {
	case DropReply:
		return c.rxSent, true, time.Time{}
	case DelayReply:
		if c.loose.holdUntil.IsZero() {
			c.loose.holdUntil = time.Now().Add(c.loose.delay)
		}
		if time.Now().Before(c.loose.holdUntil) {
			return c.rxSent, false, c.loose.holdUntil
		}
	}
	c.loose = nil
	return len(c.rx), false, time.Time{}
}

// trim drops the bytes at the start of rx that were delivered and whose
// values are complete.
func (c *conn) trim() {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(c.rxSent, c.rxDone)
	if k == 0 {
		return
	}
	c.rx = append(c.rx[:0], c.rx[k:]...)
	c.rxSent -= k
	c.rxDone -= k
}

// fail closes the connection to the server: the fault has fired.
func (c *conn) fail() {
	c.mu.Lock()
	c.failed = true
	c.mu.Unlock()
	_ = c.nc.Close()
}

// sleepUntil waits until t, returning early with a timeout error if the
// read deadline passes first, or with an error if the conn is closed.
func (c *conn) sleepUntil(t time.Time) error {
	for {
		c.mu.Lock()
		deadline, wake, closed := c.deadline, c.wake, c.closed
		c.mu.Unlock()
		if closed {
			return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
		}
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.ErrDeadlineExceeded}
		}
		if !now.Before(t) {
			return nil
		}
		end := t
		if !deadline.IsZero() && deadline.Before(end) {
			end = deadline
		}
		timer := time.NewTimer(end.Sub(now))
		select {
		case <-timer.C:
		case <-wake:
			timer.Stop()
		}
	}
}

// setReadDeadline records the read deadline and wakes a held Read.
func (c *conn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	close(c.wake)
	c.wake = make(chan struct{})
}

// Close closes the connection and wakes a held Read.
func (c *conn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.wake)
		c.wake = make(chan struct{})
	}
	c.mu.Unlock()
	return c.nc.Close()
}

// LocalAddr returns the local address of the connection to the server.
func (c *conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// RemoteAddr returns the server's address.
func (c *conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *conn) SetDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.nc.SetDeadline(t)
}

// SetReadDeadline sets the read deadline, which also ends a held reply.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.nc.SetReadDeadline(t)
}

// SetWriteDeadline sets the write deadline.
func (c *conn) SetWriteDeadline(t time.Time) error {
	return c.nc.SetWriteDeadline(t)
}

// SyscallConn returns the raw connection of the socket underneath.
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return nil, errors.New("faultconn: the underlying connection has no file descriptor")
	}
	return sc.SyscallConn()
}
