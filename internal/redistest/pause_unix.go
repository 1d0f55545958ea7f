//go:build unix

package redistest

import "syscall"

// Pause stops the server with SIGSTOP: it keeps its connections open but
// answers nothing until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP, true) }

// Resume continues a server stopped by Pause with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT, false) }
