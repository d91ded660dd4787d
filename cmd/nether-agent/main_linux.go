// nether-agent is PID 1 of the guest: it prepares the system, then serves
// nether over the channel (one virtio-serial port): runs shell commands,
// moves files and powers the guest off when told to.
package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// portName is the virtio-serial port name nether gives the channel.
const portName = "nether.channel"

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	startMS := uptimeMS()
	var (
		params map[string]string
		probs  problems
	)
	if os.Getpid() == 1 {
		// First of all: until then a stray signal ends the guest.
		ignoreSignals()
		// /proc/cmdline exists only once initSystem has mounted /proc.
		var err error
		if params, probs, err = initSystem(log); err != nil {
			log.Error("agent: preparing the guest failed", "err", err)
		}
	} else {
		params = kernelParams()
	}
	modulesMS := uptimeMS()
	r := newReaper()
	go r.run()
	// The run_as policy, before anything runs in the guest: the console
	// shell and every command take their user from it.
	policy := &runAsPolicy{}
	policyFailed := false
	if name, ok := params["nether.run_as"]; ok {
		// Unknown user: no command runs at all, rather than as root.
		if err := policy.narrow(name, passwdFile, groupFile); err != nil {
			log.Error("agent: run_as", "err", err)
			probs.setup = append(probs.setup, err.Error())
			policyFailed = true
		}
	}
	var console *consoleShell

	if params["nether.console"] == "1" {
		// Console mode: nobody drives the channel; a shell on the serial
		// console is the interface and the guest ends when it exits.
		go func() {
			runConsoleShell(r, log)
			powerOff(log)
		}()
	} else if os.Getpid() == 1 {
		// Control mode: a login shell on the serial console, for
		// __screen__ (never on the host's terminal when run by hand).
		console = startConsoleShell(r, log, policy, policyFailed)
		clearDisplay()
	}

	port, err := openPort(portName, 20*time.Second)
	if err != nil {
		log.Error("agent: no channel port; nothing to serve", "err", err)
		if os.Getpid() == 1 {
			select {} // PID 1 must not exit; the console shell (if any) still runs
		}
		os.Exit(1)
	}
	mux := channel.New(channel.Guest, log)
	if lane, err := openLane("/sys/bus/pci/devices"); err == nil {
		if err := mux.SetLane(lane, int64(len(lane.mem))); err != nil {
			log.Warn("agent: bulk lane unusable; the channel carries everything", "err", err)
		}
	} else if !errors.Is(err, errNoLane) {
		log.Warn("agent: no bulk lane; the channel carries everything", "err", err)
	}
	mux.Attach(port, true)

	a := newAgent(log, r, mux, func() { powerOff(log) })
	a.policy, a.console = policy, console
	if err := a.prepareRunDirs(); err != nil {
		probs.setup = append(probs.setup, err.Error())
	}
	if hello, err := mux.Open(agentproto.Request{
		Op: agentproto.OpHello, Version: agentproto.Version, Boot: bootID(),
		StartMS: startMS, ModulesMS: modulesMS, HelloMS: uptimeMS(),
		Problem: strings.Join(probs.setup, "; "), DiskProblem: probs.disk,
	}.Encode()); err == nil {
		hello.CloseWrite(nil)
	}
	err = a.run(context.Background())
	log.Error("agent: channel closed", "err", err)
	select {} // PID 1 must not exit
}

func kernelParams() map[string]string {
	b, _ := os.ReadFile("/proc/cmdline")
	m := map[string]string{}
	for _, f := range strings.Fields(string(b)) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// uptimeMS is the guest's CLOCK_BOOTTIME in milliseconds.
func uptimeMS() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return ts.Nano() / 1e6
}
