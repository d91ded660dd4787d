package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
)

// createBody is POST /v1/sandboxes: a name, nether's settings (the same
// keys a sandbox record's config has) and whether to boot it at once.
type createBody struct {
	Name string `json:"name"`
	nexus.Config
	Start bool `json:"start"`
	// Plan is the signed plan (the object nexus plan sign writes) that
	// admits the create and its start.
	Plan json.RawMessage `json:"plan,omitempty"`
	// Secrets are delivered to the guest's /run/secrets at the start.
	Secrets map[string]string `json:"secrets,omitempty"`
}

// planned is the Nexus that admits a request under its plan, if it has
// one, and delivers its secrets, if it has any.
func (s *server) planned(plan json.RawMessage, secrets map[string]string) (*nexus.Nexus, error) {
	n := s.n
	if len(plan) > 0 {
		n = n.WithPlan(plan)
	}
	if len(secrets) > 0 {
		m := make(map[string][]byte, len(secrets))
		for k, v := range secrets {
			m[k] = []byte(v)
		}
		if err := nexus.CheckSecrets(m); err != nil {
			return nil, badRequest("secrets: %v", err)
		}
		n = n.WithSecrets(m)
	}
	return n, nil
}

func (s *server) create(w http.ResponseWriter, r *http.Request) error {
	var b createBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	req := nexus.CreateRequest{Name: b.Name, Config: b.Config}
	if err := nexus.ValidateCreate(req); err != nil {
		return err
	}
	n, err := s.planned(b.Plan, b.Secrets)
	if err != nil {
		return err
	}
	sb, err := n.Create(r.Context(), req)
	if err != nil {
		return err
	}
	if b.Start {
		started, err := n.Start(r.Context(), sb.ID)
		if err != nil {
			// The record exists: say which, so the client can retry the
			// start or remove it.
			if started != nil {
				sb = started
			}
			return &apiError{status: statusOf(nexus.Kind(err)), kind: nexus.Kind(err), err: err, body: errorBody{Sandbox: sb}}
		}
		sb = started
	}
	return writeJSON(w, http.StatusCreated, sb)
}

func (s *server) list(w http.ResponseWriter, r *http.Request) error {
	sbs, err := s.n.List(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sbs)
}

func (s *server) inspect(w http.ResponseWriter, r *http.Request) error {
	d, err := s.n.InspectDetail(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, d)
}

func (s *server) remove(w http.ResponseWriter, r *http.Request) error {
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return badRequest("force=%q: want true or false", v)
		}
		force = f
	}
	if err := s.n.Remove(r.Context(), r.PathValue("ref"), force); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// verb is a lifecycle verb's route: no body, the sandbox as it is after.
func verb(op func(*nexus.Nexus, context.Context, string) (*nexus.Sandbox, error)) func(*server, http.ResponseWriter, *http.Request) error {
	return func(s *server, w http.ResponseWriter, r *http.Request) error {
		// An optional body: the plan that admits a start or a resume.
		var b struct {
			Plan    json.RawMessage   `json:"plan,omitempty"`
			Secrets map[string]string `json:"secrets,omitempty"`
		}
		if err := decode(w, r, &b); err != nil {
			return err
		}
		n, err := s.planned(b.Plan, b.Secrets)
		if err != nil {
			return err
		}
		sb, err := op(n, r.Context(), r.PathValue("ref"))
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, sb)
	}
}

// guestPath is the files routes' ?path=, which must be absolute: the
// agent resolves a relative one against its own working directory, which
// a client cannot see.
func guestPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", badRequest("?path= (the file's absolute path in the guest) is required")
	}
	if !filepath.IsAbs(p) {
		return "", badRequest("path %q: want an absolute guest path", p)
	}
	return p, nil
}

// mustRun refuses a copy into or out of a sandbox that is not running
// before the body is read: an upload of gigabytes should not be stored
// only to be refused. (CopyIn and CopyOut check again.)
func (s *server) mustRun(ctx context.Context, ref string) error {
	sb, err := s.n.Inspect(ctx, ref)
	if err != nil {
		return err
	}
	if sb.State != lifecycle.Running {
		return &lifecycle.IllegalTransitionError{Sandbox: sb.Ref(), State: sb.State, Verb: "cp"}
	}
	return nil
}

// tempDir is a private directory for a file on its way into or out of a
// guest. It is in the state directory, on disk (a large file in a tmpfs
// /tmp would sit in memory) and already owner-only.
func (s *server) tempDir() (string, func(), error) {
	d, err := os.MkdirTemp(s.n.StateDir(), ".api-")
	if err != nil {
		return "", nil, fmt.Errorf("making a temporary directory for the copy: %w", err)
	}
	return d, func() { os.RemoveAll(d) }, nil
}

// putFileAnswer is PUT /v1/sandboxes/{ref}/files.
type putFileAnswer struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	if err := s.mustRun(r.Context(), ref); err != nil {
		return err
	}
	dir, cleanup, err := s.tempDir()
	if err != nil {
		return err
	}
	defer cleanup()
	src := filepath.Join(dir, "in")
	f, err := os.OpenFile(src, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("storing the upload: %w", err)
	}
	n, err := io.Copy(f, r.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storing the upload after %d bytes: %w", n, err)
	}
	if err := s.n.CopyIn(r.Context(), ref, src, path); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, putFileAnswer{Path: path, Size: n})
}

