// Command ttlbench helps choose idem's retention (WithRetention): how long
// the record of a finished operation is kept.
//
// Too short, and a late retry (a client recovering after an outage, a
// message redelivered an hour later) runs the side effect a second time.
// Too long, and Redis memory grows. ttlbench replays traffic once per
// retention policy and counts how often an operation ran more than once,
// and how many records, and bytes, were alive at the peak. It searches the
// shortest retention whose duplicate rate (duplicates per operation) is at
// most a target, gives it and each policy's rate a 95% interval by
// resampling the keys, and shows the retry gaps that decide the answer.
//
// Run it with no flags for a modelled workload:
//
//	go run ./cmd/ttlbench
//	go run ./cmd/ttlbench -rate 50 -late-share 0.001 -late-p99 12h -json
//	go run ./cmd/ttlbench -trace requests.csv.gz -svg tradeoff.svg
//	zcat access.log.gz | go run ./cmd/ttlbench -trace - -columns key=idem_key,time=ts -time-unit s
//	go run ./cmd/ttlbench -redis localhost:6379 -ops 2000 -time-scale 100
//
// # Engines
//
// The fast engine (-engine fast, the default; fast.go) applies the
// protocol's rules in Go, with no Redis: for each key, the one record idem
// would keep, its TTL (the retention, set by the claim and again from the
// recording of the outcome), conflicts (another fingerprint), requests that
// find fn still running (the owner renews its lease, so the record never
// expires under it), and expiry exactly at the TTL's end. It replays ten
// million requests in well under a minute on two cores.
//
// The real engine (-engine real; real.go) replays every request through
// idem.New and Client.Do, on an embedded miniredis on a virtual clock or on
// a real Redis (-redis), and counts duplicates from a ledger fn writes to:
// a few thousand requests a second. TestEnginesAgree holds the two engines
// to exactly the same counts (replays, conflicts, requests in progress,
// duplicates, peak records and bytes) on random traces drawn at the edges:
// requests exactly at, and a millisecond either side of, a record's
// expiry, while fn runs and as it ends, with conflicting and missing
// fingerprints, keys that idem escapes.
//
// # The search and its interval
//
// Whether a request runs fn depends on its own key's requests only: it
// runs when it comes at least a retention after the recording of its key's
// last run. So each key's duplicates are a step function of the retention,
// and their sum gives the duplicates at every retention at once (search.go):
// the shortest retention meeting the target is found exactly, then rounded
// up to 1% or 1s, whichever is coarser, and replayed. A bootstrap over keys
// (each key drawn a Poisson(1) number of times, 400 resamples by default)
// gives the 95% percentile intervals. With no duplicates at a retention,
// the interval is the rule of three: below 3/operations. A trace with
// fewer than 3/target operations cannot show a rate as low as the target,
// and gets no recommendation.
//
// # Traffic
//
// The model: operations arrive as a Poisson process (-ops, -rate), each with
// a random UUID key. Each attempt times out at the client with probability
// -timeout-share; the operation completes on the server all the same, and
// the client retries with exponential backoff (-retries, -retry-base,
// -retry-factor, -retry-jitter, -retry-cap), so a retained record answers
// the retry. A share of operations (-late-share) is delivered once more
// after a lognormal delay (-late-median, -late-p99). fn runs for -op-time.
// A seed (-seed) fixes every draw, so a run can be repeated exactly.
//
// A trace (-trace FILE, or - for stdin, gzipped or not) replays recorded
// requests instead: CSV lines
//
//	key,time[,fingerprint[,duration]]
//
// one per request, in any order (they are sorted by time). With -columns a
// header line names the columns to read (key=NAME,time=NAME, and
// optionally fingerprint=NAME and duration=NAME); others are ignored.
// Times are RFC 3339, or Unix times in -time-unit (s, ms, us, ns); a Unix
// time that reads as before 1995 or after 2100 is refused (exit 2) with the
// unit the numbers look like: seconds read as milliseconds fall in January
// 1970. The first request with a key is the operation; later ones are
// retries. Rows without a key (an empty field, or "-", as access logs
// write a missing header) are skipped and counted in the report; -strict
// refuses them. Errors name the line; a first line that fails to parse
// and holds no time is taken for a header, and the error suggests the
// -columns to read it. Memory is bounded while reading: the lines
// are not kept, only 96-bit hashes of the keys and 64-bit hashes of the
// fingerprints (keytable.go), about 21 bytes a request.
//
// # Two tiers: tombstones (-tombstones)
//
// With idem.WithTombstones, a finished record is kept for the retention R,
// then only as a tombstone (digests of the key and fingerprint, 27 bytes of
// Redis memory against a few hundred for a record) for T more: a retry
// that finds only the tombstone is refused with ErrLateRetry instead of
// running fn again. -tombstones models this (fast engine; tombstones.go,
// pairs.go, held to the library by TestTombstonesAgree) and recommends
// the cheapest pair (R, T). A request runs fn only when neither record nor
// tombstone is left, which depends on the span R + T alone: so the pair's
// span is the retention that meets -target on its own (the duplicates are
// at most that retention's), and R is the shortest retention whose late
// retries, the requests refused, are at most -late-target per operation
// (0.001 by default: a refusal fails closed, the client learns that its
// operation ran and its result is gone, but it is a failed request all
// the same). The table shows, for the grid's retentions below the span
// and that R, the late retries, the duplicates and the peak memory of
// records and tombstones (-tombstone-bytes each: 27 measured on one
// server, 50 on a Redis Cluster), beside the span alone; the pair is
// recommended when it takes less memory than the span alone. Tombstones
// live until the end of their bucket's time window, up to a quarter of
// the span longer than asked: the model counts that in their memory and in
// the retries they refuse, and does not count on it to meet -target. The
// chart draws the recommended pair as a point of its own, and its
// tombstone window, from R to the span, on the gaps' time axis.
//
// # Ledger rows (idemsql, idempgx)
//
// With a ledger, a row gives a retry its receipt once Redis has no record
// of the operation, so rows are kept as long as a retry may come. The
// report recommends a Prune age from the same trace (ledger.go): the
// longest of the recommended retention (Prune's documented floor), twice
// the longest retry gap (the gaps' 100th percentile; a row is cheap) and a
// day, rounded up to whole days; and says when the longest gap is half or
// more of the time the trace covers, so that later retries may lie beyond
// it. -json gives it as ledger_prune and ledger_prune_ms.
//
// # Time
//
// On miniredis, time is virtual. The server's clock (miniredis SetTime) is
// moved to each event's time. Records expire exactly when their TTL,
// counted in virtual time, runs out: ttlbench tracks each record's expiry,
// brings a record's TTL up to date just before a script touches it (the
// library's scripts read leases from the TTL) and deletes it when its time
// is up, which is what miniredis's FastForward would do at a cost that does
// not grow with the number of live records. WithWait(0) keeps anything from
// blocking on the wall clock; an fn that runs for a while (a duration) runs
// in a goroutine that the replay releases at its end, and must be shorter
// than the lease, which idem does not renew in virtual time.
//
// On a real Redis (-redis ADDR), time runs -time-scale times faster than
// the traffic's: retentions, the lease and the pauses between requests are
// divided by it and ttlbench sleeps in real time. A scale that leaves the
// lease under 250ms of real time is refused (exit 2, naming the largest
// safe scale): on a busy machine such a lease ends before its owner
// records the outcome. Each policy's keys get a prefix of their own, and
// only keys with that prefix are deleted at the end.
//
// # Output
//
// The default -target, 0, admits no duplicate in the traffic replayed: the
// answer is then its single longest retry gap, which one outlier can set,
// and the report says so. It stays the default because a duplicate is a
// side effect run twice, and 0 needs no judgement of what that costs; a
// rate such as 0.0001 lets rare outliers go. README.md beside this file
// shows runs on the traces in testdata.
//
// A table (or, with -json, one JSON object per retention per line, then a
// summary object), and with -svg FILE a chart for a design review: the
// duplicate rate against peak memory, one point per retention, and the
// retry gaps' survival curve (the share of later requests that come R or
// more after their operation's outcome was recorded) against the
// retention, with the memory each retention costs. Peak bytes are, with
// the fast engine and miniredis, the key names and values of the live
// records (a finished record with a UUID key, a fingerprint and a 100-byte
// result holds 181 bytes; Redis 7.0 says 248 by MEMORY USAGE); on a real
// Redis, the MEMORY USAGE of each record. Output files are written whole or
// not at all. A progress bar (phase, rate, time left) is drawn on a
// terminal only.
package main
