package httpidem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
)

// WithRecovery makes the requests the middleware handles recoverable: each
// runs as the operation name registered on the middleware's Client
// (idem.Register), whose stored input is the request: its method, URL,
// host, Content-Type, body, key, scope (WithScope) and the request headers
// listed in headers, and no others (Authorization, cookies and the like
// only when named). When no caller comes back for a request whose handler
// did not finish (its process died, it panicked, it answered 5xx), a
// Recover loop of the Client (idem.Client.Recover) rebuilds the request
// and runs the handler again in-process, in any process where the same
// middleware is mounted; its response is stored as the middleware stores
// one, and the client's retry or a status check (StatusHandler) gets it.
//
// A recovered request's context carries no values of the original: the
// outer middleware that authenticated it does not run again. The handler
// reads its principal with ScopeFrom, or authenticates from the headers
// named here. Its context ends after WithHandlerTimeout, as a request's.
//
// A request whose input would exceed idem.MaxInputSize runs as without
// WithRecovery: it is handled and stored all the same, but not recovered
// without a retry (WithMaxBody can refuse such bodies with 413 instead).
// The key-reuse check compares WithFingerprint's fingerprint as without
// this option, but the record holds it under another digest: a retry that
// crosses a deployment turning the option on or off gets 422.
//
// The name is registered when New's middleware wraps a handler: wrapping a
// second handler with the same name, or registering it otherwise on the
// Client, panics (as idem.Register does); StatusHandler registers nothing.
// The default runs requests without a stored input: only a retry finishes
// them.
func WithRecovery(name string, headers ...string) Option {
	return func(c *config) {
		if name == "" {
			c.problem("WithRecovery(%q): needs an operation name", name)
			return
		}
		c.recovery = name
		c.recoveryHeaders = nil
		for _, h := range headers {
			if h == "" || strings.ContainsAny(h, " :\r\n\t") {
				c.problem("WithRecovery(%q, %q): not a header name", name, h)
				continue
			}
			c.recoveryHeaders = append(c.recoveryHeaders, http.CanonicalHeaderKey(h))
		}
	}
}

// ScopeFrom returns the scope (WithScope's principal) of the request whose
// handler ctx belongs to, on a request run by the middleware with a key,
// first or recovered (WithRecovery); ok is false elsewhere.
func ScopeFrom(ctx context.Context) (scope string, ok bool) {
	s, ok := ctx.Value(scopeKey{}).(string)
	return s, ok
}

// scopeKey is the context key of ScopeFrom.
type scopeKey struct{}

// liveKey is the context key under which the middleware hands its
// registered operation the request it is serving (a *live): without one,
// the operation is being recovered.
type liveKey struct{}

// live is a request being served, with what its run of the handler
// leaves for ServeHTTP to answer with.
type live struct {
	w http.ResponseWriter
	g *gate
	r *http.Request

	// Set by serve.
	rec           *recorder
	decided, mine bool // idem.LedgerDecided
}

// serve runs the handler for l's request on ctx (idem's fn context) and
// returns its outcome for idem to store. The handler's context does not
// carry l: a Recover loop started from it recovers, it does not serve l.
func (m *middleware) serve(ctx context.Context, l *live) ([]byte, error) {
	ctx = context.WithValue(ctx, liveKey{}, (*live)(nil))
	l.rec = newRecorder(l.w, l.g, m.cfg.maxResponse, m.private)
	m.next.ServeHTTP(l.rec, l.r.WithContext(ctx))
	l.decided, l.mine = idem.LedgerDecided(ctx)
	return l.rec.outcome()
}

// register registers m's operation (WithRecovery) on its Client.
func (m *middleware) register() {
	m.op = idem.Register(m.c, m.cfg.recovery, func(ctx context.Context, q request) ([]byte, error) {
		if l, _ := ctx.Value(liveKey{}).(*live); l != nil {
			return m.serve(ctx, l)
		}
		return m.recover(ctx, q)
	})
}

