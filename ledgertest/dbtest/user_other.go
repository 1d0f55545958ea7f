//go:build !unix

package dbtest

import "os/exec"

// account is the OS user a server runs as; on this system always the
// test's own.
type account struct{}

func unprivileged() (*account, error) { return nil, nil }

func (a *account) chown(string) error { return nil }

func (a *account) runAs(*exec.Cmd) {}

func (a *account) String() string { return "the test's user" }
