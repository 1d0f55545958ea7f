// Package readmetest runs the commands a README shows, so that what users
// copy works.
//
// A README's ```console blocks hold commands, each on a line starting
// with "$ " (a line ending with a backslash goes on on the next), and the
// output each command prints (standard output and standard error, as a
// terminal shows them) on the lines below it, up to the next command.
// Run runs every command through sh and checks its exit status (0, or N
// where the command ends with a comment "# exit N") and its output. In the
// output shown, "..." stands for any text within a line, and a line that
// is only "..." for any number of lines; trailing spaces do not count.
// Other fenced blocks are not run.
package readmetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Options say where and how the commands run.
type Options struct {
	// Dir is the working directory of the commands.
	Dir string
	// Env is added to the environment of the commands (PATH, with the
	// commands under test first, say).
	Env []string
	// Replace holds old, new pairs of strings replaced in each command
	// before it runs: the README's localhost:6379 by a test server's
	// address, say.
	Replace []string
	// Timeout bounds each command. The default is a minute.
	Timeout time.Duration
}

// A Command is one command of a README and the output shown below it.
type Command struct {
	Line     int    // in the README, from 1
	Text     string // the command, without "$ ", continuation lines joined
	Exit     int    // the exit status it should have
	Expected []string
}

// Parse returns the commands of the README's console blocks.
func Parse(readme []byte) ([]Command, error) {
	var (
		cmds    []Command
		in      bool
		cur     *Command
		pending string // a command line continued with a backslash
		start   int
	)
	lines := strings.Split(string(readme), "\n")
	for i, l := range lines {
		n := i + 1
		t := strings.TrimRight(l, " \t\r")
		switch {
		case !in && strings.HasPrefix(t, "```console"):
			in, cur = true, nil
			continue
		case !in:
			continue
		case t == "```":
			if pending != "" {
				return nil, fmt.Errorf("line %d: a command ends with a backslash at the end of its block", start)
			}
			in = false
			continue
		}
		if pending != "" || strings.HasPrefix(t, "$ ") {
			if pending == "" {
				start = n
				t = strings.TrimPrefix(t, "$ ")
			} else {
				t = strings.TrimLeft(t, " \t")
			}
			if c, ok := strings.CutSuffix(t, `\`); ok {
				pending += c
				continue
			}
			text := pending + t
			pending = ""
			exit, err := exitStatus(text)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", start, err)
			}
			cmds = append(cmds, Command{Line: start, Text: text, Exit: exit})
			cur = &cmds[len(cmds)-1]
			continue
		}
		if cur == nil {
			return nil, fmt.Errorf("line %d: output before any command in a console block", n)
		}
		cur.Expected = append(cur.Expected, t)
	}
	if in {
		return nil, fmt.Errorf("a console block is not closed")
	}
	for i := range cmds {
		// Blank lines between one command's output and the next command
		// separate them; they are not output.
		e := cmds[i].Expected
		for len(e) > 0 && e[len(e)-1] == "" {
			e = e[:len(e)-1]
		}
		cmds[i].Expected = e
	}
	return cmds, nil
}

var exitComment = regexp.MustCompile(`#\s*exit\s+(\d+)\b`)

// exitStatus reads the exit status a command's comment promises.
func exitStatus(cmd string) (int, error) {
	m := exitComment.FindStringSubmatch(cmd)
	if m == nil {
		return 0, nil
	}
	return strconv.Atoi(m[1])
}

// Run runs every command of the README at path, in order, failing t for
// each that exits otherwise than shown or prints other output. It fails
// if the README has no command.
func Run(t testing.TB, path string, o Options) {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("readmetest: the README's commands need a POSIX shell (sh), which is not on PATH")
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
		return
	}
	cmds, err := Parse(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
		return
	}
	if len(cmds) == 0 {
		t.Fatalf("%s: no ```console block with a command", path)
		return
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	r := strings.NewReplacer(o.Replace...)
	for _, c := range cmds {
		text := r.Replace(c.Text)
		ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
		cmd := exec.CommandContext(ctx, "sh", "-c", text)
		cmd.Dir = o.Dir
		cmd.Env = append(os.Environ(), o.Env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		code := 0
		if err != nil {
			ee, ok := err.(*exec.ExitError)
			if !ok {
				t.Errorf("%s:%d: %s: %v", path, c.Line, c.Text, err)
				continue
			}
			code = ee.ExitCode()
		}
		if code != c.Exit {
			t.Errorf("%s:%d: %s\nexit status %d, want %d; it printed:\n%s", path, c.Line, c.Text, code, c.Exit, out.String())
			continue
		}
		got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
		if out.Len() == 0 {
			got = nil
		}
		for i := range got {
			got[i] = strings.TrimRight(got[i], " \t\r")
		}
		if !Match(c.Expected, got) {
			t.Errorf("%s:%d: %s\nprinted:\n%s\nwhich the README does not show; it shows:\n%s",
				path, c.Line, c.Text, strings.Join(got, "\n"), strings.Join(c.Expected, "\n"))
		}
	}
}

// Match reports whether the lines got match the lines shown, where "..."
// in a line stands for any text, and a line of only "..." for any number
// of lines.
func Match(shown, got []string) bool {
	if len(shown) == 0 {
		return len(got) == 0
	}
	if shown[0] == "..." {
		for i := 0; i <= len(got); i++ {
			if Match(shown[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && matchLine(shown[0], got[0]) && Match(shown[1:], got[1:])
}

// matchLine reports whether got matches the line shown, "..." standing
// for any text.
func matchLine(shown, got string) bool {
	parts := strings.Split(shown, "...")
	if len(parts) == 1 {
		return shown == got
	}
	if !strings.HasPrefix(got, parts[0]) {
		return false
	}
	got = got[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(got, p)
		if i < 0 {
			return false
		}
		got = got[i+len(p):]
	}
	return strings.HasSuffix(got, last)
}
