// Command net measures the guest's network through nether's user-mode NAT
// against QEMU's own user networking (-netdev user, slirp) in the same
// run: TCP throughput guest -> host and host -> guest, connection set-up
// latency, and the host memory the network stack costs an idle sandbox.
//
// Traffic goes only to this machine's loopback: the guests reach the host
// through their gateway, 10.0.2.2, which nether maps to 127.0.0.1 when
// net_allow lets it, and slirp always does.
//
//	go run ./bench/net [-mib 32] [-n 200]
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/u-root/u-root/pkg/cpio"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/internal/session"
	"github.com/nethersandbox/nether/internal/testharness"
)

func main() {
	mib := flag.Int("mib", 32, "MiB moved each way")
	n := flag.Int("n", 200, "connection attempts timed")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()
	tmp, err := os.MkdirTemp("", "nether-bench-net-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	// Static (netgo, osusergo): the guest has no libc.
	if err := testharness.Build(repo, tmp, []string{"-trimpath", "-tags", "netgo,osusergo"}, "./test/nettool"); err != nil {
		fail(err)
	}
	tool := filepath.Join(tmp, "nettool")

	sink, source, accept := servers(*mib)
	defer sink.Close()
	defer source.Close()
	defer accept.Close()
	port := func(l net.Listener) int { return l.Addr().(*net.TCPAddr).Port }
	cmds := []string{
		fmt.Sprintf("send 10.0.2.2:%d %d", port(sink), *mib),
		fmt.Sprintf("recv 10.0.2.2:%d", port(source)),
		fmt.Sprintf("attempts 10.0.2.2:%d %d", port(accept), *n),
	}

	// nether: net = 1, the gateway allowed.
	sb, err := harness.Start(repo, "net = 1\nnet_allow = 10.0.2.2/32\n")
	if err != nil {
		fail(err)
	}
	defer sb.Close()
	c, err := sb.Dial(60 * time.Second)
	if err != nil {
		fail(err)
	}
	if err := harness.Run(c, "true"); err != nil {
		fail(err)
	}
	b, _ := os.ReadFile(tool)
	os.WriteFile(filepath.Join(sb.Dir, "nettool"), b, 0o700)
	if err := harness.Run(c, "__put__ nettool /tmp/nettool"); err != nil {
		fail(err)
	}
	harness.Run(c, "chmod 755 /tmp/nettool")
	var ours []string
	for _, cmd := range cmds {
		out, err := harness.Exec(c, "/tmp/nettool "+cmd)
		if err != nil {
			fail(fmt.Errorf("nettool %s: %w: %s", cmd, err, out))
		}
		ours = append(ours, strings.TrimSpace(out))
	}

	// The same commands in a guest of plain QEMU with -netdev user.
	slirp, err := slirpRun(repo, tmp, tool, cmds)
	if err != nil {
		fail(err)
	}

	fmt.Printf("network, %d MiB each way, %d connection attempts (guest -> host through 10.0.2.2):\n", *mib, *n)
	rows := []struct {
		what, key string
	}{{"guest -> host", "mib_per_s"}, {"host -> guest", "mib_per_s"}}
	for i, r := range rows {
		o, s := field(ours[i], r.key), field(slirp[i], r.key)
		fmt.Printf("  %-14s nether %6.1f MiB/s   QEMU user net %6.1f MiB/s   (%.2fx)\n", r.what, o, s, o/s)
	}
	fmt.Printf("  connect        nether p50 %.1f ms p99 %.1f ms   QEMU user net p50 %.1f ms p99 %.1f ms\n",
		field(ours[2], "p50_ms"), field(ours[2], "p99_ms"), field(slirp[2], "p50_ms"), field(slirp[2], "p99_ms"))

	// Memory: an idle sandbox with and without the network, same run.
	plain, err := harness.Start(repo, "")
	if err != nil {
		fail(err)
	}
	defer plain.Close()
	pc, err := plain.Dial(60 * time.Second)
	if err != nil {
		fail(err)
	}
	harness.Run(pc, "true")
	idle, _ := harness.Start(repo, "net = 1\n")
	defer idle.Close()
	ic, err := idle.Dial(60 * time.Second)
	if err != nil {
		fail(err)
	}
	harness.Run(ic, "true")
	time.Sleep(2 * time.Second)
	withNet, without := testharness.RSSKiB(idle.Pid()), testharness.RSSKiB(plain.Pid())
	fmt.Printf("  nether's RSS, idle: with net = 1 %d KiB, without %d KiB: the network stack costs %d KiB\n", withNet, without, withNet-without)
}

// servers listen on the host's loopback: a sink for the guest's sends, a
// source of mib MiB for its receives, and an acceptor for timed connects.
func servers(mib int) (sink, source, accept net.Listener) {
	l := func() net.Listener {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			fail(err)
		}
		return ln
	}
	sink, source, accept = l(), l(), l()
	serve := func(ln net.Listener, f func(net.Conn)) {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); f(c) }()
			}
		}()
	}
	serve(sink, func(c net.Conn) { io.Copy(io.Discard, c) })
	serve(source, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for range mib * 16 {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	serve(accept, func(c net.Conn) {})
	return sink, source, accept
}

// slirpRun boots the repo's guest under plain QEMU with -netdev user and
// nettool added to its initramfs, runs each nettool command on its serial
// console (the agent's console mode gives it a shell there) and returns
// their output lines.
func slirpRun(repo, tmp, tool string, cmds []string) ([]string, error) {
	guest := filepath.Join(repo, "build", "guest")
	initrd := filepath.Join(tmp, "initramfs-nettool.cpio")
	if err := appendTool(filepath.Join(guest, "initramfs.cpio"), tool, initrd); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	q := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "pc", "-accel", "tcg,thread=multi", "-cpu", "max",
		"-m", "512M", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
		"-kernel", filepath.Join(guest, "vmlinux"), "-initrd", initrd,
		"-append", session.KernelCmdline(true, "slirp", true),
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile=",
		// The agent looks for its channel port even in console mode.
		"-chardev", "null,id=ch", "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=ch,name=nether.channel",
		"-serial", "stdio")
	in, _ := q.StdinPipe()
	out, _ := q.StdoutPipe()
	q.Stderr = os.Stderr
	if err := q.Start(); err != nil {
		return nil, err
	}
	defer q.Process.Kill()
	r := bufio.NewReader(out)
	var seen bytes.Buffer
	waitFor := func(re *regexp.Regexp) (string, error) {
		for {
			line, err := r.ReadString('\n')
			seen.WriteString(line)
			if m := re.FindString(line); m != "" {
				return strings.TrimSpace(line), nil
			}
			if err != nil {
				return "", fmt.Errorf("QEMU's console ended: %w\n%s", err, seen.String())
			}
		}
	}
	// Keep asking until the shell is there to answer: what is typed
	// before it starts is lost.
	ready := make(chan struct{})
	go func() {
		for {
			select {
			case <-ready:
				return
			case <-time.After(time.Second):
				fmt.Fprintln(in, "echo console-ready")
			}
		}
	}()
	_, err := waitFor(regexp.MustCompile(`^console-ready`))
	close(ready)
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Second) // let a queued echo come and go
	var res []string
	for _, cmd := range cmds {
		fmt.Fprintf(in, "/nettool %s; echo nettool-done\n", cmd)
		line, err := waitFor(regexp.MustCompile(`(mib_per_s|p99_ms|error)=?`))
		if err != nil {
			return nil, err
		}
		res = append(res, line)
		waitFor(regexp.MustCompile(`^nettool-done`))
	}
	fmt.Fprintln(in, "poweroff -f")
	return res, nil
}

// appendTool writes base followed by a cpio archive holding /nettool:
// the kernel unpacks concatenated archives in order.
func appendTool(base, tool, out string) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(tool)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	buf.Write(b)
	w := cpio.Newc.Writer(&buf)
	if err := w.WriteRecord(cpio.StaticRecord(data, cpio.Info{Name: "nettool", Mode: cpio.S_IFREG | 0o755})); err != nil {
		return err
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o600)
}

func field(line, key string) float64 {
	m := regexp.MustCompile(key + `=([\d.]+)`).FindStringSubmatch(line)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/net:", err)
	harness.StopAll()
	os.Exit(1)
}