// run runs l's request under the key: as m's operation, with the request
// as its input, when it is recoverable and fits; else as a plain call.
func (m *middleware) run(ctx context.Context, key, fp, scope string, body []byte, l *live) ([]byte, error) {
	if m.op != nil {
		q := m.request(l.r, fp, scope, body)
		if q.size() <= idem.MaxInputSize {
			return m.op.Do(context.WithValue(ctx, liveKey{}, l), key, q)
		}
		m.log(l.r, key, slog.LevelWarn, "httpidem: request too large to store for recovery (idem.MaxInputSize); it runs unrecoverable", nil,
			slog.Int("size", q.size()), slog.Int("limit", idem.MaxInputSize))
	}
	return m.c.Do(ctx, key, fp, func(ctx context.Context) ([]byte, error) { return m.serve(ctx, l) })
}

// recover runs the handler again for a stored request that no caller
// finished (idem.Client.Recover): on a request rebuilt from it, whose
// response is recorded but sent nowhere. A panic is the attempt's
// transient failure, as a 5xx is: the key is released, and the recovery
// counts as one that did not finish.
func (m *middleware) recover(ctx context.Context, q request) (res []byte, err error) {
	ctx, cancel := context.WithTimeoutCause(context.WithValue(ctx, scopeKey{}, q.scope), m.cfg.handlerTimeout, errHandlerTimeout)
	defer cancel()
	r, err := q.rebuild(ctx, m.cfg.header)
	if err != nil {
		return nil, idem.Permanent(err)
	}
	a, _ := idem.AttemptFrom(ctx)
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				m.log(r, a.Key, slog.LevelError, "httpidem: a recovered request's handler panicked; its key was released", nil,
					slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			}
			res, err = nil, fmt.Errorf("httpidem: the recovered request's handler panicked: %v", p)
		}
	}()
	g := new(gate)
	g.close() // nobody listens: a response streamed past WithMaxResponse is dropped
	l := &live{w: discard{h: http.Header{}}, g: g, r: r}
	return m.serve(ctx, l)
}

// request is a request as WithRecovery stores it: the input of the
// middleware's operation.
type request struct {
	fp          string // the middleware's fingerprint (see MarshalText)
	method      string
	url         string // the request target, as r.URL.RequestURI
	host        string
	contentType string
	key         string // the key header's value, as sent
	scope       string
	header      http.Header // the headers WithRecovery names
	body        []byte
}

// request returns the stored form of r, with its fingerprint, scope and
// body.
func (m *middleware) request(r *http.Request, fp, scope string, body []byte) request {
	q := request{
		fp:          fp,
		method:      r.Method,
		url:         r.URL.RequestURI(),
		host:        r.Host,
		contentType: r.Header.Get("Content-Type"),
		key:         r.Header.Get(m.cfg.header),
		scope:       scope,
		body:        body,
	}
	for _, h := range m.cfg.recoveryHeaders {
		if vs := r.Header.Values(h); len(vs) > 0 {
			if q.header == nil {
				q.header = http.Header{}
			}
			q.header[h] = vs
		}
	}
	return q
}

// rebuild returns the request q stores, on ctx, with its key under the key
// header name.
func (q request) rebuild(ctx context.Context, keyHeader string) (*http.Request, error) {
	r, err := http.NewRequestWithContext(ctx, q.method, q.url, bytes.NewReader(q.body))
	if err != nil {
		return nil, fmt.Errorf("httpidem: the stored request cannot be rebuilt: %w", err)
	}
	if q.body == nil {
		r.Body, r.GetBody = http.NoBody, nil
	}
	r.RequestURI = q.url
	r.Host = q.host
	for k, vs := range q.header {
		r.Header[k] = vs
	}
	if q.contentType != "" {
		r.Header.Set("Content-Type", q.contentType)
	}
	r.Header.Set(keyHeader, q.key)
	return r, nil
}

// The stored form of a request, version 1, in door's framing:
//
//	"q" 0x01 fingerprint method url host content-type key scope headers body
//
// with each field but the body a door string, the headers door pairs, and
// the body running to the end. idem's codec stores it as one msgpack bin
// (MarshalMsgpack).
const (
	requestMagic   = 'q'
	requestVersion = 1
)

