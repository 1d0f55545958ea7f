package faultconn_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultconn"
	"github.com/idem-go/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

// client returns a client of s whose connections obey in.
func client(t *testing.T, s *redistest.Server, in *faultconn.Injector, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	return s.Client(t, append([]func(*redis.Options){func(o *redis.Options) {
		o.Dialer = in.Dialer("")
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
	}}, opts...)...)
}

func noRetries(o *redis.Options) { o.MaxRetries = -1 }

// calls returns how many times the server ran cmd, from INFO commandstats.
func calls(t *testing.T, s *redistest.Server, cmd string) int {
	t.Helper()
	info := s.Do(t, "INFO", "commandstats").(string)
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+strings.ToLower(cmd)+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		if err != nil {
			t.Fatalf("bad commandstats line %q", line)
		}
		return n
	}
	return 0
}

func exists(t *testing.T, s *redistest.Server, key string) bool {
	t.Helper()
	return s.Do(t, "EXISTS", key) == int64(1)
}

func TestDropReply(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run("RESP"+strconv.Itoa(proto), func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, redistest.Config{})
			in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Action: faultconn.DropReply})
			c := client(t, s, in, noRetries, func(o *redis.Options) { o.Protocol = proto })

			err := c.Set(ctx, "k", "v", 0).Err()
			if !errors.Is(err, io.EOF) {
				t.Errorf("SET with its reply dropped: %v, want io.EOF", err)
			}
			if got := s.Do(t, "GET", "k"); got != "v" {
				t.Errorf("GET k = %v, want v: the SET should have run", got)
			}
			if got := in.Hits(); got != 1 {
				t.Errorf("Hits() = %d, want 1", got)
			}
			// Other commands, on a new connection, are untouched.
			if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
				t.Errorf("GET k through the client = %q, %v", got, err)
			}
		})
	}
}

func TestDropReplyIsRetried(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Nth: 1, Action: faultconn.DropReply})
	c := client(t, s, in)

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET with default retries: %v", err)
	}
	if got := calls(t, s, "SET"); got != 2 {
		t.Errorf("the server ran SET %d times, want 2: go-redis re-sends it", got)
	}
	if got := in.Hits(); got != 1 {
		t.Errorf("Hits() = %d, want 1", got)
	}
}

func TestDropReplyRunsIncrTwice(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("INCR"), Nth: 1, Action: faultconn.DropReply})
	c := client(t, s, in)
	got, err := c.Incr(ctx, "n").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Errorf("INCR after a lost reply and a retry = %d, want 2", got)
	}
}

func TestCloseBefore(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Action: faultconn.CloseBefore})
	c := client(t, s, in, noRetries)

	err := c.Set(ctx, "k", "v", 0).Err()
	if !errors.Is(err, io.EOF) {
		t.Errorf("SET cut off before it was sent: %v, want io.EOF", err)
	}
	if exists(t, s, "k") {
		t.Error("the key exists: the SET reached Redis")
	}
	if got := calls(t, s, "SET"); got != 0 {
		t.Errorf("the server ran SET %d times, want 0", got)
	}
}

func TestCloseBeforeIsRetried(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Nth: 1, Action: faultconn.CloseBefore})
	c := client(t, s, in)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := calls(t, s, "SET"); got != 1 {
		t.Errorf("the server ran SET %d times, want 1", got)
	}
}

func TestDelayReply(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	const delay = 200 * time.Millisecond
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("GET"), Action: faultconn.DelayReply, Delay: delay})
	c := client(t, s, in, noRetries)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := c.Get(ctx, "k").Result()
	elapsed := time.Since(start)
	if err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
	if elapsed < delay {
		t.Errorf("GET returned after %v, want at least %v", elapsed, delay)
	}
	start = time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= delay {
		t.Errorf("PING took %v: the delay applies to GET only", d)
	}
}

func TestDelayReplyPastReadTimeout(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SET"), Action: faultconn.DelayReply, Delay: 5 * time.Second})
	c := client(t, s, in, noRetries, func(o *redis.Options) { o.ReadTimeout = 100 * time.Millisecond })
	start := time.Now()
	err := c.Set(ctx, "k", "v", 0).Err()
	elapsed := time.Since(start)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("SET whose reply is held past the read timeout: %v, want a timeout", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("SET failed after %v: the hold ignored the read deadline", elapsed)
	}
	if !exists(t, s, "k") {
		t.Error("the key does not exist: the SET should have run")
	}
}

