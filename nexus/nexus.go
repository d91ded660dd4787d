// Package nexus is the orchestrator over nether: sandbox records in a
// store, the lifecycle table, content-addressed snapshots, forks with
// provenance, reference-counted removal and warm pools. The nexus CLI and
// its HTTP server are thin layers over this package, which a platform
// written in Go may import directly.
//
// nexus reaches a guest only through nether: each sandbox's nether runs
// detached in the sandbox's own directory under the state directory, and
// nexus drives it over its control socket.
package nexus

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
)

// Options configure a Nexus.
type Options struct {
	// StateDir holds the store, the sandboxes' directories and the
	// snapshots ("" = DefaultStateDir()).
	StateDir string
	// Nether is the nether binary ("" = FindNether()).
	Nether string
	// GuestDir is handed to nether as NETHER_GUEST_DIR ("" = nether's
	// own default).
	GuestDir string
	Log      *slog.Logger
	// ReadyTimeout bounds a boot or restore until the guest's agent
	// answers (default 3 minutes: a cold boot under TCG takes seconds,
	// sixteen at once on two cores much longer).
	ReadyTimeout time.Duration
	// LeaseWait is how long an operation waits for another one on the
	// same record before it fails (default 30 s).
	LeaseWait time.Duration
	// SelfForFill is the nexus binary: a command that exits right after
	// a pool claim tops the pool up in a detached `nexus pool fill`.
	// "" tops up on a goroutine (a long-running server).
	SelfForFill string
	// Runner runs the sandboxes' nethers (nil = nether processes on this
	// host, runner.Local with Nether and GuestDir).
	Runner runner.Runner
}

// Nexus is one state directory's orchestrator.
type Nexus struct {
	dir, nether  string
	run          runner.Runner
	log          *slog.Logger
	db           *store.Store
	readyTimeout time.Duration
	leaseWait    time.Duration
	self         string
	node         string            // this state directory's node id (audit.go)
	plan         []byte            // the signed plan the next operations are admitted under (admit.go)
	admitted     *admittedRun      // what that plan admitted already
	secrets      map[string][]byte // the secrets the next operations deliver (identity.go)
}

// DefaultStateDir is --state-dir's default: NEXUS_STATE_DIR, else
// /var/lib/nexus for root and $XDG_DATA_HOME/nexus (~/.local/share/nexus)
// for anyone else.
func DefaultStateDir() string {
	if d := os.Getenv("NEXUS_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/nexus"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "nexus")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "nexus")
}

// FindNether is the nether binary nexus runs: NEXUS_NETHER, else nether
// next to the running executable, else nether on PATH.
func FindNether() (string, error) {
	if p := os.Getenv("NEXUS_NETHER"); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "nether")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("nether")
	if err != nil {
		return "", errors.New("no nether binary: put it next to nexus, on PATH, or name it with NEXUS_NETHER")
	}
	return p, nil
}

