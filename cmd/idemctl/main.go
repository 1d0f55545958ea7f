// Command idemctl lets an operator see and mend the idempotency records
// that github.com/idem-go/idem keeps in Redis.
//
//	idemctl status KEY [flags]   the state of one key's record, and its ledger row (-ledger)
//	idemctl forget KEY -yes      delete one key's record and tombstone; say what the next call does
//	idemctl stats [flags]        every record under the prefix: states, attempts, sizes, TTLs
//	idemctl pending [flags]      the unfinished and parked registered operations (idem.Register)
//	idemctl retry KEY -yes       un-park KEY's operation, parked after its recoveries: it runs again
//	idemctl check [flags]        whether Redis can keep idem's promises (idem's Client.Check)
//
// Flags go before or after the command and its key; -- ends them, for a
// key that starts with '-'. With -ledger DSN (postgres://…, mysql://…,
// sqlite:PATH),
// status and forget also read the key's row in the service's ledger
// (idemsql's table): whether it holds the key's outcome, and since when;
// without it they say that they did not look. It talks to the Redis at -redis, an address
// (host:port) or a redis:// or rediss:// URL; with -cluster, to a Redis
// Cluster through any of its nodes (a comma-separated list of addresses,
// or a URL). -scope PRINCIPAL names the key of an HTTP request that
// httpidem stored for that principal (httpidem.ScopedKey). Output is for
// people; -json prints one JSON object instead, for scripts.
//
// Exit status: 0 when the command did its job (status found the record in
// whatever state, or none; check found no problem); 1 when it failed (Redis
// unreachable or failing, a record it cannot read, problems found by
// check, or a key with no record while records of it exist under another
// scope or prefix: the output names them); 2 for bad usage (an unknown
// command or flag, a missing or extra argument, a malformed -redis, forget
// without -yes). README.md beside this file shows it at work.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/httpidem"
	"github.com/redis/go-redis/v9"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

const usageText = `Usage: idemctl COMMAND [KEY] [flags]

idemctl shows an operator what idem (github.com/idem-go/idem) keeps in
Redis, and mends it: the state of one key's record (its attempt, when its
lease ends, when it expires), an overview of every record under the
prefix (how many are done, failed, in progress, released, parked; how
many were retried; their sizes and TTLs; the biggest), whether Redis is
set up to keep idem's promises, and, as a last resort, deleting one key's
record.

Commands:
  status KEY   the state of KEY's record; an in-progress record whose lease
               ended belongs to an owner that is gone: the next call takes over;
               a tombstone left after the retention (idem.WithTombstones);
               with -ledger, whether the ledger holds KEY's outcome and since
               when; with no record, records of KEY under another httpidem
               scope or prefix are named (exit 1)
  forget KEY   delete KEY's record, its steps' checkpoints and its tombstone
               (needs -yes), and say what the next call with KEY does: run its
               operation again as attempt 1, or, when the ledger (-ledger)
               holds its outcome, get that outcome (idemctl never writes to
               the ledger)
  resolve KEY  settle the parked checked step (idem.StepChecked) named by -step
               of KEY's operation, after asking the provider what happened:
               -not-applied (the effect did not happen: the next call runs the
               step's act again) or -value JSON (it happened, with this value:
               the next call resumes with it, without acting); needs -yes
  stats        scan every record under the prefix (SCAN, read-only): records
               by state, attempts above 1, value bytes (STRLEN), memory
               (MEMORY USAGE, sampled in large keyspaces), TTLs, the biggest
               records; the ages of finished records (-retention), and with
               idem.WithTombstones, the tombstones and the late retries they
               refused, by day; a progress line on a terminal
  pending      list the registered operations (idem.Register) that are
               unfinished or parked, from idem's index of them (no SCAN): each
               one's key (by its digest; -raw: the key), operation name, state,
               attempt, recoveries, age since its last claim (-retention), lease
               end, steps done, and when a Recover loop takes it over; the key
               digests match the services' logs with IDEMCTL_KEY_SECRET set to
               their idem.WithEventKeySecret
  retry KEY    un-park KEY's registered operation, parked after its recoveries
               (idem.WithMaxRecoveries) did not finish it (idem's Client.Retry):
               the next Recover sweep where it is registered, or the next call
               with KEY, runs it again; needs -yes
  check        check that Redis can keep idem's promises (idem's Client.Check):
               problems, each with what to change, and notes on persistence
               and replication

Flags go before or after the command and its key (idemctl forget KEY -yes);
-- ends them, for a key that starts with '-'. An HTTP request's record is
stored under its principal's scope (httpidem.ScopedKey): name the principal
with -scope (-scope '' without httpidem.WithScope).

Exit status: 0 done (check: no problems); 1 failed (Redis unreachable or
failing, a record that cannot be read, problems found by check, no record
of KEY while records of it exist under another scope or prefix); 2 bad
usage (unknown command or flag, missing or extra argument, malformed
-redis or -ledger, forget or resolve without -yes).

Flags:
`

