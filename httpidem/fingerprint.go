package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/idem-go/idem"
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
//     application/*+json), its canonical form (idem.FingerprintJSON, RFC
//     8785), so that the order of members and whitespace do not count; for
//     any other media type, or JSON that does not parse, the bytes as sent.
//
// Headers other than Content-Type, the host and the scheme are not part of
// it; wrap DefaultFingerprint to add what else tells your requests apart.
// Its values are stable across releases: records stored by one release are
// matched by the next. It never returns an error.
func DefaultFingerprint(r *http.Request, body []byte) (string, error) {
	h := sha256.New()
	field(h, "httpidem/v1")
	field(h, r.Method)
	field(h, r.URL.EscapedPath())
	field(h, canonicalQuery(r.URL.RawQuery))
	mt, isJSON := mediaType(r.Header.Get("Content-Type"))
	field(h, mt)
	if isJSON {
		if fp, err := idem.FingerprintJSON(body); err == nil {
			field(h, "json")
			field(h, fp)
			return digest(h), nil
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
