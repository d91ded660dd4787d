package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/internal/agentclient"
	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/disk"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/netstack"
	"github.com/nethersandbox/nether/internal/plane"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// DefaultHostname is a booted sandbox's hostname when nether.conf names
// none.
const DefaultHostname = "sandbox"

// KernelCmdline is the guest kernel's command line for a boot. (A restore
// runs with the command line the captured machine booted with: that is the
// engine's business.)
//
// quiet: every console byte is an emulated port write under TCG; no
// crypto self-tests, no PS/2 probing, no audit or AppArmor (nothing in the
// guest uses them): each shaves boot time.
//
// pci=noacpi routes PCI interrupts through the firmware's table instead of
// ACPI's interrupt links: enabling each virtio device otherwise runs the
// links' AML methods in the kernel's interpreter, 65-130 ms a device under
// TCG (the agent's module phase went from ~800 to ~450 ms). The devices
// use MSI-X anyway; ACPI itself stays on (vmgenid is an ACPI device).
//
// initcall_blacklist skips two built-in initcalls that serve nothing in a
// sandbox and cost 50-175 ms each under TCG (measured with
// initcall_debug): the SP800-108 KDF's self-test, which cryptomgr.notests
// does not cover, and kprobe trace events' setup.
func KernelCmdline(consoleMode bool, hostname string, net bool) string {
	c := "console=ttyS0 quiet panic=-1 nether.hostname=" + hostname +
		" cryptomgr.notests i8042.noaux i8042.nokbd audit=0 apparmor=0 no_timer_check" +
		" pci=noacpi initcall_blacklist=crypto_kdf108_init,init_kprobe_trace"
	if consoleMode {
		c += " nether.console=1"
	}
	if net {
		// The agent configures eth0 before it says hello.
		c += " nether.net=1"
	}
	return c
}

// GuestFiles returns the kernel and image a configuration boots: its own
// kernel=/image= or what setup built in guestDir.
func GuestFiles(cfg *conf.Config, guestDir string) (kernel, image string) {
	kernel, image = cfg.Kernel, cfg.Image
	if kernel == "" {
		kernel = filepath.Join(guestDir, "vmlinux")
		if cfg.GPU {
			// QEMU boots an ELF vmlinux through PVH, which tells the
			// kernel nothing about a screen: its consoles stay on a
			// dummy device and the display shows only the BIOS. The
			// bzImage boots through the Linux boot protocol, which
			// hands over the VGA text mode (about 4 s more under TCG).
			kernel = filepath.Join(guestDir, "vmlinuz")
		}
	}
	if image == "" {
		image = filepath.Join(guestDir, "initramfs.cpio")
	}
	return kernel, image
}

