package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/rootimage"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// Local runs nether processes on this host.
type Local struct {
	// Nether is the nether binary.
	Nether string
	// GuestDir is handed to nether as NETHER_GUEST_DIR ("" = nether's
	// own default).
	GuestDir string
}

var _ Runner = (*Local)(nil)

// Launch implements Runner: nether.conf is written (mode 0600) from s,
// then nether starts in dir with stdout appended to Stdout and stderr to
// Stderr, in a session of its own, so it outlives its caller.
func (l *Local) Launch(dir string, s Settings, secrets map[string][]byte) (Proc, error) {
	text, err := s.Text(dir, secrets != nil)
	if err != nil {
		return Proc{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, ConfFile), []byte(text), 0o600); err != nil {
		return Proc{}, err
	}
	var fd *os.File
	if secrets != nil {
		if fd, err = secretsFile(EncodeSecrets(secrets)); err != nil {
			return Proc{}, err
		}
		defer fd.Close()
	}
	var env []string
	if l.GuestDir != "" {
		env = append(env, "NETHER_GUEST_DIR="+l.GuestDir)
	}
	return Spawn(l.Nether, dir, env, fd)
}

func (l *Local) Alive(p Proc) bool                     { return Alive(p) }
func (l *Local) Terminate(p Proc, grace time.Duration) { Terminate(p, grace) }
func (l *Local) Running(root string) map[Proc]string   { return NethersUnder(root) }
func (l *Local) Mark(dir string) Mark                  { return MarkOf(dir) }
func (l *Local) Final(dir string, from Mark) string    { return FinalSince(dir, from) }
func (l *Local) Why(dir string, from Mark) string      { return WhySince(dir, from) }

func (l *Local) Dial(ctx context.Context, dir string) (Conn, error) {
	c, err := DialDir(ctx, dir)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// BootImage implements Runner: the kernel and root image in the guest
// directory this nether uses, or a custom root image.
func (l *Local) BootImage(gpu bool, rootfs string) (Image, error) {
	dir := l.GuestDir
	if dir == "" {
		dir = guestimage.Dir(l.Nether)
	}
	d := guestimage.NewDigests(dir)
	kernel := filepath.Join(dir, guestimage.VmlinuxFile)
	if gpu {
		kernel = filepath.Join(dir, guestimage.VmlinuzFile) // a display boots the bzImage
	}
	var img Image
	var err error
	if img.Kernel, err = d.Of(kernel); err != nil {
		return img, err
	}
	switch rootfs {
	case conf.RootfsBusybox:
		return img, nil
	case "":
		rootfs = filepath.Join(dir, rootimage.ImageFile)
	}
	img.Rootfs, err = d.Of(rootfs)
	return img, err
}

// Artifact implements Runner from the artifact's fingerprint.
func (l *Local) Artifact(dir string) (Artifact, error) { return ReadArtifact(dir) }

// ReadArtifact reads what the snapshot or park at dir holds.
func ReadArtifact(dir string) (Artifact, error) {
	a, err := snapshot.Open(dir)
	if err != nil {
		return Artifact{}, err
	}
	fp := a.Meta.Fingerprint
	return Artifact{Kind: string(a.Meta.Kind), CPUs: fp.CPUs, RAMMB: fp.RAMMB, Kernel: fp.KernelSHA256, Rootfs: fp.RootfsSHA256}, nil
}

// ArtifactDigest is an artifact's content digest: the sha256 of its
// ArtifactMeta, which pins every file of it.
func ArtifactDigest(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ArtifactMeta))
	if err != nil {
		return "", fmt.Errorf("reading the artifact's %s: %w", ArtifactMeta, err)
	}
	return digest(b), nil
}
