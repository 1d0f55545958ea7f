package dbtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A killed server restarts on its port: empty without persistence, with
// every acknowledged write under AppendFsyncAlways.
func TestRedisKillRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []RedisOption
		want string // the value after the restart
	}{
		{"none", nil, ""},
		{"appendfsync-always", []RedisOption{AppendFsyncAlways()}, "v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := StartRedis(t, tc.opts...)
			if r == nil {
				return // skipped
			}
			c := r.Client(t)
			ctx := context.Background()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			addr := r.Addr()
			r.Kill()
			r.Kill() // a second Kill does nothing
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Fatal("the killed server still accepts connections")
			}
			r.Restart(t)
			r.Restart(t) // nor a second Restart
			if r.Addr() != addr {
				t.Fatalf("restarted on %s, want %s", r.Addr(), addr)
			}
			got, err := c.Get(ctx, "k").Result()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("after the restart k is %q, want %q", got, tc.want)
			}
		})
	}
}