// assemble is the one path that brings a machine up: resolve the
// accelerator, start the engine (booting, or waiting for a captured
// state), restore the components and load the state, resume, and hand
// the agent its new session. On success the session's machine, channel
// and agent client are set and ready is closed; on failure whatever
// started is stopped.
func (s *Session) assemble(consoleMode bool) (err error) {
	ctx := s.ctx
	accel, why, err := engine.ResolveAccel(s.cfg.Accel, engine.ReadHostFacts())
	if err != nil {
		return err
	}
	s.log.Info("accelerator chosen", "accel", accel, "why", why)
	s.kernel, s.image = GuestFiles(s.cfg, s.opt.GuestDir)
	if s.rootImage, err = RootImage(s.cfg, s.opt.GuestDir); err != nil {
		return err
	}
	s.digests = guestimage.NewDigests(s.opt.GuestDir)
	cmdline := KernelCmdline(consoleMode, s.getView().identity.Hostname, s.cfg.Net)
	if s.rootImage != "" {
		fstype, err := rootFSType(s.rootImage)
		if err != nil {
			return err
		}
		// The agent mounts the image read-only, under a writable layer
		// in the guest's memory, before anything else runs.
		cmdline += " nether.root=" + fstype
	}
	if !s.cfg.Restore {
		if runAs := s.getView().runAs; runAs != "" {
			// The agent looks the user up before it says hello, and
			// refuses every command if it cannot.
			cmdline += " nether.run_as=" + runAs
		}
		if s.cfg.Disk != "" {
			cmdline += " nether.disk=1"
		}
	}

	s.setView(func(v *view) { v.accel = accel })

	runDir, releaseRunDir, err := makeRunDir(s.opt.TempDir, s.log)
	if err != nil {
		return err
	}
	// The engine's sockets are connected once Start returns; nothing in
	// the run directory is needed after that, so it never outlives the
	// start, however the process ends later.
	defer releaseRunDir()
	spec := engine.Spec{
		CPUs: s.cfg.CPUs, RAMMB: s.cfg.RAMMB, Accel: accel,
		Kernel: s.kernel, Initrd: s.image, Cmdline: cmdline, RootImage: s.rootImage,
		RunDir: runDir, Display: s.cfg.GPU, NIC: s.cfg.Net,
	}

	var r *restoring
	if s.cfg.Restore {
		// A fork's new disk layer is its own: a failed restore takes it
		// along.
		defer func() {
			if err != nil && s.forkLayer != "" {
				s.releaseDisk()
				os.Remove(s.forkLayer)
			}
		}()
		if r, err = s.openArtifact(ctx, &spec); err != nil {
			return err
		}
		defer r.close()
	} else if s.cfg.Disk != "" {
		if err := s.bootDisk(ctx, &spec); err != nil {
			return err
		}
	}
	m, err := s.opt.Engine.Start(ctx, spec)
	if err != nil {
		if r != nil {
			return fmt.Errorf("restoring %s: %w", r.art.Dir, err)
		}
		return fmt.Errorf("booting the guest: %w", err)
	}
	defer func() {
		if err != nil {
			m.Quit(ctx)
		}
	}()
	consoleDone, err := s.pumpConsole(consoleMode, m)
	if err != nil {
		return err
	}
	s.consoleDone = consoleDone
	s.meter.SetUsage(m.Usage, m.CPUTime)
	// The stack is up before the guest runs or resumes: a guest that
	// sends a frame at once finds someone to answer it.
	if err := s.startNetwork(m); err != nil {
		return err
	}
	// Each component is made with what it carries, all of it known now:
	// the console, the network stack, the planes and their ports, the
	// disk, the run_as policy.
	nc := netstack.NewComponent(s.net, s.log)
	comps, cc := newComponents(func(st *channel.State) (*channel.Mux, error) { return channel.Restore(st, s.log) },
		s.consoleComponent(), nc, plane.NewComponent(s.planes, plane.Ports{App: s.appPort, Egress: s.egressPort}),
		disk.NewComponent(s.diskPath), &policyComponent{runAs: s.getView().runAs})
	info := m.Info()
	s.setView(func(v *view) { v.engine = info })
	s.log.Info("guest starting", "engine", info.Backend, "version", info.Version, "machine", info.Machine,
		"pid", m.PID(), "restore", r != nil)

	if r == nil {
		cc.mux = channel.New(channel.Host, s.log)
		s.install(m, cc.mux, comps)
		s.life("engine_started backend=%s accel=%s cpus=%d ram_mb=%d", info.Backend, accel, s.cfg.CPUs, s.cfg.RAMMB)
		go s.watchAgent()
		go s.setEgressListener(false)
		return nil
	}
	if err := s.finishRestore(ctx, r, m, cc, comps); err != nil {
		return err
	}
	nc.ResetCarried()
	go s.watchAgent()
	go func() {
		s.setEgressListener(true)
		close(s.restored)
	}()
	return nil
}

// sandboxIdentity is who a booted sandbox is: handed in by nether.conf, or
// minted. (A restore derives its identity from the artifact.)
func sandboxIdentity(cfg *conf.Config) snapshot.Identity {
	id := cfg.SandboxID
	if id == "" {
		id = ulid.Make().String()
	}
	hostname := cfg.Hostname
	if hostname == "" {
		hostname = DefaultHostname
	}
	return snapshot.Identity{SandboxID: id, Hostname: hostname, TrustClass: "default"}
}

