// Package idem makes side-effecting operations safe to retry.
//
// A client that times out and sends the same request again cannot know
// whether the first attempt ran. It attaches an idempotency key to the
// logical operation, and the service wraps the side effect in Do:
//
//	receipt, err := idem.Do(ctx, client, req.IdempotencyKey,
//		idem.Fingerprint(req.Account, req.Amount),
//		func(ctx context.Context) (Receipt, error) {
//			a, _ := idem.AttemptFrom(ctx)
//			// Forward a.Key to the bank's own idempotency; a.Number > 1
//			// means an earlier attempt may have acted: reconcile first.
//			return bank.Debit(ctx, req.Account, req.Amount, a.Key)
//		})
//
// # How it works
//
// Each key has one record in Redis, <prefix>:{<key>}, a compact string
// changed only by Lua scripts (lua/*.lua), so every step is atomic on the
// server:
//
//	absent ──claim──▶ in progress (attempt 1) ──fn ok──▶ done ──retention ends──▶ absent
//	                      │ ──Permanent(err)──▶ failed (replayed like a result)
//	                      │ ──error or panic──▶ released ──claim──▶ in progress (attempt n+1)
//	                      └──lease ends (owner died), claim──▶ in progress (attempt n+1)
//
// Exactly one caller claims the key and runs fn; while it runs, its lease
// is renewed every third of the lease. Its result is stored for the
// retention and returned to every later call with the key, without running
// fn. Duplicates that arrive while fn runs wait for the outcome, woken by
// Redis pub/sub, with polling as the fallback; the wait loop is the claim
// loop, so a waiter whose owner gave up takes the key over. Within one
// process, duplicates with one key and fingerprint share one claim and one
// wait. A key reused with another fingerprint gets ErrConflict at once. If
// the owner dies, its lease ends and the next caller takes over with the
// next attempt number, a fencing token. A stale owner cannot overwrite a
// newer one: recording is compare-and-set on a random owner token, and
// fails with ErrLeaseLost.
//
// Do fails closed: when Redis cannot be reached, or a record cannot be
// understood, fn does not run and Do says why. When fn ran but its outcome
// could not be stored, Do returns an error wrapping ErrNotRecorded, and the
// key stays claimed until its lease ends.
//
// # Leases and clocks
//
// The server's TTL decides when another caller may take a key over. The
// owner keeps its own, earlier deadline: a lease granted by a claim sent at
// t ends for it at t + lease - lease/32 (the server acted after t), and a
// renewal sent at t' that succeeds moves it to t' + lease - lease/32. fn
// does not start on less than a third of a lease (the owner renews once
// first), and fn's context ends at the owner's deadline, with cause
// ErrLeaseLost, whether or not a renewal call is still hanging. This holds
// under one assumption: over one lease, the client's and the server's
// clocks drift apart by much less than lease/32. The protocol is modelled
// in Promela and checked by spin (model/).
//
// # What is promised, and what is not
//
// Exactly-once execution across a whole system cannot be promised by a
// lock service alone: Redis replication is asynchronous, a failover can
// lose a recent claim, and a paused process can act after its lease ended.
// Where the effect lives in the service's own database, WithLedger records
// the outcome in the transaction of the business change, and the
// database's unique key decides which attempt's change stands. Elsewhere,
// use the two real defences: pass Attempt.Key to the downstream system's
// own idempotency mechanism, and use Attempt.Number as a fencing token (or
// a cue to reconcile) when it is greater than 1. A retry that comes after
// the retention finds no record and runs fn again, unless WithTombstones
// keeps a trace of the key to refuse it (ErrLateRetry).
//
// # Steps
//
// An fn of several effects wraps each in Step: a step's outcome is
// checkpointed beside the record (compare-and-set on the owner token), and
// a later attempt resumes after the last checkpointed step. StepKey gives
// each step a stable key for the downstream system, which alone covers a
// step that acted and crashed before its checkpoint. For a downstream
// with no idempotency key, StepChecked stores an intent before it acts,
// and a later attempt asks the downstream (check) instead of acting
// again; what it cannot settle is parked (ErrUnknownOutcome) until an
// operator resolves it (Resolve, ResolveNotApplied). See docs/steps.md.
//
// # Recovery
//
// An operation registered under a name (Register) stores its input beside
// its claim while it is unfinished. When its caller does not come back (it
// crashed, or gave up after a transient failure), a Recover loop in any
// process where the name is registered takes it over after
// WithRecoverAfter, as the next attempt of the same fenced takeover, and
// runs fn with the stored input; the caller's later Do or Result gets the
// outcome. After WithMaxRecoveries recoveries that did not finish it, the
// operation is parked until Retry. Plain Do calls, and operations whose
// name no running Recover knows, are finished only by their callers. See
// docs/design.md.
//
// # Fingerprints
//
// Fingerprint hashes each part as a tagged, length-delimited encoding of:
//
//   - time.Time: its instant (Unix seconds and nanoseconds), not its
//     location or monotonic reading.
//   - A value whose type, or a pointer to it, implements
//     encoding.BinaryMarshaler: its type's name and MarshalBinary's bytes;
//     else, if it implements encoding.TextMarshaler: its type's name and
//     MarshalText's bytes. So big.Int, big.Float, big.Rat, netip.Addr,
//     url.URL and decimal types are hashed by their value, not their
//     internal representation. A marshaler that fails or panics is
//     skipped for the structure below, with a tag of its own.
//   - Booleans; integers by value, signed and unsigned apart but whatever
//     their size (int8(1) and int64(1) are equal); floats and complex
//     numbers by the IEEE 754 bits of their float64 form (0 and -0
//     differ); strings and byte slices or arrays by their bytes, apart.
//   - Slices and arrays element by element (a nil slice equals an empty
//     one); maps entry by entry, in the order of their keys' encodings (a
//     nil map equals an empty one).
//   - Structs: the type's name, then every field, exported or not, by name
//     and value in declaration order. Structs of the packages sync and
//     sync/atomic (mutexes, Once, counters) are hashed by their type's name
//     only: their state is not a parameter.
//   - Pointers and interfaces by what they point to; nil has a tag of its
//     own.
//   - A pointer, map or slice met again inside itself (a cyclic value) by a
//     reference to the enclosing one it repeats (how many such levels up),
//     so a cyclic value has a fingerprint like any other.
//   - Funcs, channels and unsafe pointers by their type's name only.
//
// Fingerprints are part of the stored records: a change of the
// fingerprint of any value is a breaking change, as a retry after the
// upgrade would get ErrConflict.
//
// # Typed results
//
// The typed Do stores fn's result encoded with msgpack. The owner gets fn's
// value as it returned it; a replay gets the stored copy, equal to it as
// reflect.DeepEqual sees it (nil and empty slices told apart), or an error
// wrapping ErrDecode that names the key and the type, never a zero or
// partial value.
//
// What round-trips: booleans, numbers, strings, byte slices and arrays,
// slices, arrays, maps, pointers and structs of these, by exported field
// (under its msgpack tag name, if any; embedded structs as msgpack inlines
// them); time.Time, as the same instant in the local time zone (its
// location and monotonic reading are not stored); and types with their
// own marshaler and unmarshaler (msgpack.CustomEncoder, msgpack.Marshaler,
// encoding.BinaryMarshaler, encoding.TextMarshaler: big.Int, big.Rat,
// netip.Addr, url.URL, decimal types), as faithfully as their pair is.
//
// What is refused, with an error wrapping ErrEncode, at the first call
// with a given T and before fn runs: interface fields (an int would come
// back as another integer type), unexported fields and fields tagged
// msgpack:"-" (they would come back zero), channels, funcs, complex
// numbers, pointers to pointers, slices or maps (a pointer to nil is
// stored as nil), map keys that hold pointers or times, a marshaler
// without its unmarshaler, and msgpack's omitempty (on a field, or on a
// struct's _msgpack field) on a field that would come back as another
// value: a slice or map (empty comes back nil), a float (-0 comes back
// 0), a struct, or a type with an IsZero method. omitempty on booleans,
// integers, strings, pointers and arrays is accepted: their empty value is
// Go's zero value. Hold such state in a type with a marshaler, or use
// Client.Do with bytes of your own.
//
// Changing T keeps stored results readable where nothing is lost: a field
// added to T decodes as its zero value, and a number decodes into any
// numeric type that holds it exactly. A stored field that T does not have
// (renamed or removed), a value that does not fit its field (300 into a
// uint8, 1.5 into an int, -1 into a uint), or another shape is ErrDecode.
//
// # Redis
//
// New takes any go-redis UniversalClient: a single server, Sentinel
// failover, or Redis Cluster, where every script touches one hash slot and
// notifications use sharded pub/sub (Redis 7). WithReplicas makes claims
// and outcomes wait for replicas (WAIT), so that an acknowledged outcome
// survives a failover. Run Redis with maxmemory-policy noeviction: every
// record has a TTL, so a volatile-* policy may evict a live claim and let
// a retry run twice. New checks the policy when it can and warns through
// WithLogger; Check checks all of it, for start-up and readiness probes.
//
// A lone call sends each script as one EVALSHA. Concurrent calls' scripts
// share pipelines (WithPipelines), each call keeping its own reply, errors
// and context; and a waiter woken by its owner's notification takes a
// small outcome from the notification itself, which carries the stored
// record, instead of claiming again.
//
// # Seeing it run
//
// WithObserver receives an Event for every call's outcome and for the
// steps on its way (waited, took over), with the key as a keyed digest.
// The otelidem module turns events into OpenTelemetry metrics and spans;
// cmd/idemctl shows and mends the records from a shell.
package idem
