//go:build unix

package dbtest

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// account is the OS user a server runs as; nil means the test's own.
type account struct {
	name     string
	uid, gid uint32
}

// unprivileged returns the account to run PostgreSQL as: nil unless the
// tests run as root, else the "postgres" system user, or "nobody".
func unprivileged() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var last error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			last = err
			continue
		}
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return nil, err
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return nil, err
		}
		return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, last
}

// chown gives path to a (nothing when a is nil).
func (a *account) chown(path string) error {
	if a == nil {
		return nil
	}
	return os.Chown(path, int(a.uid), int(a.gid))
}

// runAs makes cmd run as a (as the test's own user when a is nil).
func (a *account) runAs(cmd *exec.Cmd) {
	var cred *syscall.Credential
	if a != nil {
		cred = &syscall.Credential{Uid: a.uid, Gid: a.gid}
	}
	cmd.SysProcAttr = sysProcAttr(cred)
}

// String names the account.
func (a *account) String() string {
	if a == nil {
		return "the test's user"
	}
	return a.name
}
