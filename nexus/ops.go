package nexus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
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
	if req.Config.Rootfs != "" && req.Config.Rootfs != conf.RootfsBusybox {
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
	_, err := conf.Parse(strings.NewReader("hostname = "+h+"\n"), "hostname", os.TempDir())
	return err == nil
}

// The persistent disk's file in a sandbox's directory: a created
// sandbox's own ext4 image, or a fork's copy-on-write layer over its
// snapshot's disk (the name nether gives a restore's layer when its
// nether.conf has no disk =, internal/session.ForkDiskLayer).
const (
	diskName     = "disk.img"
	forkDiskName = "disk.qcow2"
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

// confText is the nether.conf of a sandbox's next session; restoreFrom
// is the artifact it restores ("" boots).
//
// The disk: a boot names the sandbox's own disk file (created by nether
// the first time, the same file on every later start, so /data survives
// stop and start). A restore never names one: the artifact says which
// disk its memory expects, and nether's default is right for both kinds
// of restore, where disk = could only be wrong: a fork gets a new layer
// in its launch directory, which is the child's own directory (never the
// parent's disk), and a wake continues the disk it parked with.
//
// run_as and rootfs are written for a restore too: rootfs because the
// artifact's fingerprint holds the image it was captured on, run_as
// because it is the same as the artifact's (nether accepts that) or a
// fork's narrowing of it.
func (n *Nexus) confText(sb *Sandbox, restoreFrom string) string {
	c := sb.Config
	var b strings.Builder
	line := func(k string, v any) { fmt.Fprintf(&b, "%s = %v\n", k, v) }
	line("control_socket", filepath.Join(n.sandboxDir(sb.ID), sockName))
	line("sandbox_id", sb.ID)
	line("hostname", sb.Hostname)
	if c.CPUs > 0 {
		line("cpus", c.CPUs)
	}
	if c.RAMMB > 0 {
		line("ram_mb", c.RAMMB)
	}
	if c.Net {
		line("net", 1)
	}
	if c.NetAllow != "" {
		line("net_allow", c.NetAllow)
	}
	if c.NetBlock != "" {
		line("net_block", c.NetBlock)
	}
	if c.GPU {
		line("gpu", 1)
	}
	for _, kv := range []struct {
		k string
		v int64
	}{{"max_runtime_s", c.MaxRuntimeS}, {"max_cpu_s", c.MaxCPUS}, {"idle_timeout_s", c.IdleTimeoutS}} {
		if kv.v > 0 {
			line(kv.k, kv.v)
		}
	}
	if c.AppPort > 0 {
		// The data plane's host end: without a socket the port reaches
		// nothing (nether splices each connection to it to the port).
		line("app_port", c.AppPort)
		line("data_socket", filepath.Join(n.sandboxDir(sb.ID), dataSockName))
	}
	if c.EgressPort > 0 {
		line("egress_port", c.EgressPort)
	}
	if c.Rootfs != "" {
		line("rootfs", c.Rootfs)
	}
	if c.RunAs != "" {
		line("run_as", c.RunAs)
	}
	if restoreFrom == "" {
		if disk := n.diskPath(sb); disk != "" {
			line("disk", disk)
			line("disk_size_mb", c.DiskSizeMB)
		}
	} else {
		line("restore", 1)
		line("restore_from", restoreFrom)
	}
	return b.String()
}

// checkConfig refuses settings nether would refuse, before a record is
// made: each one goes through nether's own parser, alone, so the rules
// and the words are nether's (internal/conf) and the message names the
// setting, not a line of a file nobody wrote.
func checkConfig(c Config) error {
	type setting struct {
		key string
		v   any
	}
	var set []setting
	for _, kv := range []struct {
		key string
		v   int64
	}{{"cpus", int64(c.CPUs)}, {"ram_mb", int64(c.RAMMB)}, {"max_runtime_s", c.MaxRuntimeS}, {"max_cpu_s", c.MaxCPUS},
		{"idle_timeout_s", c.IdleTimeoutS}, {"app_port", int64(c.AppPort)}, {"egress_port", int64(c.EgressPort)},
		{"disk_size_mb", int64(c.DiskSizeMB)}} {
		if kv.v != 0 {
			set = append(set, setting{kv.key, kv.v})
		}
	}
	for _, kv := range []struct{ key, v string }{{"net_allow", c.NetAllow}, {"net_block", c.NetBlock}, {"rootfs", c.Rootfs}, {"run_as", c.RunAs}} {
		if kv.v == "" {
			continue
		}
		// One setting is one line of nether.conf: nothing in a value may
		// end it or open a comment in it.
		if i := strings.IndexFunc(kv.v, func(r rune) bool { return unicode.IsControl(r) }); i >= 0 {
			return fmt.Errorf("%s %q: contains a control character", kv.key, kv.v)
		}
		if strings.TrimSpace(kv.v) != kv.v {
			return fmt.Errorf("%s %q: has blanks around it", kv.key, kv.v)
		}
		if strings.Contains(kv.v, " #") || strings.Contains(kv.v, "\t#") {
			return fmt.Errorf("%s %q: a # after a blank starts a comment in nether.conf", kv.key, kv.v)
		}
		if kv.key == "rootfs" && kv.v != conf.RootfsBusybox && !filepath.IsAbs(kv.v) {
			return fmt.Errorf("rootfs %q: want an absolute path of a root image, or busybox (nether runs in the sandbox's own directory, where a relative path means nothing)", kv.v)
		}
		set = append(set, setting{kv.key, kv.v})
	}
	for _, s := range set {
		line := fmt.Sprintf("%s = %v\n", s.key, s.v)
		if _, err := conf.Parse(strings.NewReader(line), "settings", os.TempDir()); err != nil {
			return &settingError{key: s.key, value: fmt.Sprint(s.v), err: err}
		}
	}
	return nil
}

// settingError is a setting nether's parser refused: it names the setting
// and its value, then says what nether said, without the file and line of
// the one-line nether.conf it was checked as.
type settingError struct {
	key, value string
	err        error
}

func (e *settingError) Error() string {
	var ce *conf.Error
	if errors.As(e.err, &ce) && ce.Msg != "" {
		return fmt.Sprintf("%s %s: %s", e.key, e.value, ce.Msg)
	}
	return fmt.Sprintf("%s %s: %v", e.key, e.value, e.err)
}

func (e *settingError) Unwrap() error { return e.err }

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
	ident, err := n.bootLines(sb, boot)
	if err != nil {
		return err
	}
	secrets, err := n.secretsFile()
	if err != nil {
		return err
	}
	text := n.confText(sb, restoreFrom) + ident
	if secrets != nil {
		defer secrets.Close()
		text += "secrets_fd = 3\n" // the child's first ExtraFiles descriptor
	}
	if err := os.WriteFile(filepath.Join(dir, conf.FileName), []byte(text), 0o600); err != nil {
		return err
	}
	// Where this nether's output begins: the files keep every earlier
	// session's too.
	from := outputsAt(dir)
	pid, start, err := n.spawn(dir, secrets)
	if err != nil {
		return err
	}
	sb.PID, sb.PIDStart, sb.Boot = pid, start, boot
	// The pid goes into the record at once: a nexus that dies from here
	// on leaves a nether its successor knows.
	if err := n.db.Update(func(tx *store.Tx) error {
		cur, err := tx.Sandbox(sb.ID)
		if err != nil {
			return err
		}
		cur.PID, cur.PIDStart, cur.Boot = pid, start, boot
		return tx.PutSandbox(cur)
	}); err != nil {
		terminate(pid, start, 10*time.Second)
		return err
	}
	if err := n.waitReady(ctx, sb, from); err != nil {
		return err
	}
	n.delivered(sb, wake)
	return nil
}

