package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/idemtest"
	"github.com/redis/go-redis/v9"
)

// TestLogsNeverNameTheKey: keys may be personal data. Every log line (the
// Client's logger, LogObserver) and every event's error carries the key's
// digest, never the key, unless WithRawEventKeys(true) asked for it;
// errors returned to the caller still name it. Provoked: a conflict
// (DEBUG), a wait that runs out (WARN), Redis unreachable (WARN), a
// release and renewals that fail, an outcome not recorded (ERROR).
func TestLogsNeverNameTheKey(t *testing.T) {
	t.Parallel()
	const key = "secret-order-77"
	for _, raw := range []bool{false, true} {
		var buf syncBuffer
		l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		r := &recorder{}
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
		opts := []idem.Option{idem.WithLogger(l), idem.WithObserver(idem.LogObserver(l)), idem.WithObserver(r),
			idem.WithEventKeySecret(testSecret), idem.WithRawEventKeys(raw), idem.WithWait(200 * time.Millisecond),
			idem.WithLease(time.Second), idem.WithStoreTimeout(time.Second)}
		c := idem.New(rdb, opts...)
		ctx := context.Background()
		ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
		var returned []error

		// A conflict (DEBUG), and a wait that runs out (WARN).
		if _, err := c.Do(ctx, key, "a", ok); err != nil {
			t.Fatal(err)
		}
		_, err := c.Do(ctx, key, "b", ok)
		returned = append(returned, err)
		if err := rdb.Set(ctx, idem.RecordKey(c, key+"-busy"), idemtest.InProgress("other-owner", 1, 24*time.Hour, time.Hour), 24*time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = c.Do(ctx, key+"-busy", "", ok)
		returned = append(returned, err)
		if !errors.Is(returned[0], idem.ErrConflict) || !errors.Is(returned[1], idem.ErrInProgress) {
			t.Fatalf("got %v and %v; want a conflict and a wait run out", returned[0], returned[1])
		}

		// Redis goes away inside fn: renewals fail until the lease ends,
		// the outcome is not recorded, the release fails.
		_, err = c.Do(ctx, key+"-cut", "", func(ctx context.Context) ([]byte, error) {
			mr.Close()
			<-ctx.Done()
			return nil, errors.New("gave up")
		})
		returned = append(returned, err)
		_, err = c.Do(ctx, key+"-down", "", ok)
		returned = append(returned, err)
		_ = c.Close()
		_ = rdb.Close()

		for _, err := range []error{returned[0], returned[1], returned[3]} {
			if err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("raw=%v: Do returned %v; want an error that names the key", raw, err)
			}
		}
		named := 0
		for _, e := range r.take() {
			if e.Err != nil && strings.Contains(e.Err.Error(), key) {
				named++
				if !raw {
					t.Errorf("%s event's error %q names the key", e.Kind, e.Err)
				}
			}
		}
		if raw && named == 0 {
			t.Errorf("raw=true: no event's error names the key")
		}
		logged := buf.String()
		for _, want := range []string{"conflict", "in progress", "lease renewal failed", "could not release", "level=ERROR", "key_digest="} {
			if !strings.Contains(logged, want) {
				t.Errorf("raw=%v: the log lacks %q:\n%s", raw, want, logged)
			}
		}
		if n := strings.Count(logged, key); (n > 0) != raw {
			t.Errorf("raw=%v: the log names the key %d times:\n%s", raw, n, logged)
		}
	}
}
