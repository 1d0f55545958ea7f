package bench

// The five sides that BenchmarkFloors compares: the raw floor of a new key
// (two EVALSHA: claim, complete) through go-redis, valkey-go and rueidis,
// and through idem's own pipelines on go-redis, and idem's Do through
// go-redis. Each client is built with its defaults, given only the
// server's address.

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pipeline"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"
)

// The raw floor's scripts, as the root module's bench_test.go has them
// (rawClaim, rawComplete; TestScriptsMatchRoot holds them equal): as little
// as each step of a new key must do.
const (
	// rawClaimSrc takes a key if nobody has: a small hash and its TTL.
	rawClaimSrc = `
if redis.call('HSETNX', KEYS[1], 'own', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'st', 'p')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`
	// rawCompleteSrc stores a result and wakes whoever listens.
	rawCompleteSrc = `
redis.call('HSET', KEYS[1], 'st', 'd', 'res', ARGV[1])
redis.call('PUBLISH', KEYS[2], 'd')
return 1`
)

const (
	benchFingerprint = "account=42&amount=100"
	benchRetention   = 24 * time.Hour     // idem's default, for the raw TTL too
	rawToken         = "0123456789abcdef" // as long as idem's owner token
	payloadSize      = 100
)

// retentionMs is the raw claim's TTL argument, as text for the clients
// that take strings.
var retentionMs = strconv.FormatInt(benchRetention.Milliseconds(), 10)

// benchRuns makes the keys of every run unique.
var benchRuns atomic.Int64

// rawKey is the raw floor's record key, built as idem builds its own.
func rawKey(key string) string { return "raw:{" + key + "}" }

// idemKey is the key of idem's record of key, with the default prefix, for
// keys without '\' or '}' (idem escapes those; the benchmark's keys have
// none). TestIdemSide checks it against what Do writes.
func idemKey(key string) string { return "idem:{" + key + "}" }

// floor is one client's raw new key: claim returns 1 if it took the record
// rk (0 if someone holds it), complete stores the result.
type floor struct {
	name     string
	claim    func(ctx context.Context, rk, token string) (int64, error)
	complete func(ctx context.Context, rk string) error
}

// newKey is the raw floor of a new key: a claim that must win, then the
// completion.
func (f *floor) newKey(ctx context.Context, key string) error {
	rk := rawKey(key)
	won, err := f.claim(ctx, rk, rawToken)
	if err != nil {
		return err
	}
	if won != 1 {
		return fmt.Errorf("bench: %s claim of %q: not won", f.name, key)
	}
	return f.complete(ctx, rk)
}