// Open opens (creating) the state directory and reconciles its records
// with the processes that really run.
func Open(ctx context.Context, opt Options) (*Nexus, error) {
	if opt.StateDir == "" {
		opt.StateDir = DefaultStateDir()
	}
	dir, err := filepath.Abs(opt.StateDir)
	if err != nil {
		return nil, err
	}
	if opt.Runner == nil {
		if opt.Nether == "" {
			if opt.Nether, err = FindNether(); err != nil {
				return nil, err
			}
		}
		opt.Runner = &runner.Local{Nether: opt.Nether, GuestDir: opt.GuestDir}
	}
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.ReadyTimeout == 0 {
		opt.ReadyTimeout = 3 * time.Minute
	}
	if opt.LeaseWait == 0 {
		opt.LeaseWait = 30 * time.Second
	}
	for _, d := range []string{dir, filepath.Join(dir, sandboxesDir), filepath.Join(dir, snapshotsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating the state directory: %w", err)
		}
	}
	// A control socket path must fit sun_path.
	if l := len(filepath.Join(dir, sandboxesDir, ulid.Make().String(), runner.ControlSocket)); l > runner.MaxSocketPath {
		return nil, fmt.Errorf("the state directory %s is too deep: a sandbox's control socket would be %d bytes, over the %d a Unix socket path allows; use a shorter --state-dir", dir, l, runner.MaxSocketPath)
	}
	db, err := store.Open(dir)
	if err != nil {
		return nil, err
	}
	n := &Nexus{dir: dir, nether: opt.Nether, run: opt.Runner, log: opt.Log, db: db,
		readyTimeout: opt.ReadyTimeout, leaseWait: opt.LeaseWait, self: opt.SelfForFill}
	if err := n.loadNodeID(); err != nil {
		return nil, err
	}
	if err := n.Reconcile(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// The state directory's layout.
const (
	sandboxesDir = "sandboxes"
	snapshotsDir = "snapshots"
	parkName     = "park"
)

// StateDir is the state directory.
func (n *Nexus) StateDir() string { return n.dir }

func (n *Nexus) sandboxDir(id string) string { return filepath.Join(n.dir, sandboxesDir, id) }

// Errors a caller can tell apart (the CLI maps them to exit codes).
var (
	ErrNotFound = store.ErrNotFound
	ErrBusy     = errors.New("busy")
	// ErrInUse is a snapshot removal refused because sandboxes (or its
	// warm pool) still depend on it.
	ErrInUse = errors.New("in use")
)

// leaseTTL bounds a lease: an operation that outlives it (a nexus that
// hung) loses its hold. Long enough for the slowest operation, a 16-way
// fork on a small machine.
const leaseTTL = 15 * time.Minute

// acquire takes the lease on the sandbox ref for verb, waiting for
// another operation's lease to end, after checking that the table allows
// verb in the sandbox's state. It returns the record as it was.
func (n *Nexus) acquire(ctx context.Context, ref string, verb lifecycle.Verb) (*store.Sandbox, error) {
	deadline := time.Now().Add(n.leaseWait)
	for {
		var sb *store.Sandbox
		busy := ""
		err := n.db.Update(func(tx *store.Tx) error {
			s, err := tx.FindSandbox(ref)
			if err != nil {
				return err
			}
			if s.Lease.Live(time.Now()) {
				busy = fmt.Sprintf("sandbox %s is busy: %s by nexus pid %d (started %s ago)", s.Ref(), s.Lease.Op, s.Lease.Holder,
					time.Until(s.Lease.Expires.Add(-leaseTTL)).Abs().Round(time.Second))
				return nil
			}
			if _, err := lifecycle.Next(s.Ref(), s.State, verb); err != nil {
				return err
			}
			s.Lease = &store.Lease{Op: string(verb), Holder: os.Getpid(), Expires: time.Now().Add(leaseTTL)}
			sb = s
			return tx.PutSandbox(s)
		})
		if err != nil {
			return nil, err
		}
		if sb != nil {
			return sb, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %s", ErrBusy, busy)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", busy, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// release writes the record back without its lease: sb as the operation
// left it (its new state on success).
func (n *Nexus) release(sb *store.Sandbox) error {
	return n.db.Update(func(tx *store.Tx) error {
		cur, err := tx.Sandbox(sb.ID)
		if err != nil {
			return err
		}
		if cur.Lease == nil || cur.Lease.Holder != os.Getpid() {
			return fmt.Errorf("sandbox %s: this nexus lost its lease (it expired, and another nexus took over)", sb.Ref())
		}
		sb.Lease = nil
		return tx.PutSandbox(sb)
	})
}

// finish ends an operation holding sb's lease: on success the record
// moves to to; on failure it stays where it was (or goes to error, when
// the failure left no working nether) and err is returned.
func (n *Nexus) finish(sb *store.Sandbox, to lifecycle.State, err error) error {
	if err == nil {
		sb.State = to
		sb.Reason = ""
	}
	if rerr := n.release(sb); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// Reconcile makes the records true: a sandbox whose nether is gone takes
// the state its final record says (stopped, paused or error); records an
// interrupted nexus left half-made are completed or undone; nethers that
// no record knows are stopped; snapshot files no record knows are removed.
// Every nexus command runs it first.
func (n *Nexus) Reconcile(ctx context.Context) error {
	now := time.Now()
	var orphanDirs []string
	err := n.db.Update(func(tx *store.Tx) error {
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		known := map[int]bool{}
		dirs := map[string]bool{}
		leased := map[string]bool{}
		for _, sb := range sbs {
			dirs[n.sandboxDir(sb.ID)] = true
			if sb.Lease.Live(now) {
				// Its operation may have started a nether whose pid
				// it has not written yet: whatever runs in its
				// directory is that operation's.
				known[sb.PID] = true
				leased[n.sandboxDir(sb.ID)] = true
				continue
			}
			changed := sb.Lease != nil
			if sb.Lease != nil && sb.Lease.Op == opBirth {
				// A fork or pool member whose nexus died before it was
				// born: kept if its nether runs, else undone.
				if !n.alive(sb) {
					if err := n.unbirth(tx, sb); err != nil {
						return err
					}
					continue
				}
			}
			sb.Lease = nil
			live := n.alive(sb)
			if live {
				known[sb.PID] = true
			}
			switch {
			case live && sb.State != lifecycle.Running:
				// A start or resume whose nexus died after the spawn; a
				// wake consumed its park.
				sb.State, sb.Park, changed = lifecycle.Running, "", true
			case !live && sb.State == lifecycle.Running:
				n.settle(sb)
				changed = true
			case !live && sb.State == lifecycle.Paused && !exists(sb.Park):
				// A resume that consumed the park and whose nether died.
				sb.State, sb.Reason, changed = lifecycle.Error, "its park was consumed by a wake that did not finish; see "+filepath.Join(n.sandboxDir(sb.ID), runner.Stderr), true
			}
			if changed {
				if err := tx.PutSandbox(sb); err != nil {
					return err
				}
			}
		}
		for p, cwd := range n.run.Running(filepath.Join(n.dir, sandboxesDir)) {
			if known[p.PID] || leased[cwd] {
				continue
			}
			n.log.Warn("stopping a nether no record knows (its nexus died while starting it)", "pid", p.PID, "dir", cwd)
			n.run.Terminate(p, 10*time.Second)
			if !dirs[cwd] {
				orphanDirs = append(orphanDirs, cwd)
			}
		}
		return n.reconcileSnapshots(tx, now)
	})
	if err != nil {
		return err
	}
	for _, d := range orphanDirs {
		os.RemoveAll(d)
	}
	// Directories of sandboxes whose records are gone (an rm or a fork
	// interrupted after the record went).
	ents, _ := os.ReadDir(filepath.Join(n.dir, sandboxesDir))
	if len(ents) > 0 {
		ids := map[string]bool{}
		n.db.View(func(tx *store.Tx) error {
			sbs, _ := tx.Sandboxes()
			for _, sb := range sbs {
				ids[sb.ID] = true
			}
			return nil
		})
		running := n.run.Running(filepath.Join(n.dir, sandboxesDir))
		busy := map[string]bool{}
		for _, cwd := range running {
			busy[filepath.Base(cwd)] = true
		}
		for _, e := range ents {
			if !ids[e.Name()] && !busy[e.Name()] {
				os.RemoveAll(filepath.Join(n.dir, sandboxesDir, e.Name()))
			}
		}
	}
	return nil
}

// settle is what a sandbox whose nether ended becomes, by its final
// record: parked, stopped, or failed.
func (n *Nexus) settle(sb *store.Sandbox) {
	final := n.lastFinal(sb)
	sb.Final, sb.PID, sb.PIDStart = final, 0, 0
	reason := runner.FinalReason(final)
	switch reason {
	case "park":
		if _, err := os.Stat(filepath.Join(n.sandboxDir(sb.ID), parkName)); err == nil {
			sb.State, sb.Park = lifecycle.Paused, filepath.Join(n.sandboxDir(sb.ID), parkName)
			return
		}
		sb.State, sb.Reason = lifecycle.Error, "it parked, but its park is missing"
	case "shutdown", "poweroff", "sigterm", "sigint", "idle", "max_runtime", "max_cpu":
		sb.State = lifecycle.Stopped
	case "":
		sb.State, sb.Reason = lifecycle.Error, "its nether ended without a final record (killed?); see "+filepath.Join(n.sandboxDir(sb.ID), runner.Stderr)
	default:
		sb.State, sb.Reason = lifecycle.Error, "its nether ended with reason="+reason+"; see "+filepath.Join(n.sandboxDir(sb.ID), runner.Stderr)
	}
}

// newID mints a sandbox or snapshot id: a ULID (sortable by time) with
// fresh random bits in each, not ulid.Make's monotonic ones, so ids
// minted in the same millisecond differ early and short forms (the first
// 16 characters) stay distinct.
func newID() string { return ulid.MustNew(ulid.Now(), rand.Reader).String() }

func exists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}