// install makes an assembled machine the session's and starts serving
// the streams the guest opens. The agent client starts at epoch 0, a
// booted guest's; a restore's handshake moves it to a fresh one.
func (s *Session) install(m engine.Machine, mux *channel.Mux, comps components) {
	if lane, size := m.Lane(); lane != nil {
		if err := mux.SetLane(lane, size); err != nil {
			s.log.Warn("channel: no bulk lane; everything goes through the port", "err", err)
		}
	}
	mux.Attach(m.Channel(), false)
	s.machine, s.mux, s.comps = m, mux, comps
	s.agent = agentclient.New(s.log, mux, 0)
	if !s.cfg.Restore {
		s.agent.SetProvision(s.provisionRequest())
	}
	if s.planes != nil {
		s.agent.Handle(agentproto.OpEgress, s.serveEgress)
	}
	go s.agent.Serve(s.ctx)
	silence := s.opt.ChannelSilence
	if silence == 0 {
		silence = channelSilence
	}
	mux.SetLiveness(silence)
	go func() {
		select {
		case <-m.Done():
			// The engine's end closes every stream that waits on the guest.
			mux.Close()
		case <-mux.Dead():
			// A guest that answers nothing can no longer be driven: every
			// stream has failed, and the sandbox ends saying why.
			err := mux.Err()
			s.log.Error("channel: the guest stopped answering on the channel; ending the sandbox", "err", err)
			s.fail(err)
		case <-s.ctx.Done():
		}
	}()
	close(s.ready)
	if s.opt.installed != nil {
		s.opt.installed(s)
	}
}

// restoring is an artifact being restored.
type restoring struct {
	art   *snapshot.Artifact
	claim *snapshot.Claim // a park's one-shot claim
	// verified delivers the checksum verification, which runs while the
	// engine starts: both take a while and neither needs the other.
	verified <-chan error
	resumed  bool
	fork     bool              // a base: a new sandbox; else a park's wake
	next     snapshot.Identity // who the restored sandbox is
}

func (r *restoring) close() {
	if r.verified != nil {
		<-r.verified
	}
	if r.claim != nil && !r.resumed {
		r.claim.Release() // the guest never ran: the park can be woken again
	}
}