// frame returns q's stored form.
func (q *request) frame() []byte {
	b := make([]byte, 0, q.frameSize())
	b = door.AppendFrame(b, requestMagic, requestVersion)
	for _, s := range [...]string{q.fp, q.method, q.url, q.host, q.contentType, q.key, q.scope} {
		b = door.AppendString(b, s)
	}
	b = door.AppendPairs(b, q.header)
	return append(b, q.body...)
}

// frameSize is len(q.frame()).
func (q *request) frameSize() int {
	n := 2 + door.PairsSize(q.header) + len(q.body)
	for _, s := range [...]string{q.fp, q.method, q.url, q.host, q.contentType, q.key, q.scope} {
		n += door.UvarintLen(uint64(len(s))) + len(s)
	}
	return n
}

// size is the size of q's encoding as the operation's input: its frame in
// a msgpack bin.
func (q *request) size() int {
	n := q.frameSize()
	switch {
	case n <= 0xff:
		return 2 + n
	case n <= 0xffff:
		return 3 + n
	}
	return 5 + n
}

// MarshalMsgpack is how idem stores q (msgpack.Marshaler): its frame, as a
// msgpack bin.
func (q request) MarshalMsgpack() ([]byte, error) {
	f := q.frame()
	if uint64(len(f)) > 0xffffffff {
		return nil, errors.New("httpidem: request too large")
	}
	b := make([]byte, 0, q.size())
	switch n := len(f); {
	case n <= 0xff:
		b = append(b, 0xc4, byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, f...), nil
}

// UnmarshalMsgpack reads what MarshalMsgpack wrote (msgpack.Unmarshaler).
func (q *request) UnmarshalMsgpack(b []byte) error {
	f, ok := unbin(b)
	if !ok {
		return door.Corrupt("stored request: not a msgpack bin")
	}
	d, err := door.ReadFrame(f, requestMagic, requestVersion)
	if err != nil {
		return err
	}
	var fields [7]string
	for i := range fields {
		s, ok := d.String()
		if !ok {
			return door.Corrupt("stored request: truncated")
		}
		fields[i] = s
	}
	h, ok := d.Pairs()
	if !ok {
		return door.Corrupt("stored request: truncated header")
	}
	*q = request{
		fp: fields[0], method: fields[1], url: fields[2], host: fields[3], contentType: fields[4], key: fields[5], scope: fields[6],
		header: h, body: bytes.Clone(d.Rest()),
	}
	return nil
}

// unbin returns the bytes of the msgpack bin b (bin 8, 16 or 32), the
// whole of b; ok is false when b is not one.
func unbin(b []byte) (f []byte, ok bool) {
	var n, head int
	switch {
	case len(b) >= 2 && b[0] == 0xc4:
		n, head = int(b[1]), 2
	case len(b) >= 3 && b[0] == 0xc5:
		n, head = int(binary.BigEndian.Uint16(b[1:])), 3
	case len(b) >= 5 && b[0] == 0xc6:
		n, head = int(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, false
	}
	if len(b)-head != n {
		return nil, false
	}
	return b[head:], true
}

// MarshalText is what idem.Fingerprint hashes of q (with its type's
// name): the middleware's fingerprint (WithFingerprint), so that the
// key-reuse check is the middleware's, whatever else q holds. It is
// stored with q, so that a recovery, which fingerprints the decoded
// input, claims under the same fingerprint.
func (q request) MarshalText() ([]byte, error) { return []byte(q.fp), nil }

// discard is the ResponseWriter behind a recovered request's recorder: its
// response goes nowhere but into the record.
type discard struct{ h http.Header }

func (d discard) Header() http.Header         { return d.h }
func (d discard) Write(p []byte) (int, error) { return len(p), nil }
func (d discard) WriteHeader(int)             {}

// withoutRecovery undoes WithRecovery, for StatusHandler, which runs no
// handler and registers nothing.
func withoutRecovery() Option {
	return func(c *config) { c.recovery, c.recoveryHeaders = "", nil }
}
