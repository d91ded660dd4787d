package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/engine/qemu"
	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// restore brings a captured machine back in this process: the same checks
// validate_snapshot makes, a QEMU that maps the artifact's RAM
// copy-on-write, the host half of the channel from the artifact, and the
// post-restore handshake before any driving command.
func (s *Sandbox) restore(ctx context.Context, spec engine.Spec, opt qemu.Options) (*qemu.Machine, error) {
	art, err := snapshot.Open(s.cfg.RestoreFrom)
	if err != nil {
		return nil, err
	}
	meta := &art.Meta
	var claim *snapshot.Claim
	if meta.Kind == snapshot.KindPark {
		// Exactly one wake per park: the claim is atomic across processes.
		if claim, err = art.Claim(); err != nil {
			return nil, err
		}
	}
	resumed := false
	defer func() {
		if claim != nil && !resumed {
			claim.Release() // the guest never ran: the park can be woken again
		}
	}()
	chState, err := channel.UnmarshalState(meta.Channel)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	if chState.Role != channel.Host {
		return nil, fmt.Errorf("snapshot %s: channel state is not a host half", art.Dir)
	}
	// Checksums run while QEMU starts: both take a while, neither needs
	// the other, and the state is loaded only once both are done.
	verified := make(chan error, 1)
	go func() { verified <- art.Verify(ctx) }()

	stateFile, err := os.Open(filepath.Join(art.Dir, "state"))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	defer stateFile.Close()
	spec.Incoming = &engine.Incoming{State: stateFile}
	if meta.RAMMode == snapshot.RAMFile {
		spec.Incoming.RAMFile = filepath.Join(art.Dir, "ram")
		if meta.Kind == snapshot.KindPark {
			// A park wakes once, so there are no siblings to share pages
			// with. A private copy in our memory directory instead of a
			// private map of the park keeps the woken guest's memory a
			// shared file: its next park is a fast file capture, not a
			// stream of all its RAM.
			own, err := copyRAM(spec.Incoming.RAMFile, opt.MemDir)
			if err != nil {
				return nil, fmt.Errorf("waking %s: %w", art.Dir, err)
			}
			spec.Incoming.RAMFile, spec.Incoming.RAMFileOwned = own, true
		}
	}
	spec.VMGenID = qemu.NewGUID()
	if !s.cfg.ForkReseed {
		// The guest sees no generation change and resumes its CRNG state
		// as captured: siblings share it until the kernel reseeds on its
		// own timer (which mixes in fresh RDRAND output), so they may
		// produce the same random bytes for up to a minute. Never for
		// anything that needs secrets.
		spec.VMGenID = meta.VMGenID
	}
	m, err := qemu.Start(ctx, spec, opt)
	if err != nil {
		<-verified
		return nil, fmt.Errorf("restoring %s: %w", art.Dir, err)
	}
	fail := func(err error) (*qemu.Machine, error) {
		m.Quit(context.Background())
		return nil, err
	}
	s.m = m
	fp, err := s.fingerprint()
	if err != nil {
		<-verified
		return fail(err)
	}
	if err := art.Match(fp); err != nil {
		<-verified
		return fail(err)
	}
	if err := <-verified; err != nil {
		return fail(err)
	}
	if err := m.CompleteIncoming(ctx); err != nil {
		return fail(fmt.Errorf("restoring %s: %w", art.Dir, err))
	}
	mux, err := channel.Restore(chState, s.log)
	if err != nil {
		return fail(err)
	}
	s.mux = mux
	mux.Attach(m.ChannelConn(), false)
	fork := meta.Kind == snapshot.KindBase
	s.adoptOrphans(fork)

	parent := meta.Identity
	s.identity = snapshot.Identity{
		SandboxID: parent.SandboxID, ParentID: parent.ParentID,
		Generation: parent.Generation + 1, Hostname: parent.Hostname, TrustClass: parent.TrustClass,
	}
	var machineID string
	if fork {
		// A child inherits the computation, never the identity.
		s.identity.SandboxID = ulid.Make().String()
		s.identity.ParentID = parent.SandboxID
		s.identity.Hostname = "sandbox-" + strings.ToLower(s.identity.SandboxID[len(s.identity.SandboxID)-8:])
		machineID = randomHex(16)
	}
	if err := m.Resume(ctx); err != nil {
		return fail(fmt.Errorf("resuming the restored guest: %w", err))
	}
	resumed = true
	if claim != nil {
		// The park is consumed the moment its guest runs again; QEMU's
		// mapping keeps the memory alive.
		if err := claim.Consume(); err != nil {
			s.log.Error("removing the consumed park", "err", err)
		}
	}
	if s.cfg.ForkReseed {
		s.log.Info("fork crng reseed: new vmgenid generation", "vmgenid", spec.VMGenID)
	} else {
		s.log.Warn("fork_reseed=0: the guest keeps the captured vmgenid and CRNG state")
	}
	if err := s.handshake(ctx, fork, machineID); err != nil {
		return fail(err)
	}
	s.log.Info("restored", "from", art.Dir, "kind", meta.Kind, "generation", s.identity.Generation,
		"sandbox", s.identity.SandboxID, "parent", s.identity.ParentID)
	return m, nil
}

