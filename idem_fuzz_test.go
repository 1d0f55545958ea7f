package idem

// FuzzKey: the mapping of keys to Redis keys and their hash tags.

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// FuzzKey checks the mapping of keys to Redis keys: different keys get
// different records, and a record and its channel share one non-empty hash
// tag (the part Redis Cluster hashes), whatever bytes the key holds, so
// they are always in one slot.
func FuzzKey(f *testing.F) {
	for _, s := range [][3]string{
		{"idem", "a", "b"},
		{"idem", "order-1", "order-1"},
		{"idem", "}", `\c`},
		{"idem", `\`, `\\`},
		{"idem", "{x}", "x"},
		{"idem", "a}b", `a\cb`},
		{"p", "\x00\xff", "\x00"},
		{"svc:v2", "{", "}{"},
		{"idem", "", "a"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	// checkCall needs a Redis client, not a connection: none is made.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	f.Cleanup(func() { _ = rdb.Close() })
	f.Fuzz(func(t *testing.T, prefix, a, b string) {
		var cfg config
		WithPrefix(prefix)(&cfg)
		if len(cfg.problems) > 0 {
			return // New refuses the prefix
		}
		c := &Client{rdb: rdb, cfg: defaultConfig()}
		c.cfg.prefix = prefix
		ra, rb := RecordKey(c, a), RecordKey(c, b)
		if (ra == rb) != (a == b) {
			t.Fatalf("prefix %q: recordKey(%q) = %q, recordKey(%q) = %q", prefix, a, ra, b, rb)
		}
		for _, key := range []string{a, b} {
			if key == "" {
				if err := c.checkCall(context.Background(), key); !errors.Is(err, ErrInvalidKey) {
					t.Fatalf("the empty key: %v, want ErrInvalidKey", err)
				}
				continue
			}
			rk := RecordKey(c, key)
			tag, ok := clusterHashTag(rk)
			if !ok {
				t.Fatalf("prefix %q, key %q: record key %q has no non-empty hash tag", prefix, key, rk)
			}
			ch := ChannelKey(c, key)
			if ctag, ok := clusterHashTag(ch); !ok || ctag != tag {
				t.Fatalf("prefix %q, key %q: record %q has tag %q, channel %q has %q", prefix, key, rk, tag, ch, ctag)
			}
			if !strings.HasPrefix(rk, prefix+":") {
				t.Fatalf("prefix %q, key %q: record key %q does not start with the prefix", prefix, key, rk)
			}
		}
	})
}

// clusterHashTag returns what Redis Cluster hashes of key when it has a
// hash tag: the bytes between the first '{' and the first '}' after it,
// if there are any.
func clusterHashTag(key string) (string, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}