// newGoRedis returns a go-redis client with default options, closed when tb
// ends.
func newGoRedis(tb testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// goRedisFloor runs the scripts through rdb: Script.Run, EVALSHA (EVAL
// only when the server lacks the script).
func goRedisFloor(rdb *redis.Client, p []byte) *floor {
	claim, complete := redis.NewScript(rawClaimSrc), redis.NewScript(rawCompleteSrc)
	return &floor{
		name: "goredis",
		claim: func(ctx context.Context, rk, token string) (int64, error) {
			return claim.Run(ctx, rdb, []string{rk}, token, benchRetention.Milliseconds()).Int64()
		},
		complete: func(ctx context.Context, rk string) error {
			return complete.Run(ctx, rdb, []string{rk, rk + ":done"}, p).Err()
		},
	}
}

// pipelinedFloor runs the scripts through rdb as idem's Do sends its own:
// through internal/pipeline's Runner, with idem's default of 4 pipelines
// (WithPipelines), so that concurrent calls share pipelines and a lone
// call goes alone. Its senders are waited for when tb ends. Beside idem,
// it tells what idem's own work costs on the same transport; beside
// valkey-go, what the transport does.
func pipelinedFloor(tb testing.TB, rdb *redis.Client, p []byte) *floor {
	var work pipeline.Work
	tb.Cleanup(work.Wait)
	r := pipeline.NewRunner(rdb, idemPipelines, &work)
	claim, complete := pipeline.NewScript(rawClaimSrc), pipeline.NewScript(rawCompleteSrc)
	return &floor{
		name: "pipelined",
		claim: func(ctx context.Context, rk, token string) (int64, error) {
			return r.Run(ctx, claim, []string{rk}, token, benchRetention.Milliseconds()).Int64()
		},
		complete: func(ctx context.Context, rk string) error {
			return r.Run(ctx, complete, []string{rk, rk + ":done"}, p).Err()
		},
	}
}

// idemPipelines is idem's default of WithPipelines (options.go,
// defaultPipelines), as TestPipelinedFloorAsIdem checks.
const idemPipelines = 4

// valkeyFloor runs the scripts through a valkey-go client with default
// options but the address (auto-pipelining: concurrent calls share its
// connections), closed when tb ends: Lua.Exec, EVALSHA (EVAL only when the
// server lacks the script).
func valkeyFloor(tb testing.TB, addr string, p []byte) *floor {
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		tb.Fatalf("bench: valkey-go client: %v", err)
	}
	tb.Cleanup(c.Close)
	claim, complete := valkey.NewLuaScript(rawClaimSrc), valkey.NewLuaScript(rawCompleteSrc)
	res := string(p) // once: the client takes strings
	return &floor{
		name: "valkey",
		claim: func(ctx context.Context, rk, token string) (int64, error) {
			return claim.Exec(ctx, c, []string{rk}, []string{token, retentionMs}).AsInt64()
		},
		complete: func(ctx context.Context, rk string) error {
			return complete.Exec(ctx, c, []string{rk, rk + ":done"}, []string{res}).Error()
		},
	}
}

// rueidisFloor is valkeyFloor with rueidis.
func rueidisFloor(tb testing.TB, addr string, p []byte) *floor {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		tb.Fatalf("bench: rueidis client: %v", err)
	}
	tb.Cleanup(c.Close)
	claim, complete := rueidis.NewLuaScript(rawClaimSrc), rueidis.NewLuaScript(rawCompleteSrc)
	res := string(p)
	return &floor{
		name: "rueidis",
		claim: func(ctx context.Context, rk, token string) (int64, error) {
			return claim.Exec(ctx, c, []string{rk}, []string{token, retentionMs}).AsInt64()
		},
		complete: func(ctx context.Context, rk string) error {
			return complete.Exec(ctx, c, []string{rk, rk + ":done"}, []string{res}).Error()
		},
	}
}

// newIdem returns idem's Client on rdb, with default options, closed when
// tb ends.
func newIdem(tb testing.TB, rdb *redis.Client) *idem.Client {
	c := idem.New(rdb)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// side is one of the compared: a new key, and the Redis key of its record.
type side struct {
	name   string
	call   func(ctx context.Context, key string) error
	record func(key string) string
}

// The sides, in the order of BenchmarkFloors' figures.
const (
	goredisSide = iota
	valkeySide
	rueidisSide
	pipelinedSide
	idemSide
	nSides
)

// newSides returns the five sides on the server at addr, with result p.
// idem and the pipelined floor share the go-redis floor's client, as the
// root's pairedNewKeys shares one client between idem and the raw floor:
// the phases never run two sides at once.
func newSides(tb testing.TB, addr string, p []byte) [nSides]side {
	rdb := newGoRedis(tb, addr)
	c := newIdem(tb, rdb)
	fn := func(context.Context) ([]byte, error) { return p, nil }
	var sides [nSides]side
	for i, f := range []*floor{goRedisFloor(rdb, p), valkeyFloor(tb, addr, p), rueidisFloor(tb, addr, p), pipelinedFloor(tb, rdb, p)} {
		sides[i] = side{name: f.name, call: f.newKey, record: rawKey}
	}
	sides[idemSide] = side{
		name: "idem",
		call: func(ctx context.Context, key string) error {
			res, err := c.Do(ctx, key, benchFingerprint, fn)
			if err == nil && len(res) != len(p) {
				err = fmt.Errorf("bench: idem returned %d bytes, want %d", len(res), len(p))
			}
			return err
		},
		record: idemKey,
	}
	return sides
}
