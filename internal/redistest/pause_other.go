//go:build !unix

package redistest

// Pause would stop the server with SIGSTOP, which this system lacks: it
// skips the test.
func (s *Server) Pause() { s.tb.Skip("redistest: Pause needs SIGSTOP, which this system lacks") }

// Resume would continue a server stopped by Pause; see Pause.
func (s *Server) Resume() { s.tb.Skip("redistest: Resume needs SIGCONT, which this system lacks") }
