package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// Where a sandbox's identity and secrets live in the guest. /run is the
// agent's tmpfs: both are guest memory only, never on a disk.
const (
	identityFile = "/run/nether/identity"
	secretsDir   = "/run/secrets"
)

// scrub zeroes what a request held of secrets: its metadata and the
// values decoded from it.
func scrub(meta []byte, secrets agentproto.Secrets) {
	clear(meta)
	secrets.Wipe()
}

// provision serves OpProvision: a booted guest's identity and secrets,
// before the host lets any command run.
func (a *agent) provision(s *channel.Stream, req agentproto.Request) {
	// A boot's clock came from the RTC, whole seconds only.
	if err := setWallClock(req.RealtimeNS); err != nil {
		s.Reset("provision: " + err.Error())
		return
	}
	if err := a.provisionFiles(req.Identity, req.Secrets, false); err != nil {
		s.Reset("provision: " + err.Error())
		return
	}
	s.CloseWrite([]byte("ok 0 " + agentproto.Provisioned))
}

// withdraw serves OpWithdraw: /run/secrets emptied, each file zeroed
// before it goes, before a capture copies the guest's memory.
func (a *agent) withdraw(s *channel.Stream) {
	if err := a.provisionFiles(nil, nil, true); err != nil {
		s.Reset("withdraw: " + err.Error())
		return
	}
	s.CloseWrite([]byte("ok 0 " + agentproto.Withdrawn))
}

// runDirs is what the agent knows of the directories identity and
// secrets go to. Everything done first after a restore runs slowly under
// TCG (each new code path is translated anew, each ms-scale: measured by
// hand, a mkdir 6-10 ms, an open 3-5 ms), so the directories are made at
// boot and a fork's handshake does only what it must: nothing to wipe
// when no secret was ever delivered, no chown when the owner is right.
type runDirs struct {
	mu sync.Mutex
	// ready: both directories exist, /run/secrets 0500 owned by owner.
	ready bool
	owner int
	// held: secrets this agent delivered may be in /run/secrets.
	held bool
}

// prepareRunDirs makes /run/nether and /run/secrets at boot, the latter
// owned by the boot's run_as user.
func (a *agent) prepareRunDirs() error {
	if err := os.MkdirAll(filepath.Dir(a.identityFile), 0o755); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	a.runDirs.mu.Lock()
	defer a.runDirs.mu.Unlock()
	return a.ensureSecretsDir(a.owner())
}

// owner is the run_as user's uid and gid (root's without one).
func (a *agent) owner() (int, int) {
	if u := a.policy.get(); u != nil {
		return int(u.uid), int(u.gid)
	}
	return 0, 0
}

// provisionFiles writes the identity file (when id is set) and replaces
// the secrets with secrets. wipe empties /run/secrets even when no
// secrets came: a fork's handshake, so a child never reads its parent's.
// The secrets belong to the run_as user (root without one), mode 0400
// in a 0500 directory: the tenant's commands read them, nobody else.
func (a *agent) provisionFiles(id *agentproto.Identity, secrets agentproto.Secrets, wipe bool) error {
	a.runDirs.mu.Lock()
	defer a.runDirs.mu.Unlock()
	prepared := a.runDirs.ready // at boot: /run/nether exists too
	var errs []error
	if (wipe || secrets != nil) && a.runDirs.held {
		if err := wipeSecrets(a.secretsDir); err != nil {
			errs = append(errs, err)
		} else {
			a.runDirs.held = false
		}
	}
	if len(secrets) > 0 && len(errs) == 0 {
		uid, gid := a.owner()
		a.runDirs.held = true // from the first file on: a failure below wipes
		if err := a.ensureSecretsDir(uid, gid); err != nil {
			errs = append(errs, err)
		} else if err := writeSecrets(a.secretsDir, secrets, uid, gid); err != nil {
			// Half a set of secrets is worse than none: a tenant would
			// run with some of what its admission gave it.
			if wipeSecrets(a.secretsDir) == nil {
				a.runDirs.held = false
			}
			errs = append(errs, err)
		}
	}
	if id != nil {
		if !prepared {
			if err := os.MkdirAll(filepath.Dir(a.identityFile), 0o755); err != nil {
				errs = append(errs, fmt.Errorf("identity: %w", err))
			}
		}
		if err := writeIdentity(a.identityFile, *id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensureSecretsDir makes /run/secrets 0500 and owned by uid when it is
// not known to be (a guest captured by an agent that did not make it at
// boot, a handshake that narrowed run_as). Called with a.runDirs.mu held.
func (a *agent) ensureSecretsDir(uid, gid int) error {
	if a.runDirs.ready && a.runDirs.owner == uid {
		return nil
	}
	if err := os.MkdirAll(a.secretsDir, 0o500); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := errors.Join(os.Chmod(a.secretsDir, 0o500), os.Chown(a.secretsDir, uid, gid)); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	a.runDirs.ready, a.runDirs.owner = true, uid
	return nil
}

// writeIdentity replaces the identity file whole (a reader never sees
// half of one), readable by every guest user: it says who the sandbox
// is, and the token in it is only good for saying so. Its directory
// exists (prepareRunDirs).
func writeIdentity(path string, id agentproto.Identity) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(id.File()), 0o444); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}

// wipeSecrets overwrites every secret file with zeros, in place, and
// truncates it before removing it: tmpfs frees the page without clearing
// it, and a freed page is still in the memory a later capture saves. A
// file it could not zero is named in the error (and removed all the
// same: the tenant must not keep reading it).
func wipeSecrets(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	var errs []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type().IsRegular() {
			if err := zeroFile(p); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("secrets: removing the previous ones: %s", strings.Join(errs, "; "))
	}
	return nil
}

// zeroFile overwrites path's bytes with zeros, syncs and truncates it.
func zeroFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("zeroing %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && fi.Size() > 0 {
		_, err = f.WriteAt(make([]byte, fi.Size()), 0)
	}
	if err == nil {
		err = errors.Join(f.Sync(), f.Truncate(0))
	}
	if err != nil {
		return fmt.Errorf("zeroing %s: %w", filepath.Base(path), err)
	}
	return nil
}

// writeSecrets writes each secret to dir/NAME, which must exist. The
// names were checked when the request was decoded
// (agentproto.CheckSecrets): one file name each, none starting with '.'.
func writeSecrets(dir string, secrets agentproto.Secrets, uid, gid int) error {
	for _, name := range agentproto.SecretNames(secrets) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o400)
		if err != nil {
			return fmt.Errorf("secret %s: %w", name, err)
		}
		_, werr := f.Write(secrets[name])
		var oerr error
		if uid != 0 || gid != 0 {
			oerr = f.Chown(uid, gid)
		}
		if err := errors.Join(werr, oerr, f.Close()); err != nil {
			return fmt.Errorf("secret %s: %w", name, err)
		}
	}
	return nil
}
