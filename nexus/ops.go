package nexus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
)

// Sandbox and Snapshot are the records nexus keeps, as its callers see
// them.
type (
	Sandbox  = store.Sandbox
	Snapshot = store.Snapshot
	Config   = store.Config
)

// CreateRequest is `nexus create`.
type CreateRequest struct {
	Name   string
	Config Config
}

// checkName refuses a name that could be taken for an id or a path.
func checkName(name string) error {
	if name == "" {
		return nil
	}
	if len(name) > 63 {
		return fmt.Errorf("name %q is longer than 63 bytes", name)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || (i > 0 && (c == '-' || c == '_' || c == '.'))
		if !ok {
			return fmt.Errorf("name %q: use letters, digits and - _ . (not first)", name)
		}
	}
	return nil
}

// Create makes a sandbox record in state created. Nothing runs yet.
func (n *Nexus) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	if err := ValidateCreate(req); err != nil {
		return nil, err
	}
	if req.Config.Rootfs != "" && req.Config.Rootfs != runner.RootfsBusybox {
		req.Config.Rootfs = filepath.Clean(req.Config.Rootfs)
	}
	now := time.Now().UTC()
	sb := &Sandbox{ID: newID(), Name: req.Name, State: lifecycle.Created, Config: req.Config, Created: now}
	sb.Hostname = hostnameFor(sb)
	if sb.Config.HasDisk() {
		// Created by nether at the first start, kept across stop and
		// start, removed with the sandbox's directory.
		sb.Disk = filepath.Join(n.sandboxDir(sb.ID), diskName)
	}
	if _, err := n.admit("create", sb, func() (imageOf, error) { return n.bootImage(sb.Config) }, nil); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(n.sandboxDir(sb.ID), 0o700); err != nil {
		return nil, err
	}
	if err := n.db.Update(func(tx *store.Tx) error { return tx.PutSandbox(sb) }); err != nil {
		os.RemoveAll(n.sandboxDir(sb.ID))
		return nil, err
	}
	n.audit(evCreate, sb, "", nil)
	return sb, nil
}

// hostnameFor is a sandbox's guest hostname: its name when that is a
// DNS label, else sandbox-<the id's tail>.
func hostnameFor(sb *Sandbox) string {
	if sb.Name != "" && validHostname(sb.Name) {
		return sb.Name
	}
	return "sandbox-" + strings.ToLower(sb.ID[len(sb.ID)-8:])
}

// validHostname asks nether's own configuration parser, so nexus never
// hands nether a hostname it would refuse.
func validHostname(h string) bool {
	return runner.CheckHostname(h) == nil
}

// The persistent disk's file in a sandbox's directory: a created
// sandbox's own ext4 image, or a fork's copy-on-write layer over its
// snapshot's disk (the name nether gives a restore's layer when its
// nether.conf has no disk =, internal/session.ForkDiskLayer).
const (
	diskName     = "disk.img"
	forkDiskName = runner.ForkDisk
)

// diskPath is the host file of sb's persistent disk ("" = none).
func (n *Nexus) diskPath(sb *Sandbox) string {
	switch {
	case sb.Disk != "":
		return sb.Disk
	case sb.Config.HasDisk():
		return filepath.Join(n.sandboxDir(sb.ID), diskName)
	}
	return ""
}

// launch writes the sandbox's nether.conf and starts its nether, then
// waits until the guest's agent answers.
//
// Every launch is a new boot of the sandbox: a boot id of its own and an
// identity token for it (identity.go), and the secrets this operation
// was given, which nether reads from an inherited memory file.
func (n *Nexus) launch(ctx context.Context, sb *Sandbox, restoreFrom string) error {
	dir := n.sandboxDir(sb.ID)
	wake := restoreFrom != "" && restoreFrom == sb.Park
	boot := newID()
	s, err := n.launchSettings(sb, restoreFrom, boot)
	if err != nil {
		return err
	}
	var secrets map[string][]byte
	if len(n.secrets) > 0 {
		secrets = n.secrets
	}
	// Where this nether's output begins: the files keep every earlier
	// session's too.
	from := n.run.Mark(dir)
	p, err := n.run.Launch(dir, s, secrets)
	if err != nil {
		return err
	}
	sb.PID, sb.PIDStart, sb.Boot = p.PID, p.Start, boot
	// The pid goes into the record at once: a nexus that dies from here
	// on leaves a nether its successor knows.
	if err := n.db.Update(func(tx *store.Tx) error {
		cur, err := tx.Sandbox(sb.ID)
		if err != nil {
			return err
		}
		cur.PID, cur.PIDStart, cur.Boot = p.PID, p.Start, boot
		return tx.PutSandbox(cur)
	}); err != nil {
		n.run.Terminate(p, 10*time.Second)
		return err
	}
	if err := n.waitReady(ctx, sb, from); err != nil {
		return err
	}
	n.delivered(sb, wake)
	return nil
}

