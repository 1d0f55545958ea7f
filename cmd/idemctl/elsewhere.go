package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// elsewhere is a record that a KEY with no record may have been meant for:
// the same key under another prefix (idem.WithPrefix), or an HTTP
// request's key, which httpidem stores under its principal's scope.
type elsewhere struct {
	Record string  `json:"record"`
	Prefix string  `json:"prefix"`
	Scope  *string `json:"scope,omitempty"` // the httpidem principal, for a request's record
	Use    string  `json:"use"`             // the idemctl command line that reads it
}

// maxElsewhereScan is how many keys findElsewhere asks SCAN to visit on
// each server, at most: a keyspace larger than that is searched in part.
const maxElsewhereScan = 1_000_000

// findElsewhere looks for records of arg, the KEY argument of cmd, other
// than the one o names: under another prefix, or under an httpidem scope
// (or none). It scans each server's keyspace (SCAN MATCH), up to
// maxElsewhereScan keys; partial says it stopped there.
func findElsewhere(ctx context.Context, o options, rdb redis.UniversalClient, cmd, arg string) (found []elsewhere, partial bool, err error) {
	match := "*:{*" + globEscape(tagEscaper.Replace(arg)) + "}"
	var mu sync.Mutex
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for visited := int64(0); ; visited += 1000 {
			if visited >= maxElsewhereScan {
				mu.Lock()
				partial = true
				mu.Unlock()
				return nil
			}
			keys, next, err := node.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return fmt.Errorf("%s: %w", node.Options().Addr, err)
			}
			for _, k := range keys {
				if e, ok := classify(o, cmd, arg, k); ok {
					mu.Lock()
					found = append(found, e)
					mu.Unlock()
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	}
	return found, partial, err
}

// classify tells whether k, a Redis key, is a record of arg other than
// the one o names, and how to read it.
func classify(o options, cmd, arg, k string) (elsewhere, bool) {
	prefix, rest, ok := strings.Cut(k, ":{")
	if !ok || prefix == "" || strings.ContainsAny(prefix, "{}") || !strings.HasSuffix(rest, "}") {
		return elsewhere{}, false
	}
	inner, ok := unescapeTag(rest[:len(rest)-1])
	if !ok {
		return elsewhere{}, false
	}
	e := elsewhere{Record: k, Prefix: prefix}
	if inner != arg {
		scope, ok := splitScope(inner, arg)
		if !ok {
			return elsewhere{}, false // another key that ends with arg
		}
		e.Scope = &scope
	}
	if prefix == o.prefix && ((e.Scope == nil && o.scope == nil) || (e.Scope != nil && o.scope != nil && *e.Scope == *o.scope)) {
		return elsewhere{}, false // the record looked for: gone since
	}
	use := []string{"idemctl", cmd, shellQuote(arg)}
	if e.Scope != nil {
		use = append(use, "-scope", shellQuote(*e.Scope))
	}
	if prefix != o.prefix {
		use = append(use, "-prefix", shellQuote(prefix))
	}
	if cmd == "forget" {
		use = append(use, "-yes")
	}
	e.Use = strings.Join(use, " ")
	return e, true
}

// splitScope reports whether inner is httpidem's key for arg under some
// scope (httpidem.ScopedKey), and returns the scope.
func splitScope(inner, arg string) (string, bool) {
	n, rest, ok := strings.Cut(inner, ":")
	if !ok || n == "" || (len(n) > 1 && n[0] == '0') {
		return "", false
	}
	size, err := strconv.Atoi(n)
	if err != nil || size < 0 || size > len(rest) || rest[size:] != arg {
		return "", false
	}
	return rest[:size], true
}

// unescapeTag undoes tagEscaper.
func unescapeTag(s string) (string, bool) {
	if !strings.Contains(s, `\`) {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i++; i == len(s) {
			return "", false
		}
		switch s[i] {
		case '\\':
			b.WriteByte('\\')
		case 'c':
			b.WriteByte('}')
		default:
			return "", false
		}
	}
	return b.String(), true
}

// shellQuote quotes s for a POSIX shell, when it needs quoting.
func shellQuote(s string) string {
	if s != "" && shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// reportElsewhere prints the records of arg found elsewhere and returns
// the error that makes idemctl exit 1, or nil when there are none.
func reportElsewhere(out *printer, arg string, found []elsewhere, partial bool) error {
	if len(found) == 0 {
		return nil
	}
	out.printf("\nbut %d record(s) of %q exist under another scope or prefix:\n", len(found), arg)
	for _, e := range found {
		what := "prefix " + strconv.Quote(e.Prefix)
		if e.Scope != nil {
			what = "httpidem scope " + strconv.Quote(*e.Scope) + ", " + what
		}
		out.printf("  %s (%s): %s\n", e.Record, what, e.Use)
	}
	if partial {
		out.printf("  (searched the first %d keys of each server only)\n", maxElsewhereScan)
	}
	return fmt.Errorf("no record of %q here, but %d under another scope or prefix: an HTTP request's key is stored under its principal's scope (-scope PRINCIPAL; -scope '' without httpidem.WithScope)", arg, len(found))
}