// handshake tells the agent it is running in a new session: the single
// place where a restored guest learns it is new. Driving commands wait
// for it.
func (s *Sandbox) handshake(ctx context.Context, fork bool, machineID string) error {
	req := agentproto.Request{
		Op: agentproto.OpRestored, Epoch: uint64(s.identity.Generation), Fork: fork,
		MachineID: machineID,
	}
	if fork {
		req.Hostname = s.identity.Hostname
	}
	st, err := s.mux.Open(req.Encode())
	if err != nil {
		return err
	}
	st.CloseWrite(nil)
	if _, err := io.Copy(io.Discard, st); err != nil {
		return fmt.Errorf("post-restore handshake: %w", agentError(err))
	}
	if want := fmt.Sprintf("ok %d", req.Epoch); string(st.Status()) != want {
		return fmt.Errorf("post-restore handshake: agent answered %q, want %q", st.Status(), want)
	}
	s.agentOnce.Do(func() { close(s.agentUp) })
	return nil
}

// adoptOrphans deals with streams the captured host half had open: their
// owners (clients of the old process) are gone. A fork is a new session,
// so they are reset. A woken park continues the same session: their bytes
// are drained and counted, so a command in flight at the park still runs
// to its end in the guest and the channel shows nothing lost.
func (s *Sandbox) adoptOrphans(fork bool) {
	for _, st := range s.mux.Streams() {
		req, _ := agentproto.Decode(st.Meta())
		if fork {
			st.Reset("the session that opened this stream ended at a snapshot")
			continue
		}
		go func() {
			n, err := io.Copy(io.Discard, st)
			s.log.Info("in-flight stream from before the park finished", "stream", st.ID(),
				"op", req.Op, "command", req.Command, "bytes_after_wake", n, "status", string(st.Status()), "err", err)
		}()
	}
}

// Validate checks an artifact against this nether without booting
// anything and returns its one-line summary.
func Validate(ctx context.Context, path string, fp snapshot.Fingerprint) (string, error) {
	art, err := snapshot.Open(path)
	if err != nil {
		return "", err
	}
	if _, err := channel.UnmarshalState(art.Meta.Channel); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	if err := art.Match(fp); err != nil {
		return "", err
	}
	if err := art.Verify(ctx); err != nil {
		return "", err
	}
	return art.Summary(), nil
}

var (
	qemuVersionRE  = regexp.MustCompile(`version (\d+\.\d+\.\d+)`)
	machineAliasRE = regexp.MustCompile(`(?m)^` + qemu.MachineType + `\s+.*\(alias of ([^)]+)\)`)
)

// HostFingerprint is the fingerprint this build and configuration would
// give a snapshot, found without starting a guest: QEMU's version and the
// machine type its "pc" alias stands for come from the QEMU binary.
func HostFingerprint(cfgCPUs, cfgRAM int, accel engine.Accel, kernel, image, guestDir string) (snapshot.Fingerprint, error) {
	bin, err := exec.LookPath(qemu.Binary)
	if err != nil {
		return snapshot.Fingerprint{}, fmt.Errorf("finding %s: %w", qemu.Binary, err)
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		return snapshot.Fingerprint{}, fmt.Errorf("asking QEMU its version: %w", err)
	}
	ver := qemuVersionRE.FindSubmatch(out)
	if ver == nil {
		return snapshot.Fingerprint{}, fmt.Errorf("cannot read QEMU's version from %q", out)
	}
	out, err = exec.Command(bin, "-machine", "help").Output()
	if err != nil {
		return snapshot.Fingerprint{}, fmt.Errorf("asking QEMU its machine types: %w", err)
	}
	machine := qemu.MachineType
	if m := machineAliasRE.FindSubmatch(out); m != nil {
		machine = string(m[1])
	}
	d := newDigests(guestDir)
	k, err := d.of(kernel)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	i, err := d.of(image)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	return snapshot.Fingerprint{
		Engine: "qemu", EngineVersion: string(ver[1]), Machine: machine, Accel: string(accel),
		KernelSHA256: k, ImageSHA256: i, CPUs: cfgCPUs, RAMMB: cfgRAM,
	}, nil
}

// digests finds file digests, cheaply when setup's manifest already
// recorded them for an unchanged file (the kernel is 66 MB; hashing it on
// every fork would cost more than the fork).
type digests struct {
	guestDir string
	once     sync.Once
	stamps   []guestimage.FileStamp
	mu       sync.Mutex
	cache    map[string]string
}

func newDigests(guestDir string) *digests {
	return &digests{guestDir: guestDir, cache: map[string]string{}}
}

func (d *digests) of(path string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.cache[path]; ok {
		return v, nil
	}
	d.once.Do(func() {
		if m, err := guestimage.ReadManifest(d.guestDir); err == nil {
			for _, st := range m.Stamps {
				d.stamps = append(d.stamps, st)
			}
		}
	})
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	for _, st := range d.stamps {
		if sameStamp(st, fi) && st.SHA256 != "" {
			d.cache[path] = st.SHA256
			return st.SHA256, nil
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	v := hex.EncodeToString(h.Sum(nil))
	d.cache[path] = v
	return v, nil
}

// copyRAM copies an artifact's RAM file into dir (sparse), for a machine
// that maps it shared.
func copyRAM(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(filepath.Join(dir, "guest-ram"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	defer out.Close()
	if _, err := qemu.CopySparse(out, in); err != nil {
		os.Remove(out.Name())
		return "", fmt.Errorf("copying guest memory: %w", err)
	}
	return out.Name(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
