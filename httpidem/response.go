package httpidem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/door"
)

// errNotStored is the stored outcome of a response too large to buffer: the
// handler ran, so the key is finished, but there is nothing to replay.
var errNotStored = errors.New("httpidem: response too large to store")

// statusError is the transient outcome of a 5xx response: the key is
// released and a retry runs the handler again.
type statusError struct{ status int }

func (e *statusError) Error() string {
	return fmt.Sprintf("httpidem: the handler answered %d, which is not stored", e.status)
}

// response is a response as the middleware stores and replays it.
type response struct {
	status int
	header http.Header // what is stored: see storable
	body   []byte
}

// write sends r on w: the stored headers over those already on w,
// Content-Length from the body, and Idempotent-Replayed: true on a replay.
func (r response) write(w http.ResponseWriter, replayed bool) {
	h := w.Header()
	for k, vs := range r.header {
		h[k] = slices.Clone(vs)
	}
	h.Del(HeaderReplayed)
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	allowed := bodyAllowed(r.status)
	if allowed {
		h.Set("Content-Length", strconv.Itoa(len(r.body)))
	} else {
		h.Del("Content-Length")
	}
	w.WriteHeader(r.status)
	if allowed && len(r.body) > 0 {
		_, _ = w.Write(r.body) // a client gone is nothing to report
	}
}

// bodyAllowed reports whether a response with the status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// The stored form of a response, version 1:
//
//	"h" 0x01 status n (len(name) name len(value) value)×n body
//
// with status, n and the lengths as unsigned varints, one (name, value)
// pair per header value, names sorted, and the body running to the end.
const (
	formatMagic   = 'h'
	formatVersion = 1
)

// encode returns the stored form of r.
func (r response) encode() []byte {
	b := make([]byte, 0, encodedSize(r.status, r.header)+len(r.body))
	b = door.AppendFrame(b, formatMagic, formatVersion)
	b = door.AppendUvarint(b, uint64(r.status))
	b = door.AppendPairs(b, r.header)
	return append(b, r.body...)
}

// encodedSize is the size of the stored form of a response with the
// status and headers, without its body.
func encodedSize(status int, h http.Header) int {
	return 2 + door.UvarintLen(uint64(status)) + door.PairsSize(h)
}

// decodeResponse reads the stored form of a response, bare or as the
// msgpack bin in which a recoverable request's record holds it
// (WithRecovery: the typed operation's encoding of the bytes). The body it
// returns shares b's memory.
func decodeResponse(b []byte) (response, error) {
	if f, ok := unbin(b); ok {
		b = f
	}
	d, err := door.ReadFrame(b, formatMagic, formatVersion)
	if err != nil {
		return response{}, err
	}
	status, ok := d.Uvarint()
	if !ok || status < 100 || status > 999 {
		return response{}, door.Corrupt("invalid status")
	}
	h, ok := d.Pairs()
	if !ok {
		return response{}, door.Corrupt("truncated header")
	}
	if h == nil {
		h = http.Header{}
	}
	return response{status: int(status), header: h, body: d.Rest()}, nil
}

// storable returns the headers of h that are stored: all but the hop-by-hop
// ones (RFC 9110, section 7.6.1, and those that Connection names), Date,
// Content-Length (set again from the body), trailers, and
// Idempotent-Replayed.
func storable(h http.Header) http.Header {
	var named []string // by Connection
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			named = append(named, http.CanonicalHeaderKey(strings.TrimSpace(name)))
		}
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k) // no allocation for a name already canonical
		if notStored[ck] || slices.Contains(named, ck) || strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		out[k] = slices.Clone(vs)
	}
	return out
}

// notStored holds the canonical names of the headers that are never
// stored.
var notStored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Date": true, "Content-Length": true, HeaderReplayed: true,
}

