// Package api is nexus's HTTP API: the operations of package nexus as
// JSON over HTTP, for platforms written in any language. `nexus serve`
// serves it on an owner-only Unix socket (Serve); a Go program that has
// its own server can mount NewHandler instead and must then do its own
// access control. openapi.yaml, served at GET /v1/openapi.yaml, documents
// every route, body and error.
package api

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/store"
)

// OpenAPI is the API's OpenAPI 3.0 document.
//
//go:embed openapi.yaml
var OpenAPI []byte

// maxJSON bounds a JSON request body: every body the API takes is a few
// fields, and a bound keeps a confused client from filling memory.
const maxJSON = 1 << 20

// Error kinds of the API's own, beside nexus.Kind's.
const (
	kindInUse     = nexus.KindInUse
	kindForbidden = "forbidden"          // a client of another user
	kindMethod    = "method_not_allowed" // a known path, another method
)

// statusOf is the HTTP status of an error kind. busy is 409, like the
// other conflicts with the record's current state: a client tells them
// apart by kind, and may retry busy.
func statusOf(kind string) int {
	switch kind {
	case nexus.KindIllegal, nexus.KindBusy, nexus.KindNameTaken, kindInUse:
		return http.StatusConflict
	case nexus.KindNotFound:
		return http.StatusNotFound
	case nexus.KindBadInput:
		return http.StatusBadRequest
	case kindForbidden, nexus.KindRefused:
		return http.StatusForbidden
	case kindMethod:
		return http.StatusMethodNotAllowed
	case nexus.KindTooLarge:
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}

// errorBody is every error answer.
type errorBody struct {
	Error string `json:"error"`
	Kind  string `json:"kind"`
	// Sandbox is the record a create with start made before its start
	// failed: it exists (created), and the client may start or remove it.
	Sandbox *nexus.Sandbox `json:"sandbox,omitempty"`
	// Sandboxes are the children of a fork that came up when others did
	// not: they exist and run.
	Sandboxes []*nexus.Sandbox `json:"sandboxes,omitempty"`
}

// apiError is an error with the status and kind to answer it with, for
// what the API itself refuses (a malformed body) and for errors whose
// kind the API knows better than nexus.Kind (a snapshot in use).
type apiError struct {
	status int
	kind   string
	err    error
	body   errorBody // extra fields
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

func badRequest(format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, kind: nexus.KindBadInput, err: fmt.Errorf(format, args...)}
}

// server is one handler's state.
type server struct {
	n   *nexus.Nexus
	log *slog.Logger
	db  *store.Store // nil: reconciliation is never safe to run, so it is skipped
	mux *http.ServeMux

	// spawning is held shared by requests that make sandbox directories
	// or start nethers, and taken exclusively (TryLock) to reconcile:
	// Reconcile stops nethers no record names and removes sandbox
	// directories no record names, and both are briefly true of what a
	// create, start, resume, fork or pool set is in the middle of making.
	spawning sync.RWMutex
}

// route is one operation: a Go 1.22 ServeMux pattern and its handler.
type route struct {
	method, path string
	handle       func(s *server, w http.ResponseWriter, r *http.Request) error
	// spawns: the operation makes sandbox directories or nethers (see
	// server.spawning).
	spawns bool
	// static: the answer does not depend on the records, so they are
	// not reconciled first.
	static bool
}

// routes is the API. The OpenAPI document must describe exactly these
// (TestOpenAPIMatchesRoutes).
var routes = []route{
	{method: "POST", path: "/v1/sandboxes", handle: (*server).create, spawns: true},
	{method: "GET", path: "/v1/sandboxes", handle: (*server).list},
	{method: "GET", path: "/v1/sandboxes/{ref}", handle: (*server).inspect},
	{method: "DELETE", path: "/v1/sandboxes/{ref}", handle: (*server).remove},
	{method: "POST", path: "/v1/sandboxes/{ref}/start", handle: verb((*nexus.Nexus).Start), spawns: true},
	{method: "POST", path: "/v1/sandboxes/{ref}/stop", handle: verb((*nexus.Nexus).Stop)},
	{method: "POST", path: "/v1/sandboxes/{ref}/pause", handle: verb((*nexus.Nexus).Pause)},
	{method: "POST", path: "/v1/sandboxes/{ref}/resume", handle: verb((*nexus.Nexus).Resume), spawns: true},
	{method: "POST", path: "/v1/sandboxes/{ref}/exec", handle: (*server).exec},
	{method: "PUT", path: "/v1/sandboxes/{ref}/files", handle: (*server).putFile},
	{method: "GET", path: "/v1/sandboxes/{ref}/files", handle: (*server).getFile},
	{method: "GET", path: "/v1/sandboxes/{ref}/logs", handle: (*server).logs},
	{method: "POST", path: "/v1/snapshots", handle: (*server).snapshotCreate},
	{method: "GET", path: "/v1/snapshots", handle: (*server).snapshotList},
	{method: "GET", path: "/v1/snapshots/{ref}", handle: (*server).snapshotInspect},
	{method: "DELETE", path: "/v1/snapshots/{ref}", handle: (*server).snapshotRemove},
	{method: "POST", path: "/v1/forks", handle: (*server).fork, spawns: true},
	{method: "PUT", path: "/v1/pools/{snapshot}", handle: (*server).poolSet, spawns: true},
	{method: "GET", path: "/v1/pools", handle: (*server).pools},
	{method: "GET", path: "/v1/tree", handle: (*server).tree},
	{method: "GET", path: "/v1/audit", handle: (*server).auditList},
	{method: "GET", path: "/v1/audit/verify", handle: (*server).auditVerify},
	{method: "GET", path: "/v1/openapi.yaml", handle: (*server).openapi, static: true},
}

// NewHandler serves the API for n. It does no access control: Serve
// checks the peer's uid; a program that mounts the handler elsewhere
// must check its clients itself.
func NewHandler(n *nexus.Nexus, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{n: n, log: log, mux: http.NewServeMux()}
	if db, err := store.Open(n.StateDir()); err == nil {
		s.db = db
	} else {
		log.Warn("nexus api: the store cannot be read to tell whether reconciling is safe; records are reconciled only by other nexus commands", "err", err)
	}
	for _, rt := range routes {
		s.mux.HandleFunc(rt.method+" "+rt.path, s.wrap(rt))
	}
	return s
}

// ServeHTTP answers the ServeMux's own refusals (no such path, another
// method) in the API's JSON error shape; everything else goes to the mux.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	t0 := time.Now()
	defer func() {
		s.log.Info("nexus api", "method", r.Method, "path", r.URL.Path, "status", sw.status, "took", time.Since(t0).Round(time.Microsecond))
	}()
	if _, pattern := s.mux.Handler(r); pattern == "" {
		// The mux answers 404 or 405 (with Allow) in text; keep its
		// status and headers, say it in JSON.
		rec := &headerRecorder{h: http.Header{}}
		s.mux.ServeHTTP(rec, r)
		if allow := rec.h.Get("Allow"); allow != "" {
			sw.Header().Set("Allow", allow)
		}
		switch rec.status {
		case http.StatusMethodNotAllowed:
			writeError(sw, &apiError{status: rec.status, kind: kindMethod,
				err: fmt.Errorf("%s %s: method not allowed (allowed: %s)", r.Method, r.URL.Path, rec.h.Get("Allow"))})
		case http.StatusNotFound:
			writeError(sw, &apiError{status: rec.status, kind: nexus.KindNotFound,
				err: fmt.Errorf("%s %s: no such route (see GET /v1/openapi.yaml)", r.Method, r.URL.Path)})
		default:
			// A redirect or anything else the mux decided: pass it on.
			for k, v := range rec.h {
				sw.Header()[k] = v
			}
			sw.WriteHeader(rec.status)
			sw.Write(rec.body)
		}
		return
	}
	s.mux.ServeHTTP(sw, r)
}