// openArtifact opens, claims (a park) and checks an artifact, starts its
// verification, and turns spec into a restore of it. The sections are
// checked against components made for checking only: the ones that
// restore them are made once the engine, the console and the network
// are up.
func (s *Session) openArtifact(ctx context.Context, spec *engine.Spec) (*restoring, error) {
	art := s.art
	r := &restoring{art: art, fork: art.Meta.Kind == snapshot.KindBase}
	r.next = s.getView().identity
	var err error
	if art.Meta.Kind == snapshot.KindPark {
		// Exactly one wake per park: the claim is atomic across processes.
		if r.claim, err = art.Claim(); err != nil {
			return nil, err
		}
	}
	fail := func(err error) (*restoring, error) {
		r.close()
		return nil, fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	checking, _ := newComponents(nil, nil, nil, nil, nil, nil)
	if err := checking.check(art.Meta.Sections); err != nil {
		return fail(err)
	}
	runAs, err := restoredRunAs(art, s.cfg.RunAs)
	if err != nil {
		return fail(err)
	}
	s.setView(func(v *view) { v.runAs = runAs })
	if err := s.restoreDisk(ctx, spec, art); err != nil {
		return fail(err)
	}
	// What does not need the engine is checked before it starts (the
	// shape, the accelerator, the guest files): a mismatch there must be
	// named, not surface as the engine refusing the memory. The engine's
	// own identity is checked against the started engine, which reports
	// it anyway; probing it first would cost a whole engine start.
	have := art.Meta.Fingerprint
	fp, err := s.fingerprintWith(engine.Info{Backend: have.Engine, Version: have.EngineVersion, Machine: have.Machine}, spec.Accel)
	if err != nil {
		return fail(err)
	}
	if err := art.Match(fp); err != nil {
		r.close()
		return nil, err
	}
	verified := make(chan error, 1)
	go func() {
		start := time.Now()
		remembered, err := art.VerifyCached(ctx, s.opt.Verified)
		s.log.Debug("artifact checksums verified", "took_ms", time.Since(start).Milliseconds(),
			"unchanged_since_verified", remembered, "err", err)
		verified <- err
	}()
	r.verified = verified
	spec.Incoming = &engine.Incoming{
		Dir:            art.Dir,
		Section:        engine.Section(art.Meta.Sections[snapshot.SectionEngine]),
		OneShot:        art.Meta.Kind == snapshot.KindPark,
		KeepGeneration: !s.cfg.ForkReseed,
	}
	return r, nil
}

// finishRestore brings a started incoming machine to a running session:
// checksums, components, device state, identity, resume, handshake.
func (s *Session) finishRestore(ctx context.Context, r *restoring, m engine.Machine, cc *channelComponent, comps components) error {
	art, meta := r.art, &r.art.Meta
	fp, err := s.fingerprintWith(m.Info(), s.getView().accel)
	if err != nil {
		return err
	}
	if err := art.Match(fp); err != nil {
		return err
	}
	waitStart := time.Now()
	err = <-r.verified
	r.verified = nil
	s.log.Debug("engine started, checksums awaited", "waited_ms", time.Since(waitStart).Milliseconds())
	if err != nil {
		return err
	}
	if err := comps.restore(meta.Sections); err != nil {
		return fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	if err := m.LoadIncoming(ctx); err != nil {
		return fmt.Errorf("restoring %s: %w", art.Dir, err)
	}
	fork, captured, next := r.fork, meta.Identity, r.next
	var machineID string
	if fork {
		machineID = randomHex(16)
	}
	s.install(m, cc.restored, comps)
	s.adoptOrphans(fork)
	if err := m.Resume(ctx); err != nil {
		return fmt.Errorf("resuming the restored guest: %w", err)
	}
	r.resumed = true
	// Recorded before the handshake: once the agent answers, a waiting
	// client's first command runs, and the timeline must already say the
	// guest was restored before it.
	s.life("restored backend=%s accel=%s", m.Info().Backend, s.getView().accel)
	if r.claim != nil {
		// The park is consumed the moment its guest runs again; the
		// engine's own copy of the memory keeps it alive.
		if err := r.claim.Consume(); err != nil {
			s.log.Error("removing the consumed park", "err", err)
		}
	}
	if s.cfg.ForkReseed {
		s.log.Info("fork crng reseed: new VM generation id")
	} else {
		s.log.Warn("fork_reseed=0: the guest keeps the captured VM generation id and CRNG state")
	}
	hctx, cancel := context.WithTimeout(ctx, s.opt.HandshakeTimeout)
	defer cancel()
	req := s.provisionRequest()
	req.Fork, req.MachineID, req.RunAs = fork, machineID, s.getView().runAs
	// (A woken park, the same sandbox, keeps the secrets it parked with
	// unless its wake supplied new ones: req.Secrets is nil then. A
	// fork's handshake empties /run/secrets whatever it carries.)
	var mac net.HardwareAddr
	if fork {
		mac = s.newGuestMAC()
		req.MAC = macText(mac)
	}
	if fork || next.Hostname != captured.Hostname {
		req.Hostname = next.Hostname
	}
	hsStart := time.Now()
	provisioned, err := s.agent.Handshake(hctx, req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("the restored guest's agent did not answer the handshake within %s", s.opt.HandshakeTimeout)
		}
		return err
	}
	s.logProvisioned(provisioned, req)
	if err := s.tookMAC(mac); err != nil {
		return err
	}
	s.log.Info("restored", "from", art.Dir, "kind", meta.Kind, "generation", next.Generation,
		"sandbox", next.SandboxID, "parent", captured.SandboxID, "handshake_ms", ms(time.Since(hsStart)), "secrets", len(req.Secrets))
	return nil
}

// openRestore opens the artifact a restore starts from, before anything
// else starts, so that __info__ tells who the sandbox will be (lineage,
// generation, the artifact) from its first answer. The checks that take
// time run in assembly.
func (s *Session) openRestore() error {
	art, err := snapshot.Open(s.cfg.RestoreFrom)
	if err != nil {
		return err
	}
	s.art = art
	next := s.restoredIdentity(art.Meta.Identity, art.Meta.Kind == snapshot.KindBase)
	diskPath := ""
	if sec, has, err := disk.Captured(art); err == nil && has {
		diskPath = sec.Live
		if sec.Layer {
			if diskPath = s.cfg.Disk; diskPath == "" {
				diskPath = filepath.Join(s.cfg.Dir, ForkDiskLayer)
			}
		}
	}
	s.setView(func(v *view) {
		v.identity = next
		v.snapshot = art.Dir
		v.parent = art.Meta.Identity.SandboxID
		v.disk = diskPath
	})
	return nil
}

// restoredIdentity is who a restore of captured becomes. A fork is a new
// sandbox (an id and hostname handed in, or minted); a woken park is the
// same sandbox, one generation on.
func (s *Session) restoredIdentity(captured snapshot.Identity, fork bool) snapshot.Identity {
	next := captured
	next.Generation++
	if fork {
		// A child inherits the computation, never the identity.
		next.SandboxID, next.ParentID = s.getView().identity.SandboxID, captured.SandboxID
		next.Hostname = s.cfg.Hostname
		if next.Hostname == "" {
			next.Hostname = "sandbox-" + strings.ToLower(tail(next.SandboxID, 8))
		}
		return next
	}
	if s.cfg.SandboxID != "" && s.cfg.SandboxID != captured.SandboxID {
		s.log.Warn("nether.conf names another sandbox_id than the parked one; using the configured one",
			"configured", s.cfg.SandboxID, "parked", captured.SandboxID)
		next.SandboxID = s.cfg.SandboxID
	}
	if s.cfg.Hostname != "" {
		next.Hostname = s.cfg.Hostname
	}
	return next
}

// adoptOrphans deals with streams the captured host half had open: their
// owners (clients of the old process) are gone. A fork is a new session,
// so they are reset. A woken park continues the same session: an egress
// connection is bridged to the platform again (resume=1), so the tenant's
// recv() from before the park gets what the platform writes now; a
// data-plane connection's platform end is gone, so it is reset; any
// other stream's bytes are drained and counted, so a command in flight
// at the park still runs to its end in the guest and the channel shows
// nothing lost.
func (s *Session) adoptOrphans(fork bool) {
	for _, st := range s.mux.Streams() {
		req, _ := agentproto.Decode(st.Meta())
		if fork {
			st.Reset("the session that opened this stream ended at a snapshot")
			continue
		}
		switch req.Op {
		case agentproto.OpEgress:
			if s.planes != nil {
				s.planes.Egress(st, req, true)
			} else {
				st.Reset("the egress plane is off")
			}
			continue
		case agentproto.OpConnect:
			st.Reset("the data-plane connection ended at the park")
			continue
		}
		go func() {
			n, err := io.Copy(io.Discard, st)
			s.log.Info("in-flight stream from before the park finished", "stream", st.ID(),
				"op", req.Op, "command", req.Command, "bytes_after_wake", n, "status", string(st.Status()), "err", err)
		}()
	}
}

// fingerprintWith is everything a restore of this configuration must
// match, with the engine described by info.
func (s *Session) fingerprintWith(info engine.Info, accel engine.Accel) (snapshot.Fingerprint, error) {
	return fingerprint(info, accel, s.cfg, s.kernel, s.image, s.rootImage, s.digests)
}

// fingerprint is what an artifact taken with this engine, accelerator,
// shape and guest files records.
func fingerprint(info engine.Info, accel engine.Accel, cfg *conf.Config, kernel, image, rootImage string, d *guestimage.Digests) (snapshot.Fingerprint, error) {
	k, err := d.Of(kernel)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	i, err := d.Of(image)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	var r string
	if rootImage != "" {
		if r, err = d.Of(rootImage); err != nil {
			return snapshot.Fingerprint{}, err
		}
	}
	return snapshot.Fingerprint{
		Engine: info.Backend, EngineVersion: info.Version, Machine: info.Machine, Accel: string(accel),
		KernelSHA256: k, ImageSHA256: i, RootfsSHA256: r, CPUs: cfg.CPUs, RAMMB: cfg.RAMMB, GPU: cfg.GPU, Net: cfg.Net,
	}, nil
}

// Validate checks an artifact against this nether without booting
// anything and returns its one-line summary.
func Validate(ctx context.Context, cfg *conf.Config, eng engine.Engine, guestDir string) (string, error) {
	accel, _, err := engine.ResolveAccel(cfg.Accel, engine.ReadHostFacts())
	if err != nil {
		return "", err
	}
	art, err := snapshot.Open(cfg.ValidateSnapshot)
	if err != nil {
		return "", err
	}
	comps, _ := newComponents(nil, nil, nil, nil, nil, nil)
	if err := comps.check(art.Meta.Sections); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	if err := comps.restore(art.Meta.Sections); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	info, err := eng.Probe(ctx)
	if err != nil {
		return "", err
	}
	kernel, image := GuestFiles(cfg, guestDir)
	rootImage, err := RootImage(cfg, guestDir)
	if err != nil {
		return "", err
	}
	fp, err := fingerprint(info, accel, cfg, kernel, image, rootImage, guestimage.NewDigests(guestDir))
	if err != nil {
		return "", err
	}
	if err := art.Match(fp); err != nil {
		return "", err
	}
	if err := art.Verify(ctx); err != nil {
		return "", err
	}
	if _, err := restoredRunAs(art, ""); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	if err := validateDisk(ctx, art); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", art.Dir, err)
	}
	return art.Summary(), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func randomHex(n int) string { return hex.EncodeToString(randomBytes(n)) }

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
