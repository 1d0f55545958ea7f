package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/idem-go/idem/internal/jcs"
)

// DefaultFingerprint is the fingerprint of a request unless WithFingerprint
// sets another: a digest of, in order,
//
//   - the method;
//   - the path as the client escaped it (r.URL.EscapedPath);
//   - the query, its parameters sorted by name (the values of one name
//     keep their order), or as sent if it does not parse;
//   - the Content-Type's media type, lowercased, with its parameters
//     sorted (as sent if it does not parse); a JSON media type without
//     its parameters (JSON has none: a charset changes nothing);
//   - the body: for a JSON media type (application/json or any
//     application/*+json), its canonical form (RFC 8785), so that the
//     order of members and whitespace do not count; for any other media
//     type, or JSON that does not parse, the bytes as sent.
//
// JSON numbers are compared by their exact decimal value, not as RFC
// 8785's doubles: 100, 100.0 and 1e2 are one amount, but 9007199254740993
// and 9007199254740992 (which differ beyond 2^53) are two, and a key
// reused with the other gets 422. A number that is the shortest decimal of
// its double (nearly every number people write) has the fingerprint it had
// with doubles. JSON nested deeper than 10000 levels is an error (400).
//
// Headers other than Content-Type, the host and the scheme are not part of
// it; wrap DefaultFingerprint to add what else tells your requests apart.
// Its values are stable across releases: records stored by one release are
// matched by the next. Its cost is linear in the body's size.
func DefaultFingerprint(r *http.Request, body []byte) (string, error) {
	h := sha256.New()
	field(h, "httpidem/v1")
	field(h, r.Method)
	field(h, r.URL.EscapedPath())
	field(h, canonicalQuery(r.URL.RawQuery))
	mt, isJSON := mediaType(r.Header.Get("Content-Type"))
	field(h, mt)
	if isJSON {
		c, err := jcs.CanonicalExact(body)
		switch {
		case err == nil:
			field(h, "json")
			field(h, jcs.Digest(c))
			return digest(h), nil
		case errors.Is(err, jcs.ErrTooDeep):
			return "", fmt.Errorf("the JSON body is nested deeper than %d levels", jcs.MaxDepth)
		}
	}
	field(h, "raw")
	field(h, body)
	return digest(h), nil
}

// digest returns the first 16 bytes of h's sum in hexadecimal, as idem's
// fingerprints are written.
func digest(h hash.Hash) string {
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// field writes s to h after its length, so that no two lists of fields
// write the same bytes.
func field[S string | []byte](h hash.Hash, s S) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s)) // no copy for []byte; a small one for the short strings
}

// canonicalQuery returns the query with its parameters sorted by name, or
// the query as it is if it does not parse.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	return v.Encode()
}

// mediaType returns the media type of a Content-Type in a canonical form,
// and whether it is JSON.
func mediaType(ct string) (string, bool) {
	if ct == "" {
		return "", false
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return ct, false
	}
	if mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		// JSON is UTF-8 and has no parameters (RFC 8259, section 11): a
		// charset changes nothing.
		return mt, true
	}
	return mime.FormatMediaType(mt, params), false
}
