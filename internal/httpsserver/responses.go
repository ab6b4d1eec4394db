package httpsserver

import (
	"net/http"
	"time"
)

// DropConnection makes the server close the connection after the answer
// the handler writes next, at once: a refusal that leaves the request's
// body unread (a bad token, a bad signature, a request too large) must not
// let its sender keep the connection. Without it net/http reads up to
// 256 KiB of the unwanted body first, and a sender that stalls would hold
// the connection until the read timeout; with it the connection is
// closed as soon as the answer is written. Call it before WriteHeader.
func DropConnection(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// The past read deadline makes net/http's discarding of the unread
	// body fail at once. Not every ResponseWriter supports deadlines
	// (httptest's does not); the Connection header alone still avoids
	// reusing the connection.
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// StallWriter is a ResponseWriter for long responses (downloads) whose
// write deadline moves with progress: each Write may take up to stall, so
// a slow client that keeps reading gets the whole response, while one that
// stops reading (a zero TCP window) is cut stall after its last progress,
// its connection and buffers released. The server's WriteTimeout is
// replaced for the rest of the request. With an end (Until), no write goes
// past it however much progress is made: a client that reads a little
// every so often, enough to keep each write within stall, is cut there
// too (such downloads used to stay in progress for hours).
type StallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	end   time.Time
}

// NewStallWriter wraps w with a progress-based write deadline of stall.
func NewStallWriter(w http.ResponseWriter, stall time.Duration) *StallWriter {
	return &StallWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: stall}
}

// Until bounds the whole response: no write goes past end. It returns s.
func (s *StallWriter) Until(end time.Time) *StallWriter {
	s.end = end
	return s
}

// Write extends the write deadline, up to the end, then writes. io.Copy
// writes at most 32 KiB at a time, so the deadline asks for about 32 KiB
// of progress per stall period. Past the end a write fails at once and
// the server closes the connection.
func (s *StallWriter) Write(p []byte) (int, error) {
	deadline := time.Now().Add(s.stall)
	if !s.end.IsZero() && s.end.Before(deadline) {
		deadline = s.end
	}
	// An error means the writer has no deadlines (httptest's): the
	// server's WriteTimeout, if any, stays in force.
	_ = s.rc.SetWriteDeadline(deadline)
	return s.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's ResponseWriter.
func (s *StallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
