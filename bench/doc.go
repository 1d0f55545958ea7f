// Package bench compares idem with the raw floors of three Go Redis
// clients: go-redis, valkey-go and rueidis, each sending the least a new key
// needs (a claim script, then a completion script, by EVALSHA), the same
// scripts that the root module's benchmarks use as their baseline. It holds
// only tests and benchmarks (BenchmarkFloors), and lives in a module of its
// own so that the core module's go.mod gains none of these clients; see
// README.md.
package bench
