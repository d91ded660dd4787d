package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// provision serves OpProvision: a booted guest's identity and secrets,
// before the host lets any command run.
func (a *agent) provision(s *channel.Stream, req agentproto.Request) {
	if err := a.provisionFiles(req.Identity, req.Secrets, false); err != nil {
		s.Reset("provision: " + err.Error())
		return
	}
	s.CloseWrite([]byte("ok 0 " + agentproto.Provisioned))
}

// provisionFiles writes the identity file (when id is set) and replaces
// the secrets with secrets. wipe empties /run/secrets even when no
// secrets came: a fork's handshake, so a child never reads its parent's.
// The secrets belong to the run_as user (root without one), mode 0400
// in a 0500 directory: the tenant's commands read them, nobody else.
func (a *agent) provisionFiles(id *agentproto.Identity, secrets map[string]agentproto.Text, wipe bool) error {
	var errs []error
	if wipe || secrets != nil {
		if err := wipeSecrets(a.secretsDir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(secrets) > 0 && len(errs) == 0 {
		uid, gid := 0, 0
		if u := a.policy.get(); u != nil {
			uid, gid = int(u.uid), int(u.gid)
		}
		if err := writeSecrets(a.secretsDir, secrets, uid, gid); err != nil {
			// Half a set of secrets is worse than none: a tenant would
			// run with some of what its admission gave it.
			wipeSecrets(a.secretsDir)
			errs = append(errs, err)
		}
	}
	if id != nil {
		if err := writeIdentity(a.identityFile, *id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeIdentity replaces the identity file whole (a reader never sees
// half of one), readable by every guest user: it says who the sandbox
// is, and the token in it is only good for saying so.
func writeIdentity(path string, id agentproto.Identity) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	tmp := path + ".new"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, []byte(id.File()), 0o444); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}

// wipeSecrets overwrites every secret file with zeros, in place, before
// removing it: tmpfs frees the page without clearing it, and a freed
// page is still in the memory a later capture saves.
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
			if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NOFOLLOW, 0); err == nil {
				if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
					f.WriteAt(make([]byte, fi.Size()), 0)
				}
				f.Close()
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

// writeSecrets writes each secret to dir/NAME. The names were checked
// when the request was decoded (agentproto.CheckSecrets): one file name
// each, none starting with '.'.
func writeSecrets(dir string, secrets map[string]agentproto.Text, uid, gid int) error {
	if err := os.MkdirAll(dir, 0o500); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := os.Chmod(dir, 0o500); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	for _, name := range agentproto.SecretNames(secrets) {
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o400)
		if err != nil {
			return fmt.Errorf("secret %s: %w", name, err)
		}
		_, werr := f.Write([]byte(secrets[name]))
		cerr := f.Close()
		if err := errors.Join(werr, cerr, os.Chown(p, uid, gid)); err != nil {
			return fmt.Errorf("secret %s: %w", name, err)
		}
	}
	return nil
}
