package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Postgres is one PostgreSQL server (a cluster, in its words): trust
// authentication for the superuser "postgres", on a loopback port.
type Postgres struct {
	dir   string // holds data/, the log and the socket
	port  int
	as    *account
	fsync bool
	proc  *process
	dbs   atomic.Int64 // databases made by NewDatabase
}

var shared struct {
	mu  sync.Mutex
	pg  *Postgres
	err error // of the one start, repeated to every later caller
	ran bool
}

// SharedPostgres returns the test binary's PostgreSQL server, started at
// the first call (initdb takes seconds), with fsync off (the tests kill
// clients, never the server); StopShared, from TestMain, stops it. It skips the test when PostgreSQL is not installed, or fails it
// under IDEM_REQUIRE_REDIS=1, and fails it when the server did not start.
func SharedPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	bin, ok := postgresBin()
	if !ok {
		missing(tb, "PostgreSQL (initdb and postgres)", "postgresql")
		return nil
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.ran {
		shared.ran = true
		shared.pg, shared.err = startPostgres(bin, false)
	}
	if shared.err != nil {
		tb.Fatalf("dbtest: %v", shared.err)
	}
	return shared.pg
}

// DurablePostgres starts a PostgreSQL server of the test's own, with
// PostgreSQL's durable defaults (fsync, full_page_writes and
// synchronous_commit on), for benchmarks whose figures should be a
// production server's. It is stopped when the test ends.
func DurablePostgres(tb testing.TB) *Postgres {
	tb.Helper()
	bin, ok := postgresBin()
	if !ok {
		missing(tb, "PostgreSQL (initdb and postgres)", "postgresql")
		return nil
	}
	pg, err := startPostgres(bin, true)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(pg.stop)
	return pg
}

// StopShared stops the servers of SharedPostgres and SharedMariaDB, if
// they were started, and removes their directories.
func StopShared() {
	stopSharedMariaDB()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pg != nil {
		shared.pg.stop()
		shared.pg = nil
	}
}

// postgresBin returns the directory that holds initdb and postgres: the
// environment variable IDEMSQL_PG_BIN, else Debian's newest
// /usr/lib/postgresql/N/bin, else the PATH's.
func postgresBin() (string, bool) {
	has := func(dir string) bool {
		for _, p := range []string{"initdb", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("IDEMSQL_PG_BIN"); d != "" {
		return d, has(d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, true
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), true
	}
	return "", false
}

// version returns the N of /usr/lib/postgresql/N/bin.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func startPostgres(bin string, fsync bool) (*Postgres, error) {
	as, err := unprivileged()
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root, and no unprivileged user was found: %w", err)
	}
	dir, err := os.MkdirTemp("", "idemsql-pg-")
	if err != nil {
		return nil, err
	}
	if err := as.chown(dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("give %s to %s: %w", dir, as, err)
	}
	pg := &Postgres{dir: dir, as: as, fsync: fsync}
	if err := pg.initdb(bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for range 5 { // another process may take the free port first
		if pg.port, err = freePort(); err != nil {
			break
		}
		var busy bool
		if busy, err = pg.launch(bin); err == nil || !busy {
			break
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return pg, nil
}

func (pg *Postgres) env() []string {
	return []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "HOME=" + pg.dir}
}

func (pg *Postgres) initdb(bin string) error {
	cmd := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(pg.dir, "data"),
		"-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Dir, cmd.Env = pg.dir, pg.env()
	p, err := start(cmd, pg.as, filepath.Join(pg.dir, "initdb.log"))
	if err != nil {
		return err
	}
	<-p.done
	if p.err != nil {
		return fmt.Errorf("initdb as %s: %v\n%s", pg.as, p.err, p.output())
	}
	return nil
}

// launch starts the server and waits until it accepts connections; busy
// reports that its port was taken.
func (pg *Postgres) launch(bin string) (busy bool, err error) {
	args := []string{"-D", filepath.Join(pg.dir, "data"), "-p", strconv.Itoa(pg.port), "-k", pg.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300", "-c", "log_min_messages=warning"}
	if !pg.fsync {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir, cmd.Env = pg.dir, pg.env()
	p, err := start(cmd, pg.as, filepath.Join(pg.dir, "postgres.log"))
	if err != nil {
		return false, err
	}
	db, err := sql.Open("pgx", pg.DSN("postgres"))
	if err != nil {
		p.stop(nil, 0)
		return false, err
	}
	defer db.Close()
	err = p.waitFor(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return db.PingContext(ctx)
	}, time.Minute)
	if err != nil {
		p.stop(nil, 0)
		out := p.output()
		return strings.Contains(out, "could not bind") || strings.Contains(out, "Address already in use"),
			fmt.Errorf("postgres on port %d as %s: %w\n%s", pg.port, pg.as, err, out)
	}
	pg.proc = p
	return false, nil
}

// stop shuts the server down (fast shutdown: SIGINT) and removes its
// directory.
func (pg *Postgres) stop() {
	if pg.proc != nil {
		pg.proc.stop(os.Interrupt, 10*time.Second)
	}
	os.RemoveAll(pg.dir)
}

// DSN returns the URL of database db on the server, as the superuser.
func (pg *Postgres) DSN(db string) string {
	return "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.port)) + "/" + db + "?sslmode=disable"
}

// NewDatabase creates a new, empty database and returns its DSN. Tests
// that share the server each take a database of their own.
func (pg *Postgres) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), pg.dbs.Add(1))
	db := pg.Open(tb, pg.DSN("postgres"))
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	return pg.DSN(name)
}

// Open opens dsn with the pgx driver; the handle is closed when the test
// ends.
func (pg *Postgres) Open(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