func TestDelayReplyEndsOnContextDeadline(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("GET"), Action: faultconn.DelayReply, Delay: 5 * time.Second})
	c := client(t, s, in, noRetries, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Get(cctx, "k").Err()
	if err == nil || errors.Is(err, redis.Nil) {
		t.Errorf("GET past its context deadline: %v, want an error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("GET returned after %v, want about 100ms", d)
	}
}

// TestPipelineFaults writes a pipeline through the wrapper by hand, since
// go-redis fails every command of a pipeline when one read fails.
func TestPipelineFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		action   faultconn.Action
		existing map[string]bool
	}{
		// Commands up to the dropped one run; later ones are not sent.
		{faultconn.DropReply, map[string]bool{"a": true, "b": true, "c": false}},
		// Commands before the cut run; it and later ones are not sent.
		{faultconn.CloseBefore, map[string]bool{"a": true, "b": false, "c": false}},
	} {
		t.Run(tc.action.String(), func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, redistest.Config{})
			in := faultconn.New(faultconn.Rule{
				Match:  func(cmd []string) bool { return cmd[0] == "SET" && cmd[1] == "b" },
				Action: tc.action,
			})
			conn, err := in.Dialer("")(ctx, "tcp", s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			var pipeline string
			for _, k := range []string{"a", "b", "c"} {
				pipeline += "*3\r\n$3\r\nSET\r\n$1\r\n" + k + "\r\n$1\r\n1\r\n"
			}
			if _, err := io.WriteString(conn, pipeline); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "+OK\r\n" {
				t.Errorf("the client read %q before io.EOF, want the reply to SET a alone", got)
			}
			for key, want := range tc.existing {
				if got := exists(t, s, key); got != want {
					t.Errorf("EXISTS %s = %v, want %v", key, got, want)
				}
			}
		})
	}
}

func TestPipelineDropReplyGoRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{
		Match:  faultconn.IsCommand("INCR"),
		Nth:    1,
		Action: faultconn.DropReply,
	})
	c := client(t, s, in)
	pipe := c.Pipeline()
	pipe.Set(ctx, "a", "1", 0)
	incr := pipe.Incr(ctx, "b")
	pipe.Set(ctx, "c", "1", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipeline with default retries: %v", err)
	}
	if got := calls(t, s, "SET"); got != 3 {
		t.Errorf("the server ran SET %d times, want 3: a twice (the pipeline is re-sent whole), c once", got)
	}
	if got := incr.Val(); got != 2 {
		t.Errorf("INCR b = %d, want 2: it ran before its reply was lost, and again", got)
	}
}

func TestNth(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("PING"), Nth: 2, Action: faultconn.CloseBefore})
	c := client(t, s, in, noRetries)
	for i, wantErr := range []bool{false, true, false, false} {
		err := c.Ping(ctx).Err()
		if (err != nil) != wantErr {
			t.Errorf("PING %d: %v, want error: %v", i+1, err, wantErr)
		}
	}
	if got := in.Hits(); got != 1 {
		t.Errorf("Hits() = %d, want 1", got)
	}
}

func TestFirstRuleTakesTheCommand(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(
		faultconn.Rule{Match: faultconn.IsCommand("PING"), Nth: 1, Action: faultconn.DelayReply},
		faultconn.Rule{Match: faultconn.IsCommand("PING"), Nth: 1, Action: faultconn.CloseBefore},
	)
	c := client(t, s, in, noRetries)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("first PING: %v; the first rule should take it", err)
	}
	if err := c.Ping(ctx).Err(); !errors.Is(err, io.EOF) {
		t.Errorf("second PING: %v; the second rule should see it as its first", err)
	}
	if got := in.Hits(); got != 2 {
		t.Errorf("Hits() = %d, want 2", got)
	}
}

func TestAddAndReset(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New()
	c := client(t, s, in, noRetries)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	in.Add(faultconn.Rule{Match: faultconn.IsCommand("PING"), Action: faultconn.CloseBefore})
	// The rule applies to the connection that is already open.
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("PING after Add succeeded")
	}
	in.Reset()
	if got := in.Hits(); got != 0 {
		t.Errorf("Hits() after Reset = %d, want 0", got)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Reset: %v", err)
	}
}

