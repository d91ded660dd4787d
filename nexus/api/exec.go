package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// The trailers of a streamed exec. The exit code can only be known after
// the output, so it comes after the body; a client that cannot read
// trailers asks for ?format=json instead.
const (
	// TrailerExit is the command's exit status. Its absence means the
	// command's end is unknown: the exchange failed after output began
	// (TrailerError says why).
	TrailerExit = "Nexus-Exit-Code"
	// TrailerError is why a streamed exec failed after its output began.
	TrailerError = "Nexus-Error"
)

// execBody is POST /v1/sandboxes/{ref}/exec.
type execBody struct {
	Command string `json:"command"`
}

func (s *server) exec(w http.ResponseWriter, r *http.Request) error {
	var b execBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	if strings.TrimSpace(b.Command) == "" {
		return badRequest("command (a shell command line) is required")
	}
	switch f := r.URL.Query().Get("format"); f {
	case "", "stream":
		return s.execStream(w, r, b.Command)
	case "json":
		return s.execJSON(w, r, b.Command)
	default:
		return badRequest("format=%q: want stream (the default) or json", f)
	}
}

// execStream sends the output as the guest produces it. The status line
// waits for the first byte (or the end): until then a failure (no such
// sandbox, not running, its nether not answering) is an ordinary JSON
// error with its status; after it, the failure can only be a trailer.
func (s *server) execStream(w http.ResponseWriter, r *http.Request, command string) error {
	out := &streamWriter{w: w, rc: http.NewResponseController(w)}
	code, err := s.n.Exec(r.Context(), r.PathValue("ref"), command, out)
	if err != nil {
		if !out.started {
			return err
		}
		w.Header().Set(TrailerError, oneLine(err.Error()))
		s.log.Warn("nexus api: exec failed after its output began", "sandbox", r.PathValue("ref"), "err", err)
		return nil
	}
	out.begin()
	w.Header().Set(TrailerExit, strconv.Itoa(code))
	return nil
}

func (s *server) execJSON(w http.ResponseWriter, r *http.Request, command string) error {
	a, err := s.n.ExecBuffered(r.Context(), r.PathValue("ref"), command)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, a)
}

// streamWriter starts the response on the first write and flushes every
// write, so the client sees output as the guest makes it.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

// begin sends the status line, declaring the trailers (they must be
// declared before the header is written to be sent at all).
func (o *streamWriter) begin() {
	if o.started {
		return
	}
	o.started = true
	h := o.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Trailer", TrailerExit+", "+TrailerError)
	o.w.WriteHeader(http.StatusOK)
}

func (o *streamWriter) Write(p []byte) (int, error) {
	o.begin()
	n, err := o.w.Write(p)
	if err != nil {
		return n, fmt.Errorf("sending exec output: %w", err)
	}
	if err := o.rc.Flush(); err != nil {
		return n, fmt.Errorf("flushing exec output: %w", err)
	}
	return n, nil
}

// oneLine makes an error message fit a header value.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