type options struct {
	redis   string
	cluster bool
	prefix  string
	scope   *string // -scope: the key is an HTTP request's of this principal; nil without
	json    bool
	raw     bool // pending: print keys, not their digests
	limit   int  // pending: list at most this many
	yes     bool
	timeout time.Duration
	// step, notApplied and value are resolve's: the parked step's name,
	// and what happened (-not-applied, or -value, JSON).
	step       string
	notApplied bool
	value      string
	// ledger is -ledger, the DSN of the service's ledger ("": not looked
	// at); ledgerTable its table (idemsql.WithTable).
	ledger, ledgerTable string
	top                 int
	sample              int
	batch               int
	// retention is the Client's (idem.WithRetention), for stats' record
	// ages; 0: infer it.
	retention time.Duration
}

// quietLogger silences go-redis's own log (failed dials, retries): idemctl
// reports the errors that matter itself.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func main() {
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// run runs idemctl with args and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.redis, "redis", "localhost:6379", "Redis `address` (host:port) or URL (redis://[user:password@]host:port[/db], rediss:// for TLS); with -cluster, addresses separated by commas")
	fs.BoolVar(&o.cluster, "cluster", false, "talk to a Redis Cluster: stats and check visit every master")
	fs.StringVar(&o.prefix, "prefix", "idem", "the `prefix` of idem's records (idem.WithPrefix)")
	scope := fs.String("scope", "", "status, forget, resolve, retry: KEY is an HTTP Idempotency-Key that httpidem stored for this `principal` (what WithScope returned; '' without WithScope)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
	fs.BoolVar(&o.raw, "raw", false, "pending: print the keys themselves, not their digests")
	fs.IntVar(&o.limit, "limit", 10000, "pending: list at most this many operations")
	fs.BoolVar(&o.yes, "yes", false, "confirm forget, resolve and retry")
	fs.StringVar(&o.step, "step", "", "resolve: the `name` of the parked step")
	fs.BoolVar(&o.notApplied, "not-applied", false, "resolve: the step's effect did not happen (the next call acts again)")
	fs.StringVar(&o.value, "value", "", "resolve: the step's effect happened, with this `JSON` value: a string (\"ch_123\"), number or boolean, of the step's type")
	fs.StringVar(&o.ledger, "ledger", "", "status, forget: the `DSN` of the service's ledger (idemsql), read-only: postgres://user:password@host:port/db, mysql://user:password@host:port/db or sqlite:PATH; without it the ledger is not looked at")
	fs.StringVar(&o.ledgerTable, "ledger-table", "idem_ledger", "status, forget: the ledger's `table` (idemsql.WithTable)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up every command but stats after this `duration` (stats runs until done or interrupted)")
	fs.IntVar(&o.top, "top", 10, "stats: how many of the biggest records to list")
	fs.IntVar(&o.sample, "sample", 10000, "stats: about how many records to measure with MEMORY USAGE")
	fs.IntVar(&o.batch, "batch", 1000, "stats: keys asked of SCAN at a time (its COUNT), and read in one pipeline")
	fs.DurationVar(&o.retention, "retention", 0, "stats, pending: the Clients' retention (idem.WithRetention), for the records' ages; 0: for stats, the longest TTL left of a finished record, for pending, idem's default (24h)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage // the flag package said what was wrong
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "scope" {
			o.scope = scope
		}
	})
	err = dispatch(ctx, o, pos, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "idemctl: %v\nRun idemctl -h for help.\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return exitFailure
	}
}

