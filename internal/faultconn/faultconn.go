// Package faultconn wraps the connections a go-redis client dials so that
// tests can lose, delay or cut chosen commands and their replies.
//
// An Injector holds Rules. Its Dialer goes into redis.Options.Dialer (or
// redis.ClusterOptions.Dialer); every connection it dials reads the RESP
// commands the client writes and offers each one to the rules. A rule that
// acts on a command does one of three things:
//
//   - DropReply: the command reaches Redis and runs there; once the first
//     byte of its reply has arrived (proof that it ran), the connection is
//     closed and the client reads io.EOF instead of the reply. Replies to
//     commands sent before it are delivered first. Commands written after
//     it, in the same pipeline or later, never reach Redis.
//   - CloseBefore: the command never reaches Redis, nor does anything the
//     client writes after it. Replies to commands sent before it are
//     delivered; then the client reads io.EOF where the command's reply
//     would be.
//   - DelayReply: the reply is held for the rule's Delay after its first
//     byte arrived, then delivered. The client's read deadline still
//     applies: if it passes during the hold, the read fails with a timeout
//     (os.ErrDeadlineExceeded), as with a slow network.
//
// In every case the client's Write succeeds, like a write into a TCP
// socket whose peer is gone, and the failure shows on its Read as io.EOF.
// go-redis retries a command that failed with io.EOF (MaxRetries, 3 by
// default, -1 for none) on a new connection, where the rules are consulted
// again; that is how tests show that a command is safe to run twice.
//
// To know which reply belongs to which command, a connection parses the
// replies (RESP2 and RESP3; RESP3 push messages belong to no command). On a
// connection that subscribed to a channel while speaking RESP2, or that
// ran MONITOR, replies no longer match commands one to one; the same holds
// for the push messages that answer a SUBSCRIBE (or PSUBSCRIBE, SSUBSCRIBE
// and their UNSUBSCRIBEs) in RESP3. There a connection stops pairing, and a
// DropReply or DelayReply acts on the next data that arrives from the
// server, whatever it is: for a rule on SUBSCRIBE that is the confirmation.
package faultconn

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Action is what a Rule does to the command it acts on.
type Action int

const (
	// DropReply lets the command run on the server and loses its reply:
	// the connection is closed and the client reads io.EOF.
	DropReply Action = iota + 1
	// DelayReply holds the command's reply for the Rule's Delay.
	DelayReply
	// CloseBefore closes the connection before the command is sent, so it
	// never reaches the server; the client reads io.EOF.
	CloseBefore
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case DropReply:
		return "DropReply"
	case DelayReply:
		return "DelayReply"
	case CloseBefore:
		return "CloseBefore"
	default:
		return fmt.Sprintf("Action(%d)", int(a))
	}
}

// Rule says which commands to act on and how.
type Rule struct {
	// Match reports whether the rule concerns a command. cmd holds the
	// command's name, upper-cased, then its arguments as sent. A nil Match
	// matches every command, including the ones go-redis sends when it
	// connects (HELLO, CLIENT SETINFO). Match must not call the Injector.
	Match func(cmd []string) bool

	// Nth makes the rule act on only the Nth command it matched (counting
	// from 1 over all connections of the Injector) and then never again.
	// The default, 0, acts on every match.
	Nth int

	// Action is what the rule does. It must be set.
	Action Action

	// Delay is how long DelayReply holds the reply. Other actions ignore it.
	Delay time.Duration
}

// Injector applies rules to the connections its Dialer makes. It is safe
// for concurrent use; rules added or removed take effect at the next
// command of every connection, including those already open.
type Injector struct {
	mu    sync.Mutex
	rules []*ruleState // guarded by mu; in the order added
	hits  int          // guarded by mu; how many times a rule acted
}

// ruleState is a Rule and how far it got.
type ruleState struct {
	Rule
	matches int  // commands matched so far
	spent   bool // an Nth rule that has acted
}

// New returns an Injector with rules.
func New(rules ...Rule) *Injector {
	in := &Injector{}
	for _, r := range rules {
		in.Add(r)
	}
	return in
}

// Add adds a rule after the existing ones. It panics if r.Action is not
// one of DropReply, DelayReply and CloseBefore, or r.Nth is negative.
func (in *Injector) Add(r Rule) {
	switch r.Action {
	case DropReply, DelayReply, CloseBefore:
	default:
		panic(fmt.Sprintf("faultconn: rule with invalid action %v", r.Action))
	}
	if r.Nth < 0 {
		panic(fmt.Sprintf("faultconn: rule with negative Nth %d", r.Nth))
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.rules = append(in.rules, &ruleState{Rule: r})
}

// Reset removes all rules and sets Hits back to 0. Open connections stay
// open, and a fault already under way (a reply being dropped or held)
// completes.
func (in *Injector) Reset() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.rules = nil
	in.hits = 0
}

// Hits returns how many times a rule acted on a command since New or the
// last Reset. It counts when the command is written, before its fault
// shows on the client's side.
func (in *Injector) Hits() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hits
}

// decide offers cmd to the rules in the order they were added and returns
// the first one that acts on it. Rules after that one do not see cmd.
func (in *Injector) decide(cmd []string) (Rule, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, r := range in.rules {
		if r.spent || (r.Match != nil && !r.Match(cmd)) {
			continue
		}
		r.matches++
		if r.Nth == 0 || r.matches == r.Nth {
			r.spent = r.Nth != 0
			in.hits++
			return r.Rule, true
		}
	}
	return Rule{}, false
}

// Dialer returns a function for redis.Options.Dialer or
// redis.ClusterOptions.Dialer whose connections obey the Injector's rules.
// It connects to addr, whatever address the client asks for; with addr ""
// it connects to the address the client asks for, which is what a cluster
// client needs.
func (in *Injector) Dialer(addr string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	target := addr
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if target != "" {
			addr = target
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newConn(nc, in), nil
	}
}

// IsCommand returns a Match function for commands named name, in any case.
func IsCommand(name string) func(cmd []string) bool {
	name = strings.ToUpper(name)
	return func(cmd []string) bool {
		return len(cmd) > 0 && cmd[0] == name
	}
}

// IsScript returns a Match function for runs of the Lua script whose SHA1
// is sha (hex, in any case): EVALSHA and EVALSHA_RO with that sha, and
// EVAL and EVAL_RO of a script body that hashes to it.
func IsScript(sha string) func(cmd []string) bool {
	sha = strings.ToLower(sha)
	return func(cmd []string) bool {
		if len(cmd) < 2 {
			return false
		}
		switch cmd[0] {
		case "EVALSHA", "EVALSHA_RO":
			return strings.ToLower(cmd[1]) == sha
		case "EVAL", "EVAL_RO":
			sum := sha1.Sum([]byte(cmd[1]))
			return hex.EncodeToString(sum[:]) == sha
		}
		return false
	}
}