// wrap runs a route: reconcile first (unless static), hold spawning
// (if it spawns), write the handler's error.
func (s *server) wrap(rt route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !rt.static {
			s.reconcile(r)
		}
		if rt.spawns {
			s.spawning.RLock()
			defer s.spawning.RUnlock()
		}
		if err := rt.handle(s, w, r); err != nil {
			writeError(w, err)
		}
	}
}

// reconcile makes the records true before a request is answered, as every
// nexus command does when it starts: a sandbox whose nether ended on its
// own (idle timeout, max runtime, a crash) stops showing as running. It
// is skipped, not waited for, while this server or any nexus is making a
// sandbox (a live lease): Reconcile would take the nether being born for
// an orphan. The request is then answered from the records as they are,
// and every operation re-checks its own record under its lease anyway.
func (s *server) reconcile(r *http.Request) {
	if s.db == nil || !s.spawning.TryLock() {
		return
	}
	defer s.spawning.Unlock()
	if s.leased() {
		return
	}
	if err := s.n.Reconcile(r.Context()); err != nil {
		s.log.Warn("nexus api: reconciling the records before a request", "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

// leased says whether any sandbox record holds a live lease (or the
// store cannot tell, which counts as yes).
func (s *server) leased() bool {
	live := false
	err := s.db.View(func(tx *store.Tx) error {
		sbs, err := tx.Sandboxes()
		now := time.Now()
		for _, sb := range sbs {
			if sb.Lease.Live(now) {
				live = true
			}
		}
		return err
	})
	return live || err != nil
}

// writeError answers err as JSON with the status its kind maps to.
func writeError(w http.ResponseWriter, err error) {
	body := errorBody{Error: err.Error(), Kind: nexus.Kind(err)}
	status := statusOf(body.Kind)
	var ae *apiError
	if errors.As(err, &ae) {
		extra := ae.body
		body.Kind, status = ae.kind, ae.status
		body.Sandbox, body.Sandboxes = extra.Sandbox, extra.Sandboxes
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the answer: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// decode reads a JSON request body into v: at most maxJSON bytes, one
// object, no field v does not have. An empty body is {}: the routes'
// required fields are checked by the handlers.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxJSON)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err == nil {
		// One object and nothing after it: trailing data is a client
		// that framed its body wrong, not something to ignore.
		var extra json.RawMessage
		if derr := dec.Decode(&extra); !errors.Is(derr, io.EOF) {
			err = errors.New("data after the JSON object")
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{status: http.StatusRequestEntityTooLarge, kind: nexus.KindBadInput,
				err: fmt.Errorf("the JSON body is over %d bytes", mbe.Limit)}
		}
		// encoding/json names the field: `json: unknown field "x"`.
		return badRequest("the body is not this route's JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// statusWriter records the status for the log, and unwraps for
// http.ResponseController (exec flushes through it).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// headerRecorder catches what the mux would answer on its own.
type headerRecorder struct {
	h      http.Header
	status int
	body   []byte
}

func (r *headerRecorder) Header() http.Header { return r.h }
func (r *headerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *headerRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

func (s *server) openapi(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(OpenAPI)
	return err
}