// recorder is the ResponseWriter the handler writes to: it buffers the
// response up to a limit, and past it sends everything on to the real
// writer as it comes (the response is then not stored).
type recorder struct {
	w       http.ResponseWriter // written only through gate
	gate    *gate
	limit   int             // of the stored form's size
	private map[string]bool // headers not stored (but sent to this request's client)
	header  http.Header

	status   int
	wrote    bool        // the final status is written
	snapshot http.Header // the headers when the status was written
	body     bytes.Buffer
	size     int  // of the stored form so far
	streamed bool // past the limit: the response goes straight to w
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func newRecorder(w http.ResponseWriter, g *gate, limit int, private map[string]bool) *recorder {
	return &recorder{w: w, gate: g, limit: limit, private: private, header: make(http.Header)}
}

// Header returns the response's headers. It starts empty: headers set by
// outer middleware stay on the real response and are not stored.
func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader records the status and the headers as they are now.
// Informational (1xx) statuses other than 101 are dropped.
func (rec *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status)) // as net/http
	}
	if rec.wrote || (status < 200 && status != http.StatusSwitchingProtocols) {
		return
	}
	rec.status, rec.wrote = status, true
	rec.snapshot = rec.header.Clone()
	rec.size = encodedSize(status, storable(rec.snapshot))
	if rec.size > rec.limit {
		rec.stream()
	}
}

// Write buffers p, or sends it on once the response has outgrown the
// buffer.
func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rec.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if !rec.streamed && rec.size+len(p) > rec.limit {
		rec.stream()
	}
	if rec.streamed {
		var n int
		var err error
		if !rec.gate.pass(func() { n, err = rec.w.Write(p) }) {
			return 0, errClientGone
		}
		return n, err
	}
	rec.size += len(p)
	return rec.body.Write(p)
}

// stream sends the status, the headers and the body so far to the real
// writer, unless the request's context has ended; what follows goes
// straight there.
func (rec *recorder) stream() {
	rec.streamed = true
	rec.gate.pass(func() {
		h := rec.w.Header()
		for k, vs := range rec.snapshot {
			h[k] = vs
		}
		rec.w.WriteHeader(rec.status)
		if rec.body.Len() > 0 {
			_, _ = rec.w.Write(rec.body.Bytes())
		}
	})
	rec.body = bytes.Buffer{}
}

// Flush sends what was written to the client once the response is too
// large to buffer; before that it does nothing.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// FlushError is Flush for http.ResponseController, which reports the real
// writer's error.
func (rec *recorder) FlushError() error {
	if !rec.streamed {
		return nil
	}
	var err error
	if !rec.gate.pass(func() { err = http.NewResponseController(rec.w).Flush() }) {
		return errClientGone
	}
	return err
}

// Hijack is not supported: what a hijacked connection carries cannot be
// stored.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("httpidem: Hijack behind the idempotency middleware: %w", http.ErrNotSupported)
}

// Unwrap returns the real ResponseWriter, for http.ResponseController's
// deadlines. Writing to it directly bypasses the middleware.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// response returns the buffered response in its stored form's terms.
func (rec *recorder) response() response {
	return response{status: rec.status, header: storable(rec.snapshot), body: rec.body.Bytes()}
}

// outcome returns what fn returns to idem.Client.Do once the handler
// returned: the stored form of the response; a transient error for a 5xx
// (the key is released); a permanent one for a response that was too large
// to store (the handler ran: it must not run again).
func (rec *recorder) outcome() ([]byte, error) {
	if !rec.wrote {
		rec.WriteHeader(http.StatusOK)
	}
	switch {
	case rec.status >= 500:
		return nil, &statusError{rec.status}
	case rec.streamed:
		return nil, idem.Permanent(fmt.Errorf("%w: over the limit of %d bytes", errNotStored, rec.limit))
	}
	return rec.stored(), nil
}

// stored returns the stored form of the buffered response: without the
// headers that are not stored (private).
func (rec *recorder) stored() []byte {
	resp := rec.response()
	for k := range resp.header {
		if rec.private[http.CanonicalHeaderKey(k)] {
			delete(resp.header, k)
		}
	}
	return resp.encode()
}