func (s *server) getFile(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	if err := s.mustRun(r.Context(), ref); err != nil {
		return err
	}
	dir, cleanup, err := s.tempDir()
	if err != nil {
		return err
	}
	defer cleanup()
	dst := filepath.Join(dir, "out")
	if err := s.n.CopyOut(r.Context(), ref, path, dst); err != nil {
		return err
	}
	return serveFile(w, r, dst, "application/octet-stream")
}

func (s *server) logs(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	p, err := s.n.Logs(r.Context(), ref)
	if err != nil {
		if nexus.Kind(err) == nexus.KindInternal {
			// Logs fails without a kind only when the sandbox exists and
			// its console log does not (it never ran): a missing resource.
			if _, ierr := s.n.Inspect(r.Context(), ref); ierr == nil {
				return &apiError{status: http.StatusNotFound, kind: nexus.KindNotFound, err: err}
			}
		}
		return err
	}
	return serveFile(w, r, p, "text/plain")
}

// serveFile answers a file's bytes, with ranges (a client can follow a
// log by asking for the bytes after the ones it has).
func serveFile(w http.ResponseWriter, r *http.Request, path, contentType string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", filepath.Base(path), err)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", fi.ModTime(), f)
	return nil
}

// snapshotBody is POST /v1/snapshots.
type snapshotBody struct {
	Sandbox string `json:"sandbox"`
	Name    string `json:"name"`
	// Clean asks for a clean snapshot (nexus snapshot create --clean).
	Clean bool `json:"clean,omitempty"`
}

func (s *server) snapshotCreate(w http.ResponseWriter, r *http.Request) error {
	var b snapshotBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	if b.Sandbox == "" {
		return badRequest("sandbox (the sandbox to snapshot) is required")
	}
	if err := nexus.ValidateSnapshotName(b.Name); err != nil {
		return err
	}
	create := s.n.SnapshotCreate
	if b.Clean {
		create = s.n.SnapshotCreateClean
	}
	snap, err := create(r.Context(), b.Sandbox, b.Name)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, snap)
}

func (s *server) snapshotList(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.n.SnapshotList(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ss)
}

func (s *server) snapshotInspect(w http.ResponseWriter, r *http.Request) error {
	snap, err := s.n.SnapshotInspect(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, snap)
}

func (s *server) snapshotRemove(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("ref")
	if err := s.n.SnapshotRemove(r.Context(), ref); err != nil {
		return err // in use: nexus.KindInUse, 409
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkBody is POST /v1/forks.
type forkBody struct {
	From   string   `json:"from"`
	N      int      `json:"n"`
	Names  []string `json:"names"`
	NoPool bool     `json:"no_pool"`
	RunAs  string   `json:"run_as"`
	// Plan admits the fork (all its children).
	Plan json.RawMessage `json:"plan,omitempty"`
	// Secrets are delivered to every child's /run/secrets.
	Secrets map[string]string `json:"secrets,omitempty"`
}

func (s *server) fork(w http.ResponseWriter, r *http.Request) error {
	var b forkBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	if b.From == "" {
		return badRequest("from (the snapshot or running sandbox to fork) is required")
	}
	req := nexus.ForkRequest{From: b.From, N: b.N, Names: b.Names, NoPool: b.NoPool, RunAs: b.RunAs}
	if err := nexus.ValidateFork(req); err != nil {
		return err
	}
	n, err := s.planned(b.Plan, b.Secrets)
	if err != nil {
		return err
	}
	kids, err := n.Fork(r.Context(), req)
	if err != nil {
		if len(kids) == 0 {
			return err
		}
		// Some came up: they exist and run, and the client must know
		// them to use or remove them.
		return &apiError{status: statusOf(nexus.Kind(err)), kind: nexus.Kind(err), err: err, body: errorBody{Sandboxes: kids}}
	}
	return writeJSON(w, http.StatusCreated, kids)
}

// poolBody is PUT /v1/pools/{snapshot}. Size is required: a missing
// field must not read as 0, which empties the pool.
type poolBody struct {
	Size *int `json:"size"`
}

func (s *server) poolSet(w http.ResponseWriter, r *http.Request) error {
	var b poolBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	if b.Size == nil {
		return badRequest("size (members to keep warm; 0 empties the pool) is required")
	}
	if err := nexus.ValidatePoolSize(*b.Size); err != nil {
		return err
	}
	p, err := s.n.PoolSet(r.Context(), r.PathValue("snapshot"), *b.Size)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p)
}

func (s *server) pools(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.n.Pools(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ps)
}

func (s *server) auditList(w http.ResponseWriter, r *http.Request) error {
	recs, err := s.n.AuditList(r.Context(), r.URL.Query().Get("sandbox"))
	if err != nil {
		return err
	}
	if recs == nil {
		recs = []*store.AuditRecord{}
	}
	return writeJSON(w, http.StatusOK, recs)
}

// auditVerify answers 200 with the chain's head, or 500 naming the
// first record that was altered or removed.
func (s *server) auditVerify(w http.ResponseWriter, r *http.Request) error {
	head, err := s.n.AuditVerify(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, head)
}

func (s *server) tree(w http.ResponseWriter, r *http.Request) error {
	roots, err := s.n.Tree(r.Context(), r.URL.Query().Get("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, roots)
}
