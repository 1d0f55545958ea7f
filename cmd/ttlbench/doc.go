// Command ttlbench helps choose idem's retention (WithRetention): how long
// the record of a finished operation is kept.
//
// Too short, and a late retry (a client recovering after an outage, a
// message redelivered an hour later) runs the side effect a second time.
// Too long, and Redis memory grows. ttlbench answers with the real library:
// it replays traffic through idem.New and Client.Do once per retention
// policy and counts, from a ledger the operation writes to, how often an
// operation ran more than once, and how many records, and bytes, were alive
// at the peak. It recommends the shortest retention whose duplicate rate
// (duplicates per operation) is at most a target.
//
// Run it with no flags for a modelled workload on an embedded miniredis:
//
//	go run ./cmd/ttlbench
//	go run ./cmd/ttlbench -rate 50 -late-share 0.001 -late-p99 12h -json
//	go run ./cmd/ttlbench -trace requests.csv -svg tradeoff.svg
//	go run ./cmd/ttlbench -redis localhost:6379 -ops 2000 -time-scale 100
//
// # Traffic
//
// The model: operations arrive as a Poisson process (-ops, -rate), each with
// a random UUID key. Each attempt times out at the client with probability
// -timeout-share; the operation completes on the server all the same, and
// the client retries with exponential backoff (-retries, -retry-base,
// -retry-factor, -retry-jitter, -retry-cap), so a retained record answers
// the retry. A share of operations (-late-share) is delivered once more
// after a lognormal delay (-late-median, -late-p99). A seed (-seed) fixes
// every draw, so a run can be repeated exactly.
//
// A trace (-trace FILE) replays recorded requests instead: CSV lines
//
//	key,unix_ms[,fingerprint]
//
// one per request, in any order (they are sorted by time), where unix_ms is
// the request's time in milliseconds since 1970 and the optional
// fingerprint stands for its parameters. The first request with a key is
// the operation; later ones are retries. Lines starting with '#', blank
// lines and a header line "key,unix_ms,..." are skipped; a key holding a
// comma or a quote is quoted as in CSV. Errors name the line.
//
// # Time
//
// On miniredis, time is virtual. The server's clock (miniredis SetTime) is
// moved to each request's time. Records expire exactly when their TTL,
// counted in virtual time, runs out: ttlbench tracks each record's expiry,
// brings a record's TTL up to date just before a script touches it (the
// library's scripts read leases from the TTL) and deletes it when its time
// is up, which is what miniredis's FastForward would do at a cost that does
// not grow with the number of live records.
// The function given to Do is instant, and WithWait(0) keeps anything from
// blocking on the wall clock.
//
// On a real Redis (-redis ADDR), time runs -time-scale times faster than
// the traffic's: retentions, the lease and the pauses between requests are
// divided by it and ttlbench sleeps in real time. A scale that leaves the
// lease under 250ms of real time is refused (exit 2, naming the largest
// safe scale): on a busy machine such a lease ends before its owner
// records the outcome. Each policy's keys get a
// prefix of their own, and only keys with that prefix are deleted at the
// end.
//
// # Output
//
// A table (or, with -json, one JSON object per policy per line, with the
// fields retention, retention_ms, operations, requests, retries, replays,
// conflicts, duplicates, duplicate_rate, peak_records, peak_bytes,
// bytes_method and recommended), and with -svg FILE a chart of duplicate
// rate against peak memory for a design review. Peak bytes are, on
// miniredis, the key names, field names and values of the live records (the
// data, without Redis's overhead: about 110 bytes a record on Redis 7 while
// the result is at most 64 bytes, about 500 when longer); on a real Redis,
// the MEMORY USAGE of each record. Output files are written whole or not at
// all.
package main
