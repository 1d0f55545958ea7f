package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
)

// MariaDB is one MariaDB server: the user "root" without a password, on a
// loopback port.
type MariaDB struct {
	dir     string // holds data/, the logs and the socket
	port    int
	as      *account
	durable bool
	proc    *process
	dbs     atomic.Int64 // databases made by NewDatabase
}

var sharedMaria struct {
	mu  sync.Mutex
	db  *MariaDB
	err error // of the one start, repeated to every later caller
	ran bool
}

// SharedMariaDB returns the test binary's MariaDB server, started at the
// first call (mariadb-install-db takes seconds), with InnoDB's log flushed
// about once a second instead of at every commit (the tests kill clients,
// never the server); StopShared, from TestMain, stops it. It skips the
// test when MariaDB is not installed, or fails it under
// IDEM_REQUIRE_REDIS=1, and fails it when the server did not start.
func SharedMariaDB(tb testing.TB) *MariaDB {
	tb.Helper()
	bin, ok := mariadbBin()
	if !ok {
		missing(tb, "MariaDB (mariadbd and mariadb-install-db)", "mariadb-server")
		return nil
	}
	sharedMaria.mu.Lock()
	defer sharedMaria.mu.Unlock()
	if !sharedMaria.ran {
		sharedMaria.ran = true
		sharedMaria.db, sharedMaria.err = startMariaDB(bin, false)
	}
	if sharedMaria.err != nil {
		tb.Fatalf("dbtest: %v", sharedMaria.err)
	}
	return sharedMaria.db
}

// DurableMariaDB starts a MariaDB server of the test's own, with InnoDB's
// durable defaults (the log flushed at every commit, the doublewrite
// buffer on), for benchmarks whose figures should be a production
// server's. It is stopped when the test ends.
func DurableMariaDB(tb testing.TB) *MariaDB {
	tb.Helper()
	bin, ok := mariadbBin()
	if !ok {
		missing(tb, "MariaDB (mariadbd and mariadb-install-db)", "mariadb-server")
		return nil
	}
	m, err := startMariaDB(bin, true)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(m.stop)
	return m
}

// stopSharedMariaDB stops the server of SharedMariaDB, if it was started,
// and removes its directory.
func stopSharedMariaDB() {
	sharedMaria.mu.Lock()
	defer sharedMaria.mu.Unlock()
	if sharedMaria.db != nil {
		sharedMaria.db.stop()
		sharedMaria.db = nil
	}
}

// mariadbBin returns the paths of mariadbd and mariadb-install-db: from
// the directory in the environment variable IDEMSQL_MARIADB_BIN, else
// Debian's /usr/sbin/mariadbd and the PATH's mariadb-install-db.
func mariadbBin() (bin mariadbPaths, ok bool) {
	if d := os.Getenv("IDEMSQL_MARIADB_BIN"); d != "" {
		bin = mariadbPaths{server: filepath.Join(d, "mariadbd"), install: filepath.Join(d, "mariadb-install-db")}
	} else {
		bin.server = "/usr/sbin/mariadbd"
		if _, err := os.Stat(bin.server); err != nil {
			bin.server, _ = exec.LookPath("mariadbd")
		}
		bin.install, _ = exec.LookPath("mariadb-install-db")
	}
	for _, p := range []string{bin.server, bin.install} {
		if p == "" {
			return bin, false
		}
		if _, err := os.Stat(p); err != nil {
			return bin, false
		}
	}
	return bin, true
}

type mariadbPaths struct{ server, install string }

func startMariaDB(bin mariadbPaths, durable bool) (*MariaDB, error) {
	as, err := unprivileged()
	if err != nil {
		return nil, fmt.Errorf("MariaDB refuses to run as root, and no unprivileged user was found: %w", err)
	}
	dir, err := os.MkdirTemp("", "idemsql-mariadb-")
	if err != nil {
		return nil, err
	}
	if err := as.chown(dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("give %s to %s: %w", dir, as, err)
	}
	m := &MariaDB{dir: dir, as: as, durable: durable}
	if err := m.install(bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for range 5 { // another process may take the free port first
		if m.port, err = freePort(); err != nil {
			break
		}
		var busy bool
		if busy, err = m.launch(bin); err == nil || !busy {
			break
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

func (m *MariaDB) env() []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "HOME=" + m.dir}
}

// install creates the system tables, with a root user that logs in
// without a password from the loopback addresses.
func (m *MariaDB) install(bin mariadbPaths) error {
	cmd := exec.Command(bin.install, "--no-defaults", "--datadir="+filepath.Join(m.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve")
	cmd.Dir, cmd.Env = m.dir, m.env()
	p, err := start(cmd, m.as, filepath.Join(m.dir, "install.log"))
	if err != nil {
		return err
	}
	<-p.done
	if p.err != nil {
		return fmt.Errorf("mariadb-install-db as %s: %v\n%s", m.as, p.err, p.output())
	}
	return nil
}

// launch starts the server and waits until it accepts connections; busy
// reports that its port was taken.
func (m *MariaDB) launch(bin mariadbPaths) (busy bool, err error) {
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"),
		"--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket=" + filepath.Join(m.dir, "mariadb.sock"), "--pid-file=" + filepath.Join(m.dir, "mariadb.pid"),
		"--max-connections=300", "--innodb-buffer-pool-size=128M", "--skip-log-bin"}
	if !m.durable {
		args = append(args, "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--sync-frm=0")
	}
	cmd := exec.Command(bin.server, args...)
	cmd.Dir, cmd.Env = m.dir, m.env()
	p, err := start(cmd, m.as, filepath.Join(m.dir, "mariadb.log"))
	if err != nil {
		return false, err
	}
	db, err := sql.Open("mysql", m.DSN(""))
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
		return strings.Contains(out, "Address already in use") || strings.Contains(out, "Can't start server: Bind"),
			fmt.Errorf("mariadbd on port %d as %s: %w\n%s", m.port, m.as, err, out)
	}
	m.proc = p
	return false, nil
}

// stop shuts the server down (SIGTERM: a normal shutdown) and removes its
// directory.
func (m *MariaDB) stop() {
	if m.proc != nil {
		m.proc.stop(syscall.SIGTERM, 20*time.Second)
	}
	os.RemoveAll(m.dir)
}

// DSN returns the DSN of database db on the server (the server itself
// when db is ""), as root, in go-sql-driver/mysql's form: a plain one,
// with nothing idemsql.MySQL needs set.
func (m *MariaDB) DSN(db string) string {
	return "root@tcp(" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) + ")/" + db + "?parseTime=true"
}

// Addr returns the server's address, host:port.
func (m *MariaDB) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// NewDatabase creates a new, empty database and returns its DSN. Tests
// that share the server each take a database of their own.
func (m *MariaDB) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), m.dbs.Add(1))
	db := m.Open(tb, m.DSN(""))
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	return m.DSN(name)
}

// Open opens dsn with go-sql-driver/mysql; the handle is closed when the
// test ends.
func (m *MariaDB) Open(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