// outputs are offsets into a sandbox's nether.out and nether.log.
type outputs struct{ out, log int64 }

// outputsAt is where dir's nether.out and nether.log end now.
func outputsAt(dir string) outputs {
	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	return outputs{out: size(outFile), log: size(logFile)}
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
	if r := finalReason(e.Final); r != "" {
		return fmt.Sprintf("sandbox %s: its nether ended while starting (reason=%s): %s", e.Sandbox, r, e.Cause)
	}
	return fmt.Sprintf("sandbox %s: its nether ended while starting: %s", e.Sandbox, e.Cause)
}

// Failed reports whether the nether said it failed (reason=error, or
// its guest crashed), rather than ended without a word.
func (e *EndedError) Failed() bool { return failedReason(finalReason(e.Final)) }

// waitReady waits until the sandbox's agent is connected, its nether
// ends (an EndedError, with what it said from from on) or the ready
// timeout passes.
func (n *Nexus) waitReady(ctx context.Context, sb *Sandbox, from outputs) error {
	ctx, cancel := context.WithTimeout(ctx, n.readyTimeout)
	defer cancel()
	sock := filepath.Join(n.sandboxDir(sb.ID), sockName)
	for {
		if !alive(sb.PID, sb.PIDStart) {
			dir := n.sandboxDir(sb.ID)
			return &EndedError{Sandbox: sb.Ref(), Final: finalSince(dir, from.out), Cause: tellWhy(dir, from.log)}
		}
		if c, err := client.Dial(ctx, sock); err == nil {
			agent := c.Info()["agent"]
			c.Close()
			if agent == "connected" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: its guest did not come up within %s (see %s)", sb.Ref(), n.readyTimeout, filepath.Join(n.sandboxDir(sb.ID), logFile))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tellWhy is the last error the nether in dir logged from byte from of
// its log on (its err= when the line has one), or where to look.
func tellWhy(dir string, from int64) string {
	path := filepath.Join(dir, logFile)
	lines := strings.Split(strings.TrimSpace(readFrom(path, from)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "level=ERROR") {
			if e, ok := logErr(lines[i]); ok {
				return e
			}
			return lines[i]
		}
		if strings.HasPrefix(lines[i], "nether:") {
			return lines[i]
		}
	}
	return "see " + path
}

// logErr is the err= value of a log line of slog's text handler, which
// quotes a value as strconv.Quote does when it must.
func logErr(line string) (string, bool) {
	_, v, ok := strings.Cut(line, " err=")
	if !ok || v == "" {
		return "", false
	}
	if v[0] != '"' {
		v, _, _ = strings.Cut(v, " ")
		return v, true
	}
	q, err := strconv.QuotedPrefix(v)
	if err != nil {
		return "", false
	}
	e, err := strconv.Unquote(q)
	return e, err == nil
}

// readFrom is the file at path from byte from on ("" if it cannot be
// read).
func readFrom(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
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
	terminate(sb.PID, sb.PIDStart, 10*time.Second)
	sb.PID, sb.PIDStart = 0, 0
}

// dial connects to a running sandbox's control socket.
func (n *Nexus) dial(ctx context.Context, sb *Sandbox) (*client.Client, error) {
	c, err := client.Dial(ctx, filepath.Join(n.sandboxDir(sb.ID), sockName))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its control socket: %w", sb.Ref(), err)
	}
	return c, nil
}

// control runs one control command that answers framed OK/ERR.
func (n *Nexus) control(ctx context.Context, sb *Sandbox, line string) (string, error) {
	c, err := n.dial(ctx, sb)
	if err != nil {
		return "", err
	}
	defer c.Close()
	var out strings.Builder
	exit, err := c.Run(ctx, line, &out)
	if err != nil {
		return "", busyError(fmt.Errorf("sandbox %s: %s: %w", sb.Ref(), strings.Fields(line)[0], err))
	}
	if exit != 0 {
		return "", busyError(fmt.Errorf("sandbox %s: %s: %s", sb.Ref(), strings.Fields(line)[0], strings.TrimSpace(out.String())))
	}
	return strings.TrimSpace(out.String()), nil
}

// waitExit waits for the sandbox's nether to end.
func (n *Nexus) waitExit(ctx context.Context, sb *Sandbox, d time.Duration) error {
	deadline := time.Now().Add(d)
	for alive(sb.PID, sb.PIDStart) {
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
	if _, err := n.control(ctx, sb, "__shutdown__"); err != nil && alive(sb.PID, sb.PIDStart) {
		// A wedged control socket: SIGTERM settles it all the same.
		n.log.Warn("__shutdown__ failed; sending SIGTERM", "sandbox", sb.Ref(), "err", err)
		terminate(sb.PID, sb.PIDStart, 30*time.Second)
	}
	if err := n.waitExit(ctx, sb, time.Minute); err != nil {
		terminate(sb.PID, sb.PIDStart, 10*time.Second)
	}
	sb.Final = lastFinal(n.sandboxDir(sb.ID))
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
	_, err = n.control(ctx, sb, "__park__ "+parkName)
	if err == nil {
		err = n.waitExit(ctx, sb, time.Minute)
	}
	n.audit(evPark, sb, "", err)
	if err != nil {
		return sb, n.finish(sb, "", err)
	}
	sb.Park, sb.Final, sb.PID, sb.PIDStart = park, lastFinal(n.sandboxDir(sb.ID)), 0, 0
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
	if _, err := n.admit("resume", sb, func() (imageOf, error) { return restoreImage(sb.Park) }, nil); err != nil {
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
	if alive(sb.PID, sb.PIDStart) {
		terminate(sb.PID, sb.PIDStart, 30*time.Second)
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
	code, err := c.Shell(ctx, command, out)
	if err != nil {
		err = busyError(fmt.Errorf("sandbox %s: exec: %w", sb.Ref(), err))
	}
	return code, err
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
	_, err = n.control(ctx, sb, "__put__ "+tmp+" "+guestPath)
	return transferError(err)
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
	if _, err := n.control(ctx, sb, "__get__ "+guestPath+" "+tmp); err != nil {
		return transferError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return copyFile(src, dst)
	}
	return nil
}

// nether's refusals that mean "not now": the sandbox is doing something
// else (another client's command, work in flight that a capture or a
// claim must wait for, bytes a park would lose). Each is a conflict with
// the sandbox's current state that a caller may retry, not nexus's fault.
var busyReplies = []string{
	"read-only observer",                // another client drives the sandbox (control's dispatch)
	"guest not quiescent",               // a capture's gate (session/capture.go)
	"undelivered bytes",                 // a park's drain gate
	"a snapshot or park is in progress", // a claim during a capture
	"a command or transfer is running",  // a claim's gate
}

// busyError marks err busy when nether refused for one of busyReplies.
func busyError(err error) error {
	msg := err.Error()
	for _, r := range busyReplies {
		if strings.Contains(msg, r) {
			return fmt.Errorf("%w: %w", ErrBusy, err)
		}
	}
	return err
}

// checkGuestPath refuses, as a bad request, a guest path nether's control
// line cannot carry: its arguments are split on ASCII blanks, so a path
// with one would reach nether as other arguments than the caller meant.
func checkGuestPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: the guest path is empty", ErrInvalid)
	case strings.ContainsAny(p, " \t\r\n\v\f"):
		return fmt.Errorf("%w: guest path %q holds a blank, tab or line break, which nether's control protocol cannot carry", ErrInvalid, p)
	case strings.ContainsAny(p, "\x00\x1e\x1f"):
		return fmt.Errorf("%w: guest path %q holds a NUL or frame delimiter byte", ErrInvalid, p)
	}
	return nil
}

// ErrTooLarge marks a transfer over the sandbox's max_transfer_bytes.
var ErrTooLarge = errors.New("too large")

// transferError classifies a failed __put__/__get__ by what the guest's
// agent and nether said, so a caller can tell its own mistake (a path that
// is not there, not a regular file, not permitted, or a file over the
// limit) from nexus's or nether's failure. The texts are the agent's and
// nether's own (cmd/nether-agent transfer_linux.go, agentclient); a guest
// that forges them changes only the status of its own sandbox's reply.
func transferError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.HasSuffix(msg, ": no such file or directory"), strings.HasSuffix(msg, ": not a directory"):
		return fmt.Errorf("%w: %s", store.ErrNotFound, msg)
	case strings.Contains(msg, ": not a regular file"), strings.HasSuffix(msg, ": is a directory"):
		return fmt.Errorf("%w: %s", ErrInvalid, msg)
	case strings.HasSuffix(msg, ": permission denied"), strings.HasSuffix(msg, ": read-only file system"):
		return fmt.Errorf("%w: %s", ErrRefused, msg)
	case strings.Contains(msg, "over the transfer limit"):
		return fmt.Errorf("%w: %s", ErrTooLarge, msg)
	}
	return err
}

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
	p := filepath.Join(n.sandboxDir(sb.ID), "console.log")
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
