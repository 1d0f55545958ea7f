package dbtest

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// Each NewDatabase is a database of its own on the shared server, reached
// by a plain DSN.
func TestSharedMariaDB(t *testing.T) {
	m := SharedMariaDB(t)
	if again := SharedMariaDB(t); again != m {
		t.Fatal("a second SharedMariaDB started another server")
	}
	a, b := m.Open(t, m.NewDatabase(t)), m.Open(t, m.NewDatabase(t))
	if _, err := a.Exec("CREATE TABLE x (n BIGINT)"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec("SELECT n FROM x"); err == nil {
		t.Error("a table of one NewDatabase is seen from another")
	}
	var version string
	var port int
	if err := a.QueryRow("SELECT VERSION(), @@port").Scan(&version, &port); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") || port != m.port || port == 3306 {
		t.Errorf("server %q on port %d; want MariaDB on %d", version, port, m.port)
	}
}

// A durable server is stopped, and its directory removed, when its test
// ends.
func TestDurableMariaDBStops(t *testing.T) {
	var m *MariaDB
	t.Run("server", func(t *testing.T) {
		m = DurableMariaDB(t)
		var v int
		if err := m.Open(t, m.DSN("")).QueryRow("SELECT @@innodb_flush_log_at_trx_commit").Scan(&v); err != nil || v != 1 {
			t.Fatalf("innodb_flush_log_at_trx_commit = %d, %v; want 1", v, err)
		}
	})
	if m == nil || t.Failed() {
		return
	}
	if _, err := os.Stat(m.dir); !os.IsNotExist(err) {
		t.Errorf("the server's directory %s is still there: %v", m.dir, err)
	}
	if c, err := net.DialTimeout("tcp", m.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("the server still listens on %s", m.Addr())
	}
}
