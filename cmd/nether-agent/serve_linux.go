package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

type agent struct {
	log    *slog.Logger
	reaper *reaper
	mux    *channel.Mux
	// epoch is the session epoch served (agentproto's package comment):
	// 0 after boot, set by each restore handshake, checked on every
	// host request.
	epoch atomic.Uint64
	// powerOff ends the guest after a poweroff request was acknowledged.
	// A field, not a direct call, so a test can serve poweroff requests
	// without powering anything off.
	powerOff func()
	// openSource opens what a get reads; nil means openSource. A test
	// seam: a test can hand get a source that never ends without
	// having to read the guest kernel's log.
	openSource func(path string) (fd int, size int64, err error)
	// reseedCRNG mixes a seed into the kernel's pool and reseeds the
	// CRNG; nil means reseedCRNG. A test seam: a test can serve reseed
	// requests without reseeding the host it runs on.
	reseedCRNG func(seed []byte) error
	// gone is closed when run stops accepting: the channel closed.
	gone chan struct{}
	// serving counts requests being served.
	serving atomic.Int64
	// egress is the egress plane's listener (plane_linux.go).
	egress egressListener
	// policy is who commands and transfers act as (runas_linux.go).
	policy *runAsPolicy
	// console is the serial console's shell (nil without one), restarted
	// when a restore narrows the policy.
	console *consoleShell
	// passwd and group are the account files run_as is looked up in; a
	// test points them elsewhere.
	passwd, group string
	// identityFile and secretsDir are where identity and secrets go
	// (identity_linux.go); a test points them elsewhere.
	identityFile, secretsDir string
	// run is what the agent knows of /run/nether and /run/secrets
	// (identity_linux.go). It is guest memory: a fork inherits it.
	runDirs runDirs
}

func newAgent(log *slog.Logger, r *reaper, mux *channel.Mux, powerOff func()) *agent {
	return &agent{log: log, reaper: r, mux: mux, powerOff: powerOff, gone: make(chan struct{}),
		policy: &runAsPolicy{}, passwd: passwdFile, group: groupFile,
		identityFile: identityFile, secretsDir: secretsDir}
}

// run serves the streams the host opens until the channel closes (or ctx
// ends) and returns why. It then closes gone, which is how a transfer
// waiting on its file learns the channel is gone: its stream's Read says
// only end of file once the host has sent everything.
func (a *agent) run(ctx context.Context) error {
	defer close(a.gone)
	for {
		s, err := a.mux.Accept(ctx)
		if err != nil {
			return err
		}
		a.serving.Add(1)
		go func() {
			defer a.serving.Add(-1)
			a.serve(s)
		}()
	}
}

// shellEnv is the environment of every command. Commands start from a
// known state, not from whatever the kernel handed PID 1.
var shellEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"USER=root",
	"LOGNAME=root",
	"TERM=dumb",
	"LANG=C.UTF-8",
}

func (a *agent) serve(s *channel.Stream) {
	req, err := agentproto.Decode(s.Meta())
	if err != nil || req.Secrets != nil {
		// Secrets leave nothing behind in the agent: the metadata they
		// came in (base64) and their decoded values are zeroed once the
		// request is served. Go frees memory without clearing it, and
		// guest memory is what a snapshot saves and a fork reads. (A
		// request that failed to decode may have held some too.)
		defer scrub(s.Meta(), req.Secrets)
	}
	if err != nil {
		s.Reset(err.Error())
		return
	}
	// Checked once, before anything runs: a request from another session
	// (still queued in a captured channel, or from a host that missed a
	// restore) must not act in this one, while a stream admitted earlier
	// keeps running when a later handshake changes the epoch.
	if err := agentproto.CheckEpoch(req, a.epoch.Load()); err != nil {
		a.log.Warn("agent: refused a request from another session", "op", req.Op, "err", err)
		s.Reset(err.Error())
		return
	}
	switch req.Op {
	case agentproto.OpExec:
		a.exec(s, string(req.Command))
	case agentproto.OpPut:
		a.put(s, req)
	case agentproto.OpGet:
		a.get(s, req)
	case agentproto.OpRestored:
		a.restored(s, req)
	case agentproto.OpReseed:
		a.reseed(s, req)
	case agentproto.OpProvision:
		a.provision(s, req)
	case agentproto.OpClock:
		a.clock(s, req)
	case agentproto.OpWithdraw:
		a.withdraw(s)
	case agentproto.OpConnect:
		a.connect(s, req)
	case agentproto.OpListen:
		a.listen(s, req)
	case agentproto.OpPoweroff:
		s.CloseWrite([]byte("ok 0"))
		// Give the acknowledgement a moment to leave before the power goes.
		time.Sleep(20 * time.Millisecond)
		a.powerOff()
	default:
		s.Reset(fmt.Sprintf("operation %q is not served by this agent", req.Op))
	}
}

