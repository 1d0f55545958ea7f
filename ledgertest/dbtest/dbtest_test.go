package dbtest

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB records Skip and Fatal instead of ending the test; unlike the
// real ones, they return to the caller.
type recordingTB struct {
	testing.TB
	skipped, fatal string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Skipf(f string, a ...any)  { r.skipped = fmt.Sprintf(f, a...) }
func (r *recordingTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...) }
func (r *recordingTB) Fatal(a ...any)            { r.fatal = fmt.Sprint(a...) }

func TestMissingServers(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		start      func(testing.TB)
	}{
		{"redis", "redis-server not found", func(tb testing.TB) { StartRedis(tb) }},
		{"postgres", "PostgreSQL (initdb and postgres) not found", func(tb testing.TB) { SharedPostgres(tb) }},
		{"durable postgres", "PostgreSQL (initdb and postgres) not found", func(tb testing.TB) { DurablePostgres(tb) }},
		{"mariadb", "MariaDB (mariadbd and mariadb-install-db) not found", func(tb testing.TB) { SharedMariaDB(tb) }},
		{"durable mariadb", "MariaDB (mariadbd and mariadb-install-db) not found", func(tb testing.TB) { DurableMariaDB(tb) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", t.TempDir())
			t.Setenv("IDEMSQL_PG_BIN", t.TempDir())
			t.Setenv("IDEMSQL_MARIADB_BIN", t.TempDir())
			for _, required := range []bool{false, true} {
				t.Setenv(RequireEnv, map[bool]string{false: "", true: "1"}[required])
				r := &recordingTB{TB: t}
				tc.start(r)
				got, other := r.skipped, r.fatal
				if required {
					got, other = r.fatal, r.skipped
				}
				if !strings.Contains(got, tc.want) || other != "" {
					t.Errorf("%s=%v: skipped %q, failed %q; want a %s naming what is missing", RequireEnv, required, r.skipped, r.fatal,
						map[bool]string{false: "skip", true: "failure"}[required])
				}
				if required && !strings.Contains(got, RequireEnv) {
					t.Errorf("failure %q does not name %s", got, RequireEnv)
				}
			}
		})
	}
}
