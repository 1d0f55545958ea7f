// logkeys.go: keys in logs. Keys may be personal data: what the Client
// logs, and what its events carry, names a key by its digest unless
// WithRawEventKeys(true) asked for the key itself.

package idem

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
)

// LogAttrs returns the attributes that name a call of Do with key, and its
// error err, in a log record: key_digest, the key's digest as in Event.Key;
// and, when err is not nil, error: err with the key in its message (quoted,
// as idem's errors quote it, or as it is when 8 bytes or longer) replaced
// by the digest. With WithRawEventKeys(true) they are key_digest, key (the
// key itself) and error as it is. The Client's own log records and
// LogObserver's name keys this way; so does middleware built on the Client
// (httpidem), for its own records.
func (c *Client) LogAttrs(key string, err error) []slog.Attr {
	digest := c.eventKey(key)
	attrs := make([]slog.Attr, 0, 3)
	attrs = append(attrs, slog.String("key_digest", digest))
	if c.cfg.rawEventKeys {
		attrs = append(attrs, slog.String("key", key))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", c.redact(key, digest, err)))
	}
	return attrs
}

// warnKey logs a warning about key, and err.
func (c *Client) warnKey(ctx context.Context, msg, key string, err error) {
	c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, msg, c.LogAttrs(key, err)...)
}

// redact returns err with key in its message replaced by its digest: the
// quoted key wherever it is, the key as it is when 8 bytes or longer
// (shorter ones would match ordinary words). The result wraps err, so
// errors.Is and errors.As see what err is. With raw keys, err as it is.
func (c *Client) redact(key, digest string, err error) error {
	if err == nil || c.cfg.rawEventKeys || key == "" {
		return err
	}
	msg := err.Error()
	if !strings.Contains(msg, key) {
		return err
	}
	// idem's errors say `key "k"`: that becomes `key with digest d`.
	msg = strings.ReplaceAll(msg, strconv.Quote(key), "with digest "+digest)
	if len(key) >= 8 {
		msg = strings.ReplaceAll(msg, key, "(key with digest "+digest+")")
	}
	return &redactedError{msg: msg, err: err}
}

// redactedError is an error whose message names a key by its digest.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