// exec runs a shell command with stdout and stderr on one pipe, so their
// interleaving is kept, and streams the bytes as they come.
func (a *agent) exec(s *channel.Stream, command string) {
	pr, pw, err := os.Pipe()
	if err != nil {
		s.Reset("creating output pipe: " + err.Error())
		return
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		pr.Close()
		pw.Close()
		s.Reset("opening /dev/null: " + err.Error())
		return
	}
	_, done, err := a.reaper.start("/bin/sh", []string{"sh", "-c", command}, commandAttr(a.policy.get(), []*os.File{devnull, pw, pw}))
	devnull.Close()
	pw.Close()
	if err != nil {
		pr.Close()
		s.Reset("starting /bin/sh: " + err.Error())
		return
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				if _, werr := s.Write(buf[:n]); werr != nil {
					// The host dropped the stream; keep draining so the
					// command never blocks on a full pipe.
					io.Copy(io.Discard, pr)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	ws := <-done
	// A command that leaves a background process holding the pipe open
	// would keep us waiting forever; take what arrives shortly after the
	// shell exits and stop there.
	pr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	<-copied
	pr.Close()
	s.CloseWrite([]byte(strconv.Itoa(exitCode(ws))))
}

// restored is the post-restore handshake: the one place the guest learns
// it is a new session. A fork takes a fresh hostname and machine-id; the
// kernel has already reseeded its CRNG from the new vmgenid generation.
func (a *agent) restored(s *channel.Stream, req agentproto.Request) {
	var errs []string
	// The clock first: the guest's shows its capture's moment, and
	// whatever the handshake writes (identity, secrets) should carry
	// today's times.
	if err := setWallClock(req.RealtimeNS); err != nil {
		errs = append(errs, err.Error())
	}
	// The policy first: a handshake that would widen it is refused
	// before the guest changes in any other way.
	before := a.policy.get()
	if err := a.policy.narrow(req.RunAs, a.passwd, a.group); err != nil {
		s.Reset("restore handshake: " + err.Error())
		return
	}
	if a.policy.get() != before {
		a.console.restart() // the console shell was root's
	}
	if req.Hostname != "" {
		if err := setHostname(req.Hostname); err != nil {
			errs = append(errs, "hostname: "+err.Error())
		}
	}
	if req.MachineID != "" {
		if err := os.WriteFile("/etc/machine-id", []byte(req.MachineID+"\n"), 0o444); err != nil {
			errs = append(errs, "machine-id: "+err.Error())
		}
	}
	if req.MAC != "" {
		if err := setMAC(netIface, req.MAC); err != nil {
			errs = append(errs, "mac: "+err.Error())
		}
	}
	// Secrets and identity after the policy, which owns the secrets
	// files, and before the epoch: nothing of the new session runs
	// before the child holds its own secrets and none of its parent's.
	provisioned := false
	if req.Fork || req.Identity != nil || req.Secrets != nil {
		if err := a.provisionFiles(req.Identity, req.Secrets, req.Fork); err != nil {
			errs = append(errs, err.Error())
		}
		provisioned = true
	}
	a.epoch.Store(req.Epoch)
	if len(errs) > 0 {
		s.Reset("restore handshake: " + strings.Join(errs, "; "))
		return
	}
	status := fmt.Sprintf("ok %d", req.Epoch)
	if provisioned {
		status += " " + agentproto.Provisioned
	}
	s.CloseWrite([]byte(status))
}

// runConsoleShell runs an interactive shell on the serial console. busybox
// setsid -c makes the console the shell's controlling terminal, so job
// control and ^C work as at any login prompt.
func runConsoleShell(r *reaper, log *slog.Logger) {
	tty, err := os.OpenFile("/dev/ttyS0", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		log.Error("agent: console shell", "err", err)
		return
	}
	defer tty.Close()
	// busybox's setsid in the busybox guest, util-linux's (the same -c)
	// on a root image.
	setsid := "/usr/bin/setsid"
	if _, err := os.Stat("/bin/busybox"); err == nil {
		setsid = "/bin/busybox"
	}
	// Not a login shell: a root image's /etc/profile would replace the
	// prompt (Debian's sets PS1='# '), and the environment is already
	// the one every command gets.
	_, done, err := r.start(setsid, []string{"setsid", "-c", "/bin/sh"}, &os.ProcAttr{
		Dir:   "/root",
		Env:   append(shellEnv[:len(shellEnv):len(shellEnv)], "PS1=sandbox# "),
		Files: []*os.File{tty, tty, tty},
	})
	if err != nil {
		log.Error("agent: console shell", "err", err)
		return
	}
	<-done
}
