package nexus

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
)

// nexus reaches every nether through its runner (Options.Runner): these
// are the runner's answers in a sandbox record's terms.

// procOf is the nether process sb's record names.
func procOf(sb *Sandbox) runner.Proc { return runner.Proc{PID: sb.PID, Start: sb.PIDStart} }

// alive says whether sb's nether still runs.
func (n *Nexus) alive(sb *Sandbox) bool { return n.run.Alive(procOf(sb)) }

// terminate ends sb's nether, if it runs.
func (n *Nexus) terminate(sb *Sandbox, grace time.Duration) {
	if sb.PID > 0 {
		n.run.Terminate(procOf(sb), grace)
	}
}

// lastFinal is the last final usage record sb's nethers printed.
func (n *Nexus) lastFinal(sb *Sandbox) string {
	return n.run.Final(n.sandboxDir(sb.ID), runner.Mark{})
}

// dial connects to a running sandbox's control socket.
func (n *Nexus) dial(ctx context.Context, sb *Sandbox) (runner.Conn, error) {
	c, err := n.run.Dial(ctx, n.sandboxDir(sb.ID))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: its control socket: %w", sb.Ref(), err)
	}
	return c, nil
}

// verb runs one verb on a connection to sb's nether, its failure named
// after sb and classified (verbError).
func (n *Nexus) verb(ctx context.Context, sb *Sandbox, do func(runner.Conn) error) error {
	c, err := n.dial(ctx, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	return verbError(sb, do(c))
}

// verbError names sb in a verb's failure, and marks it ErrBusy when
// nether refused for "not now": a conflict with the sandbox's current
// state that a caller may retry, not nexus's fault.
func verbError(sb *Sandbox, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("sandbox %s: %w", sb.Ref(), err)
	if errors.Is(err, runner.ErrBusy) {
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return err
}

// transferError classifies a failed put or get by what the guest's agent
// and nether said (runner's kinds), so a caller can tell its own mistake
// (a path that is not there, not a regular file, not permitted, or a
// file over the limit) from nexus's or nether's failure.
func transferError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runner.ErrNoPath):
		return fmt.Errorf("%w: %s", store.ErrNotFound, err)
	case errors.Is(err, runner.ErrNotFile), errors.Is(err, runner.ErrBadPath):
		return fmt.Errorf("%w: %s", ErrInvalid, err)
	case errors.Is(err, runner.ErrDenied):
		return fmt.Errorf("%w: %s", ErrRefused, err)
	case errors.Is(err, runner.ErrTooLarge):
		return fmt.Errorf("%w: %s", ErrTooLarge, err)
	}
	return err
}

// checkGuestPath refuses, as a bad request, a guest path nether's control
// line cannot carry.
func checkGuestPath(p string) error {
	if err := runner.CheckGuestPath(p); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// settingsOf are a record's guest settings as the runner's.
func settingsOf(c Config) runner.Settings {
	return runner.Settings{CPUs: c.CPUs, RAMMB: c.RAMMB, Net: c.Net, NetAllow: c.NetAllow, NetBlock: c.NetBlock, GPU: c.GPU,
		MaxRuntimeS: c.MaxRuntimeS, MaxCPUS: c.MaxCPUS, IdleTimeoutS: c.IdleTimeoutS, AppPort: c.AppPort, EgressPort: c.EgressPort,
		Rootfs: c.Rootfs, RunAs: c.RunAs, DiskSizeMB: c.DiskSizeMB}
}

// settingsFor are the settings of sb's next session; restoreFrom is the
// artifact it restores ("" boots).
//
// The disk: a boot names the sandbox's own disk file (created by nether
// the first time, the same file on every later start, so /data survives
// stop and start). A restore never names one: the artifact says which
// disk its memory expects, and nether's default is right for both kinds
// of restore, where disk = could only be wrong: a fork gets a new layer
// in its launch directory, which is the child's own directory (never the
// parent's disk), and a wake continues the disk it parked with.
//
// run_as and rootfs are given for a restore too: rootfs because the
// artifact's fingerprint holds the image it was captured on, run_as
// because it is the same as the artifact's (nether accepts that) or a
// fork's narrowing of it.
func (n *Nexus) settingsFor(sb *Sandbox, restoreFrom string) runner.Settings {
	s := settingsOf(sb.Config)
	s.SandboxID, s.Hostname = sb.ID, sb.Hostname
	s.DiskSizeMB = 0
	if restoreFrom != "" {
		s.RestoreFrom = restoreFrom
	} else if disk := n.diskPath(sb); disk != "" {
		s.Disk, s.DiskSizeMB = disk, sb.Config.DiskSizeMB
	}
	return s
}

// checkConfig refuses settings nether would refuse, before a record is
// made, by nether's own rules and words, naming the setting.
func checkConfig(c Config) error { return settingsOf(c).Check() }

// dataSocket is sb's data plane listener.
func (n *Nexus) dataSocket(sb *Sandbox) string {
	return filepath.Join(n.sandboxDir(sb.ID), runner.DataSocket)
}

// controlSocket is sb's nether's control socket.
func (n *Nexus) controlSocket(sb *Sandbox) string {
	return filepath.Join(n.sandboxDir(sb.ID), runner.ControlSocket)
}

// launchSettings are the settings of sb's run with boot id boot: its
// session's (settingsFor) and its identity, the node, the boot, the plan
// and the token that states them.
func (n *Nexus) launchSettings(sb *Sandbox, restoreFrom, boot string) (runner.Settings, error) {
	tok, err := n.identityToken(sb, boot)
	if err != nil {
		return runner.Settings{}, err
	}
	s := n.settingsFor(sb, restoreFrom)
	s.NodeID, s.BootID, s.PlanDigest, s.IdentityToken = n.node, boot, sb.Plan, tok
	return s, nil
}