// parseArgs parses args with fs, flags before, between and after the
// positional arguments, and returns those in order. "--" ends the flags:
// what follows it is positional (a key that starts with '-').
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func dispatch(ctx context.Context, o options, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("no command given: want status KEY, forget KEY, resolve KEY, retry KEY, stats, pending or check")
	}
	cmd, args := args[0], args[1:]
	wantKey := cmd == "status" || cmd == "forget" || cmd == "resolve" || cmd == "retry"
	switch cmd {
	case "status", "forget", "resolve", "retry", "stats", "pending", "check":
	default:
		return usagef("unknown command %q: want status KEY, forget KEY, resolve KEY, retry KEY, stats, pending or check", cmd)
	}
	switch {
	case wantKey && len(args) == 0:
		return usagef("%s needs a KEY: idemctl %s KEY", cmd, cmd)
	case wantKey && len(args) > 1:
		return usagef("%s takes one KEY, not %d arguments (quote a key with spaces)", cmd, len(args))
	case !wantKey && len(args) > 0:
		return usagef("%s takes no arguments, got %q", cmd, args)
	case wantKey && args[0] == "":
		return usagef("%s: the KEY is empty", cmd)
	case !wantKey && o.scope != nil:
		return usagef("-scope names the key of status, forget, resolve and retry; %s takes no key", cmd)
	case !wantKey && o.ledger != "":
		return usagef("-ledger is read by status and forget; %s does not read the ledger", cmd)
	case cmd == "forget" && !o.yes:
		return usagef("forget deletes the record of %q: the next call with the key runs its operation again; add -yes to confirm (idemctl forget KEY -yes)", args[0])
	case cmd != "resolve" && (o.step != "" || o.notApplied || o.value != ""):
		return usagef("-step, -not-applied and -value are resolve's; %s does not take them", cmd)
	case cmd == "resolve" && o.step == "":
		return usagef("resolve needs the parked step's name: idemctl resolve KEY -step NAME (-not-applied | -value JSON) -yes")
	case cmd == "resolve" && o.notApplied == (o.value != ""):
		return usagef("resolve needs what happened, one of -not-applied (the effect did not happen) or -value JSON (it happened, with this value)")
	case cmd == "retry" && !o.yes:
		return usagef("retry runs the operation of %q again (the next Recover sweep, or the next call with the key): add -yes to confirm (idemctl retry KEY -yes)", args[0])
	case cmd == "resolve" && !o.yes:
		return usagef("resolve tells the service what step %q of %q did, and it acts on it (acts again, or goes on as if it had acted); ask the provider first, then add -yes", o.step, args[0])
	case o.prefix == "" || strings.ContainsAny(o.prefix, "{}"):
		return usagef("-prefix %q: must be non-empty and without '{' or '}'", o.prefix)
	case o.limit < 1:
		return usagef("-limit %d: must be positive", o.limit)
	case o.top < 0 || o.sample < 0 || o.batch < 1:
		return usagef("-top and -sample must not be negative, and -batch must be positive")
	case o.raw && cmd != "pending":
		return usagef("-raw is pending's; %s does not take it", cmd)
	case o.retention < 0:
		return usagef("-retention %v: must not be negative", o.retention)
	}
	var ldb *ledgerDB
	if o.ledger != "" {
		var err error
		if ldb, err = openLedger(o.ledger, o.ledgerTable); err != nil {
			return err
		}
		defer ldb.Close()
	}
	rdb, err := connect(o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if cmd != "stats" && o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	out := &printer{w: stdout, json: o.json}
	switch cmd {
	case "status":
		return status(ctx, o, rdb, ldb, args[0], out)
	case "forget":
		return forget(ctx, o, rdb, ldb, args[0], out)
	case "resolve":
		return resolve(ctx, o, rdb, args[0], out)
	case "retry":
		return retry(ctx, o, rdb, args[0], out)
	case "check":
		return check(ctx, o, rdb, out)
	case "pending":
		return pending(ctx, o, rdb, out)
	}
	return stats(ctx, o, rdb, out, stderr)
}

// connect makes the go-redis client that -redis and -cluster describe. It
// does not talk to Redis yet; a malformed -redis is bad usage.
func connect(o options) (redis.UniversalClient, error) {
	addr := strings.TrimSpace(o.redis)
	if strings.Contains(addr, "://") {
		if o.cluster {
			opt, err := redis.ParseClusterURL(addr)
			if err != nil {
				return nil, usagef("-redis %q: %v", o.redis, err)
			}
			opt.MaxRetries = 1
			return redis.NewClusterClient(opt), nil
		}
		opt, err := redis.ParseURL(addr)
		if err != nil {
			return nil, usagef("-redis %q: %v", o.redis, err)
		}
		opt.MaxRetries = 1
		return redis.NewClient(opt), nil
	}
	addrs := strings.Split(addr, ",")
	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, usagef("-redis %q: want host:port (such as localhost:6379) or a redis:// URL", o.redis)
		}
	}
	if o.cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: 1}), nil
	}
	if len(addrs) > 1 {
		return nil, usagef("-redis %q: one address, or -cluster for several", o.redis)
	}
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1}), nil
}