// EndedError is a launch whose nether ended before its guest came up.
type EndedError struct {
	Sandbox string
	// Final is the final usage record that nether printed ("" if it
	// printed none); Cause is the last error it logged, or where to
	// look.
	Final, Cause string
}

func (e *EndedError) Error() string {
	if r := runner.FinalReason(e.Final); r != "" {
		return fmt.Sprintf("sandbox %s: its nether ended while starting (reason=%s): %s", e.Sandbox, r, e.Cause)
	}
	return fmt.Sprintf("sandbox %s: its nether ended while starting: %s", e.Sandbox, e.Cause)
}

// Failed reports whether the nether said it failed (reason=error, or
// its guest crashed), rather than ended without a word.
func (e *EndedError) Failed() bool { return runner.FailedReason(runner.FinalReason(e.Final)) }

// waitReady waits until the sandbox's agent is connected, its nether
// ends (an EndedError, with what it said from from on) or the ready
// timeout passes.
func (n *Nexus) waitReady(ctx context.Context, sb *Sandbox, from runner.Mark) error {
	ctx, cancel := context.WithTimeout(ctx, n.readyTimeout)
	defer cancel()
	dir := n.sandboxDir(sb.ID)
	for {
		if !n.alive(sb) {
			return &EndedError{Sandbox: sb.Ref(), Final: n.run.Final(dir, from), Cause: n.run.Why(dir, from)}
		}
		if c, err := n.run.Dial(ctx, dir); err == nil {
			up := c.Info().AgentConnected()
			c.Close()
			if up {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: its guest did not come up within %s (see %s)", sb.Ref(), n.readyTimeout, filepath.Join(dir, runner.Stderr))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Start boots a created or stopped sandbox.
func (n *Nexus) Start(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := n.acquire(ctx, ref, lifecycle.Start)
	if err != nil {
		return nil, err
	}
	if _, err := n.admit("start", sb, func() (imageOf, error) { return n.bootImage(sb.Config) }, nil); err != nil {
		return sb, n.finish(sb, "", err)
	}
	err = n.launch(ctx, sb, "")
	if err != nil {
		n.abandon(sb)
		var ended *EndedError
		if errors.As(err, &ended) && ended.Failed() {
			// Its nether said why it could not run (a disk it
			// cannot use, say): every start would fail the same way
			// until that is mended.
			sb.State, sb.Reason, sb.Final = lifecycle.Error, ended.Cause, ended.Final
		}
	}
	n.audit(evBoot, sb, "", err)
	return sb, n.finish(sb, lifecycle.Running, err)
}

// abandon stops a nether that failed to come up and says why in the
// record, which stays in its state.
func (n *Nexus) abandon(sb *Sandbox) {
	n.terminate(sb, 10*time.Second)
	sb.PID, sb.PIDStart = 0, 0
}

// waitExit waits for the sandbox's nether to end.
func (n *Nexus) waitExit(ctx context.Context, sb *Sandbox, d time.Duration) error {
	deadline := time.Now().Add(d)
	for n.alive(sb) {
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: its nether did not end within %s", sb.Ref(), d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Stop shuts a running sandbox's guest down cleanly.
func (n *Nexus) Stop(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := n.acquire(ctx, ref, lifecycle.Stop)
	if err != nil {
		return nil, err
	}
	err = n.stop(ctx, sb)
	n.audit(evStop, sb, "", err)
	return sb, n.finish(sb, lifecycle.Stopped, err)
}

func (n *Nexus) stop(ctx context.Context, sb *Sandbox) error {
	err := n.verb(ctx, sb, func(c runner.Conn) error { return c.Shutdown(ctx) })
	if err != nil && n.alive(sb) {
		// A wedged control socket: SIGTERM settles it all the same.
		n.log.Warn("__shutdown__ failed; sending SIGTERM", "sandbox", sb.Ref(), "err", err)
		n.terminate(sb, 30*time.Second)
	}
	if err := n.waitExit(ctx, sb, time.Minute); err != nil {
		n.terminate(sb, 10*time.Second)
	}
	sb.Final = n.lastFinal(sb)
	sb.PID, sb.PIDStart = 0, 0
	return nil
}

// Pause parks a running sandbox: its memory goes to a park artifact and
// its processes end, so a paused sandbox costs nothing but disk.
func (n *Nexus) Pause(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := n.acquire(ctx, ref, lifecycle.Pause)
	if err != nil {
		return nil, err
	}
	park := filepath.Join(n.sandboxDir(sb.ID), parkName)
	os.RemoveAll(park) // a consumed park's leftovers
	err = n.verb(ctx, sb, func(c runner.Conn) error { _, err := c.Park(ctx, parkName); return err })
	if err == nil {
		err = n.waitExit(ctx, sb, time.Minute)
	}
	n.audit(evPark, sb, "", err)
	if err != nil {
		return sb, n.finish(sb, "", err)
	}
	sb.Park, sb.Final, sb.PID, sb.PIDStart = park, n.lastFinal(sb), 0, 0
	return sb, n.finish(sb, lifecycle.Paused, nil)
}

// Resume wakes a paused sandbox from its park.
func (n *Nexus) Resume(ctx context.Context, ref string) (*Sandbox, error) {
	sb, err := n.acquire(ctx, ref, lifecycle.Resume)
	if err != nil {
		return nil, err
	}
	if !exists(sb.Park) {
		sb.State, sb.Reason = lifecycle.Error, "its park "+sb.Park+" is gone"
		n.release(sb)
		return sb, fmt.Errorf("sandbox %s: its park %s is gone; it is now in error", sb.Ref(), sb.Park)
	}
	if err := n.restoreSize(&sb.Config, sb.Park); err != nil {
		return sb, n.finish(sb, "", err)
	}
	if _, err := n.admit("resume", sb, func() (imageOf, error) { return n.restoreImage(sb.Park) }, nil); err != nil {
		return sb, n.finish(sb, "", err)
	}
	err = n.launch(ctx, sb, sb.Park)
	n.audit(evWake, sb, "", err)
	if err != nil {
		n.abandon(sb)
		if !exists(sb.Park) {
			// The wake consumed the park: there is no going back.
			sb.State, sb.Reason = lifecycle.Error, err.Error()
			n.release(sb)
			return sb, err
		}
		return sb, n.finish(sb, "", err)
	}
	sb.Park = ""
	return sb, n.finish(sb, lifecycle.Running, nil)
}

// Remove deletes a sandbox: its record, its directory, its references.
// A running one needs force, which stops it first.
func (n *Nexus) Remove(ctx context.Context, ref string, force bool) error {
	verb := lifecycle.Remove
	if force {
		verb = lifecycle.RemoveF
	}
	sb, err := n.acquire(ctx, ref, verb)
	if err != nil {
		return err
	}
	if n.alive(sb) {
		n.terminate(sb, 30*time.Second)
	}
	err = n.db.Update(func(tx *store.Tx) error {
		if err := n.dropRefs(tx, sb.ID); err != nil {
			return err
		}
		return tx.DeleteSandbox(sb)
	})
	n.audit(evRemove, sb, "", err)
	if err != nil {
		n.release(sb)
		return err
	}
	return os.RemoveAll(n.sandboxDir(sb.ID))
}

// dropRefs removes a sandbox from every snapshot's references.
func (n *Nexus) dropRefs(tx *store.Tx, id string) error {
	snaps, err := tx.Snapshots()
	if err != nil {
		return err
	}
	for _, s := range snaps {
		keep := s.Refs[:0]
		for _, r := range s.Refs {
			if r != id {
				keep = append(keep, r)
			}
		}
		if len(keep) != len(s.Refs) {
			s.Refs = keep
			if err := tx.PutSnapshot(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// List returns every sandbox that exists (one being born is not shown
// until it is), oldest first.
func (n *Nexus) List(ctx context.Context) ([]*Sandbox, error) {
	out := []*Sandbox{} // empty, not nil: JSON [] for the CLI and the API
	err := n.db.View(func(tx *store.Tx) error {
		sbs, err := tx.Sandboxes()
		for _, sb := range sbs {
			if sb.Lease != nil && sb.Lease.Op == opBirth {
				continue
			}
			out = append(out, sb)
		}
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// Inspect returns one sandbox.
func (n *Nexus) Inspect(ctx context.Context, ref string) (*Sandbox, error) {
	var sb *Sandbox
	err := n.db.View(func(tx *store.Tx) error {
		var err error
		sb, err = tx.FindSandbox(ref)
		return err
	})
	return sb, err
}

// running resolves ref to a running sandbox, for exec, cp and the like.
func (n *Nexus) running(ctx context.Context, ref, what string) (*Sandbox, error) {
	sb, err := n.Inspect(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.State != lifecycle.Running {
		return nil, &lifecycle.IllegalTransitionError{Sandbox: sb.Ref(), State: sb.State, Verb: lifecycle.Verb(what)}
	}
	return sb, nil
}

// Exec runs a shell command in a running sandbox, streaming its output
// to out, and returns its exit code. The command is a guest shell line
// only: one nether would read as its own control verb is refused as a bad
// request (client.Shell), so exec can never snapshot, park, stop or move
// files behind nexus's back.
func (n *Nexus) Exec(ctx context.Context, ref, command string, out io.Writer) (int, error) {
	sb, err := n.running(ctx, ref, "exec")
	if err != nil {
		return -1, err
	}
	c, err := n.dial(ctx, sb)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	code, err := c.Exec(ctx, command, out)
	return code, verbError(sb, err)
}

// CopyIn copies the host file src into a running sandbox at guestPath.
func (n *Nexus) CopyIn(ctx context.Context, ref, src, guestPath string) error {
	if err := checkGuestPath(guestPath); err != nil {
		return err
	}
	sb, err := n.running(ctx, ref, "cp")
	if err != nil {
		return err
	}
	// nether's transfers resolve host paths inside its launch directory:
	// the file passes through a private name there.
	tmp := ".cp-" + newID()
	dst := filepath.Join(n.sandboxDir(sb.ID), tmp)
	if err := copyFile(src, dst); err != nil {
		return err
	}
	defer os.Remove(dst)
	return transferError(n.verb(ctx, sb, func(c runner.Conn) error { return c.Put(ctx, tmp, guestPath) }))
}

// CopyOut copies guestPath out of a running sandbox into the host file dst.
func (n *Nexus) CopyOut(ctx context.Context, ref, guestPath, dst string) error {
	if err := checkGuestPath(guestPath); err != nil {
		return err
	}
	sb, err := n.running(ctx, ref, "cp")
	if err != nil {
		return err
	}
	tmp := ".cp-" + newID()
	src := filepath.Join(n.sandboxDir(sb.ID), tmp)
	defer os.Remove(src)
	if err := n.verb(ctx, sb, func(c runner.Conn) error { return c.Get(ctx, guestPath, tmp) }); err != nil {
		return transferError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return copyFile(src, dst)
	}
	return nil
}

// ErrTooLarge marks a transfer over the sandbox's max_transfer_bytes.
var ErrTooLarge = errors.New("too large")

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

// Logs is the path of a sandbox's console log.
func (n *Nexus) Logs(ctx context.Context, ref string) (string, error) {
	sb, err := n.Inspect(ctx, ref)
	if err != nil {
		return "", err
	}
	p := filepath.Join(n.sandboxDir(sb.ID), runner.ConsoleLog)
	if !exists(p) {
		return "", fmt.Errorf("sandbox %s has no console log yet (it never ran)", sb.Ref())
	}
	return p, nil
}

// IsIllegal says whether err is an illegal transition.
func IsIllegal(err error) bool {
	var ite *lifecycle.IllegalTransitionError
	return errors.As(err, &ite)
}