func TestScriptRetryRunsScriptTwice(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	script := redis.NewScript(`return redis.call("INCR", KEYS[1])`)
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsScript(script.Hash()), Nth: 1, Action: faultconn.DropReply})
	c := client(t, s, in)
	// Loaded, so that the first EVALSHA runs (a NOSCRIPT reply would count
	// as the rule's first match too).
	if err := script.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := script.Run(ctx, c, []string{"n"}).Int()
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Errorf("script result = %d, want 2: the script ran again after its reply was lost", got)
	}
	if in.Hits() != 1 {
		t.Errorf("Hits() = %d, want 1", in.Hits())
	}
}

func TestDialerAddress(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New()
	// Options.Addr points nowhere; the Dialer's address wins.
	c := s.Client(t, func(o *redis.Options) {
		o.Addr = "127.0.0.1:1"
		o.Dialer = in.Dialer(s.Addr())
	})
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING through Dialer(%s): %v", s.Addr(), err)
	}
}

func TestSubscribeDropReply(t *testing.T) {
	t.Parallel()
	for _, proto := range []int{2, 3} {
		t.Run("RESP"+strconv.Itoa(proto), func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, redistest.Config{})
			in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("SUBSCRIBE"), Nth: 1, Action: faultconn.DropReply})
			c := client(t, s, in, func(o *redis.Options) { o.Protocol = proto })
			sub := c.Subscribe(ctx, "ch")
			defer sub.Close()
			if _, err := sub.ReceiveTimeout(ctx, 2*time.Second); !errors.Is(err, io.EOF) {
				t.Errorf("first receive: %v, want io.EOF", err)
			}
			// The PubSub reconnects and subscribes again.
			msg, err := sub.ReceiveTimeout(ctx, 2*time.Second)
			if err != nil {
				t.Fatalf("second receive: %v", err)
			}
			if sc, ok := msg.(*redis.Subscription); !ok || sc.Channel != "ch" {
				t.Fatalf("second receive = %#v, want the subscription to ch", msg)
			}
			if err := s.Do(t, "PUBLISH", "ch", "hi"); err != int64(1) {
				t.Fatalf("PUBLISH reached %v subscribers, want 1", err)
			}
			msg, err = sub.ReceiveTimeout(ctx, 2*time.Second)
			if m, ok := msg.(*redis.Message); err != nil || !ok || m.Payload != "hi" {
				t.Errorf("third receive = %#v, %v; want the message", msg, err)
			}
		})
	}
}

func TestBigReplyStreams(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("PING"), Action: faultconn.DelayReply, Delay: time.Millisecond})
	c := client(t, s, in, noRetries)
	big := strings.Repeat("x", 5<<20)
	if err := c.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	get := pipe.Get(ctx, "big")
	pipe.Ping(ctx)
	get2 := pipe.Get(ctx, "big")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if get.Val() != big || get2.Val() != big {
		t.Errorf("GET big returned %d and %d bytes, want %d", len(get.Val()), len(get2.Val()), len(big))
	}
}

func TestPoolDropsConnectionsClosedByServer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Config{})
	in := faultconn.New()
	c := client(t, s, in, noRetries)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n := s.Do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); n != int64(1) {
		t.Fatalf("CLIENT KILL closed %v connections, want 1", n)
	}
	time.Sleep(50 * time.Millisecond)
	// As with a plain TCP connection, go-redis's health check sees that the
	// pooled connection was closed and dials a new one.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after the server closed the pooled connection: %v", err)
	}
}

func TestClusterClient(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	in := faultconn.New(faultconn.Rule{Match: faultconn.IsCommand("INCR"), Nth: 1, Action: faultconn.DropReply})
	cc := c.Client(t, func(o *redis.ClusterOptions) {
		o.Dialer = in.Dialer("") // each node at the address the client asks for
		o.MinRetryBackoff = time.Millisecond
		o.MaxRetryBackoff = 2 * time.Millisecond
	})
	got, err := cc.Incr(ctx, "{slot}n").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != 2 {
		t.Errorf("INCR through a cluster client after a lost reply = %d, want 2: it ran again", got)
	}
	if in.Hits() != 1 {
		t.Errorf("Hits() = %d, want 1", in.Hits())
	}
}