// client wraps rdb in an idem.Client for o's prefix, for Status, Forget and
// Check. It logs nothing: idemctl reports what it finds itself.
func client(o options, rdb redis.UniversalClient) *idem.Client {
	return idem.New(rdb, idem.WithPrefix(o.prefix), idem.WithMaxKeyLen(1<<16), idem.WithLogger(nil))
}

// key returns the key that idem stores for arg, the KEY argument: with
// -scope, the key httpidem gives idem for that principal's request.
func (o options) key(arg string) string {
	if o.scope == nil {
		return arg
	}
	return httpidem.ScopedKey(*o.scope, arg)
}

// recordKey is the Redis key of key's record (as idem builds it).
func recordKey(prefix, key string) string {
	return prefix + ":{" + tagEscaper.Replace(key) + "}"
}

// tagEscaper escapes a key inside the hash tag of its record, as idem does.
var tagEscaper = strings.NewReplacer(`\`, `\\`, `}`, `\c`)

// printer writes the output: text, or one JSON object.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) printf(format string, args ...any) {
	if !p.json {
		fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) object(v any) error {
	if !p.json {
		return nil
	}
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// statusJSON is a record's state in -json output.
type statusJSON struct {
	Key       string     `json:"key"`             // as idem stores it
	Scope     *string    `json:"scope,omitempty"` // -scope
	Record    string     `json:"record"`
	State     string     `json:"state"`
	Step      string     `json:"step,omitempty"` // the parked step, for state "parked"
	Attempt   int64      `json:"attempt"`
	LeaseEnds *time.Time `json:"lease_ends,omitempty"`
	LeaseLive bool       `json:"lease_live"`
	Expires   *time.Time `json:"expires,omitempty"`
	// Tombstone: the record is gone after its retention and a tombstone of
	// the key is left (idem.WithTombstones): a call gets ErrLateRetry.
	Tombstone bool        `json:"tombstone"`
	Ledger    ledgerJSON  `json:"ledger"`
	Next      string      `json:"next"`                // what the next call with the key does
	Elsewhere []elsewhere `json:"elsewhere,omitempty"` // records of the KEY under other scopes or prefixes, when it has none
}

// status reports the record of arg, the KEY argument, and its ledger row
// (with -ledger); when there is no record, it looks for records of arg
// under other scopes and prefixes.
func status(ctx context.Context, o options, rdb redis.UniversalClient, ldb *ledgerDB, arg string, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	key := o.key(arg)
	st, err := c.Status(ctx, key)
	if err != nil {
		return err
	}
	j := describe(o, key, st)
	if j.Ledger, err = ldb.lookup(ctx, key); err != nil {
		return err
	}
	j.Next = nextCall(st, st.Tombstone, j.Ledger)
	var partial bool
	if st.State == idem.StateAbsent && !st.Tombstone && !j.Ledger.Found {
		if j.Elsewhere, partial, err = findElsewhere(ctx, o, rdb, "status", arg); err != nil {
			return err
		}
	}
	if out.json {
		if err := out.object(j); err != nil {
			return err
		}
	} else {
		printStatus(out, j, st)
	}
	return reportElsewhere(out, arg, j.Elsewhere, partial)
}

func describe(o options, key string, st idem.Status) statusJSON {
	j := statusJSON{Key: key, Scope: o.scope, Record: recordKey(o.prefix, key), State: st.State.String(), Step: st.Step, Attempt: st.Attempt, Tombstone: st.Tombstone}
	if !st.LeaseEnds.IsZero() {
		t := st.LeaseEnds.UTC()
		j.LeaseEnds = &t
		j.LeaseLive = st.State == idem.StateInProgress && time.Until(t) > 0
	}
	if !st.Expires.IsZero() {
		t := st.Expires.UTC()
		j.Expires = &t
	}
	return j
}

func printStatus(out *printer, j statusJSON, st idem.Status) {
	out.printf("key:      %q (record %s)\n", j.Key, j.Record)
	if j.Scope != nil {
		out.printf("scope:    %q (an HTTP request's key, as httpidem stores it for that principal)\n", *j.Scope)
	}
	out.printf("state:    %s\n", j.State)
	switch {
	case j.Step != "":
		out.printf("step:     %s (parked: its outcome is unknown)\n", j.Step)
	case st.State == idem.StateParked:
		out.printf("          parked: its recoveries did not finish it (idem.WithMaxRecoveries)\n")
	}
	if st.State == idem.StateAbsent {
		if j.Tombstone {
			out.printf("          no record, but a tombstone: the key was used and its retention ended\n")
		} else {
			out.printf("          no record\n")
		}
	} else {
		out.printf("attempt:  %d\n", j.Attempt)
	}
	if j.LeaseEnds != nil {
		left := time.Until(*j.LeaseEnds).Round(time.Millisecond)
		switch {
		case st.State == idem.StateReleased, st.State == idem.StateParked:
			out.printf("lease:    given back\n")
		case left > 0:
			out.printf("lease:    ends %s (in %v): its owner is running the operation\n", j.LeaseEnds.Format(time.RFC3339Nano), left)
		default:
			out.printf("lease:    ended %s (%v ago): its owner is gone\n", j.LeaseEnds.Format(time.RFC3339Nano), -left)
		}
	}
	switch {
	case st.State == idem.StateAbsent:
	case j.Expires != nil:
		out.printf("expires:  %s (in %v)\n", j.Expires.Format(time.RFC3339Nano), time.Until(*j.Expires).Round(time.Second))
	default:
		out.printf("expires:  never (the record has no TTL: idem always sets one; was it changed by hand?)\n")
	}
	out.printf("ledger:   %s\n", j.Ledger.line())
	out.printf("next:     %s\n", j.Next)
}

// forget deletes the record of arg, the KEY argument, its steps'
// checkpoints and its tombstone, and says what the next call does, from
// the ledger's row (with -ledger). When there is neither a record nor a
// tombstone, it looks for records of arg under other scopes and prefixes.
func forget(ctx context.Context, o options, rdb redis.UniversalClient, ldb *ledgerDB, arg string, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	key := o.key(arg)
	st, err := c.Status(ctx, key)
	if err != nil && !errors.Is(err, idem.ErrCorrupt) {
		return err
	}
	lj, lerr := ldb.lookup(ctx, key)
	if lerr != nil {
		return fmt.Errorf("%w; nothing was forgotten", lerr)
	}
	next := nextCall(idem.Status{}, false, lj)
	// Forget whatever Status saw: a tombstone it could not see (a bucket
	// written as it looked) is marked forgotten all the same.
	if ferr := c.Forget(ctx, key); ferr != nil {
		return ferr
	}
	if err == nil && st.State == idem.StateAbsent && !st.Tombstone {
		found, partial, err := findElsewhere(ctx, o, rdb, "forget", arg)
		if err != nil {
			return err
		}
		out.printf("key %q has no record and no tombstone: nothing to forget\n", key)
		out.printf("ledger: %s\nnext:   %s\n", lj.line(), next)
		if err := out.object(map[string]any{"key": key, "forgotten": false, "was": "absent", "ledger": lj, "next": next, "elsewhere": found}); err != nil {
			return err
		}
		return reportElsewhere(out, arg, found, partial)
	}
	was := "unreadable"
	switch {
	case err != nil:
	case st.State == idem.StateAbsent:
		was = "a tombstone"
	default:
		was = st.State.String()
	}
	if st.State == idem.StateAbsent || err != nil {
		out.printf("forgot key %q (it was %s)\n", key, was)
	} else {
		out.printf("forgot key %q (it was %s, attempt %d)\n", key, was, st.Attempt)
	}
	out.printf("ledger: %s\nnext:   %s\n", lj.line(), next)
	return out.object(map[string]any{"key": key, "forgotten": true, "was": was, "attempt": st.Attempt, "tombstone": st.Tombstone, "ledger": lj, "next": next})
}

func check(ctx context.Context, o options, rdb redis.UniversalClient, out *printer) error {
	c := client(o, rdb)
	defer c.Close()
	servers, err := c.Check(ctx)
	if servers == nil && err != nil {
		return err
	}
	if out.json {
		if jerr := out.object(map[string]any{"ok": err == nil, "servers": servers}); jerr != nil {
			return jerr
		}
	} else {
		for _, s := range servers {
			fsync := s.AppendFsync
			if fsync == "" {
				fsync = "unknown"
			}
			if s.Version == "" {
				out.printf("%s:\n", s.Addr) // unreachable, or INFO refused: the problems and notes say
			} else {
				out.printf("%s: Redis %s, %s, maxmemory-policy %s, appendonly %v (appendfsync %s), %d replicas\n",
					s.Addr, s.Version, s.Role, s.MaxMemoryPolicy, yesNo(s.AppendOnly), fsync, s.Replicas)
			}
			for _, p := range s.Problems {
				out.printf("  PROBLEM: %s\n", p)
			}
			for _, n := range s.Notes {
				out.printf("  note: %s\n", n)
			}
		}
	}
	if err != nil {
		n := 0
		for _, s := range servers {
			n += len(s.Problems)
		}
		return fmt.Errorf("check found %d problems:\n%w", n, err)
	}
	out.printf("ok: no problems\n")
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
