package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/testharness"
)

// The network tests run every nether with net = 1 inside a netLab's box
// namespace: whatever the firewall does, no packet can leave the machine.

var (
	netBaseOnce sync.Once
	netBaseArt  string
	netBaseErr  = "the network base was never built"
	nettoolOnce sync.Once
	nettoolBin  string
	nettoolErr  error
)

// inLab launches nether in lab's box namespace with conf, in dir.
func inLab(t *testing.T, lab *netLab, dir string, conf ...string) *sandbox {
	t.Helper()
	sb := launch(t, testharness.Options{Dir: dir, Socket: filepath.Join(dir, "ctl.sock"), Conf: conf, NetNS: lab.box})
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "console.log")); err == nil {
				t.Logf("console.log (tail):\n%s", tail(string(b), 3000))
			}
		}
	})
	sb.waitListening(10 * time.Second)
	return sb
}

// netBase boots one net = 1 guest per test binary, inside a lab of its
// own, and captures it as a base.
func netBase(t *testing.T) string {
	t.Helper()
	netBaseOnce.Do(func() {
		lab := newNetLab(t)
		dir := filepath.Join(binDir, "net-base")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		sb := inLab(t, lab, dir, "net = 1", "sandbox_id = e2e-net-base")
		c := sb.dial()
		if out := mustRun(t, c, "ip -4 addr show eth0; cat /etc/resolv.conf"); !strings.Contains(out, "10.0.2.15/24") || !strings.Contains(out, "nameserver 10.0.2.3") {
			t.Fatalf("the guest's network is not configured:\n%s", out)
		}
		// The NIC announces the link's MTU and the guest's driver takes it.
		if out := strings.TrimSpace(mustRun(t, c, "cat /sys/class/net/eth0/mtu")); out != strconv.Itoa(engine.NICMTU) {
			t.Fatalf("eth0's MTU is %s, want %d", out, engine.NICMTU)
		}
		netBaseArt = takeSnapshot(t, sb, c, "netbase")
		shutdown(t, sb, c)
		netBaseErr = ""
	})
	if netBaseErr != "" {
		t.Fatalf("network base: %s", netBaseErr)
	}
	return netBaseArt
}

// netFork restores the network base inside lab with conf.
func netFork(t *testing.T, lab *netLab, conf ...string) (*sandbox, *client.Client) {
	t.Helper()
	base := netBase(t)
	sb := inLab(t, lab, t.TempDir(), append([]string{"restore = 1", "restore_from = " + base, "net = 1"}, conf...)...)
	return sb, sb.dial()
}

// nettool builds test/nettool, static, once per test binary.
func nettool(t *testing.T) string {
	t.Helper()
	nettoolOnce.Do(func() {
		dir := filepath.Join(binDir, "nettool")
		nettoolErr = testharness.Build(repoRoot, dir, []string{"-trimpath", "-tags", "netgo,osusergo"}, "./test/nettool") // static: the guest has no libc
		nettoolBin = filepath.Join(dir, "nettool")
	})
	if nettoolErr != nil {
		t.Fatalf("building nettool: %v", nettoolErr)
	}
	return nettoolBin
}

// putTool copies nettool into the guest as /tmp/nettool.
func putTool(t *testing.T, sb *sandbox, c *client.Client) {
	t.Helper()
	b, err := os.ReadFile(nettool(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb.dir, "nettool"), b, 0o700); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "__put__ nettool /tmp/nettool")
	mustRun(t, c, "chmod 755 /tmp/nettool")
}

func netlogOf(t *testing.T, c *client.Client) []client.NetLogEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.NetLog(ctx)
	if err != nil {
		t.Fatalf("__netlog__: %v", err)
	}
	return l.Entries
}

func hasFlow(entries []client.NetLogEntry, addr string, allowed bool) bool {
	for _, e := range entries {
		if e.Addr == addr && e.Allowed == allowed && e.Proto == "TCP" {
			return true
		}
	}
	return false
}

func statsOf(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	body, err := c.Query(context.Background(), "__stats__")
	if err != nil {
		t.Fatalf("__stats__: %v", err)
	}
	return parseReport(body)
}

// timedConnect runs busybox nc against addr in the guest and returns what
// it read and how long the guest waited for an answer (/proc/uptime:
// 10 ms resolution; busybox date has no nanoseconds).
func timedConnect(t *testing.T, c *client.Client, addr string) (string, time.Duration) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	out, _ := run(t, c, fmt.Sprintf("a=$(cut -d' ' -f1 /proc/uptime); nc -w 5 %s %s </dev/null 2>/dev/null; b=$(cut -d' ' -f1 /proc/uptime); echo; echo uptimes=$a,$b", host, port))
	m := regexp.MustCompile(`uptimes=([\d.]+),([\d.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("nc %s: %q", addr, out)
	}
	a, _ := strconv.ParseFloat(m[1], 64)
	b, _ := strconv.ParseFloat(m[2], 64)
	return strings.TrimSpace(strings.Split(out, "uptimes=")[0]), time.Duration((b - a) * float64(time.Second))
}

// TestNetFirewall: the default firewall of a real guest. A public host
// (203.0.113.2 in the lab) is reached by address and by name through
// DNS at 10.0.2.3; the host's loopback through the gateway, the metadata
// address and a private address are refused at once and never reached
// (decoy listeners count connections); every flow is in __netlog__,
// counted in __stats__ and on the timeline.
func TestNetFirewall(t *testing.T) {
	lab := newNetLab(t)
	pub := lab.listen(lab.pub, "203.0.113.2:8080", httpHello("pub", 0))
	loop := lab.listen(lab.box, "127.0.0.1:9090", hello("the host's loopback"))
	meta := lab.listen(lab.box, "169.254.169.254:80", hello("the metadata decoy"))
	priv := lab.listen(lab.box, "192.168.77.1:80", hello("the private decoy"))
	sb, c := netFork(t, lab)

	info := sb.info(c)
	if info["net"] != "on" || info["firewall"] != "on" {
		t.Errorf("__info__ net=%s firewall=%s", info["net"], info["firewall"])
	}
	if out := mustRun(t, c, "wget -q -O - http://203.0.113.2:8080/"); out != "hello from pub\n" {
		t.Errorf("public by address: %q", out)
	}
	if out := mustRun(t, c, "wget -q -O - http://public.test:8080/"); out != "hello from pub\n" {
		t.Errorf("public by name: %q", out)
	}
	if out, exit := run(t, c, "nslookup no-such-name.test 10.0.2.3"); exit == 0 {
		t.Errorf("a name nobody has resolved: %q", out)
	}
	for _, tc := range []struct{ name, addr string }{
		{"the host's loopback through the gateway", "10.0.2.2:9090"},
		{"the metadata address", "169.254.169.254:80"},
		{"the metadata address by name", "metadata.test:80"},
		{"a private address", "192.168.77.1:80"},
	} {
		out, took := timedConnect(t, c, tc.addr)
		t.Logf("%s: refused after %s", tc.name, took.Round(time.Millisecond))
		if out != "" {
			t.Errorf("%s answered: %q", tc.name, out)
		}
		if took > 2*time.Second {
			t.Errorf("%s: the guest waited %s for its refusal; a block must refuse, not time out", tc.name, took)
		}
	}
	for name, s := range map[string]*server{"loopback": loop, "metadata": meta, "private": priv} {
		if n := s.accepted.Load(); n != 0 {
			t.Errorf("the %s listener was reached %d times through a firewall that blocks it", name, n)
		}
	}
	if pub.accepted.Load() != 2 {
		t.Errorf("the public server was reached %d times, want 2", pub.accepted.Load())
	}
	log := netlogOf(t, c)
	for _, want := range []struct {
		addr  string
		allow bool
	}{{"203.0.113.2:8080", true}, {"10.0.2.2:9090", false}, {"169.254.169.254:80", false}, {"192.168.77.1:80", false}} {
		if !hasFlow(log, want.addr, want.allow) {
			t.Errorf("__netlog__ has no TCP %s allowed=%v: %+v", want.addr, want.allow, log)
		}
	}
	st := statsOf(t, c)
	if blocked, _ := strconv.Atoi(st["net_blocked"]); blocked < 4 {
		t.Errorf("__stats__ net_blocked=%s, want at least 4", st["net_blocked"])
	}
	if rx, _ := strconv.Atoi(st["net_rx_bytes"]); rx < 2*len("hello from pub\n") {
		t.Errorf("__stats__ net_rx_bytes=%s", st["net_rx_bytes"])
	}
	ev, err := c.Events(context.Background(), 0)
	if err != nil || !strings.Contains(eventTexts(ev), "NET TCP 169.254.169.254:80 BLOCK") {
		t.Errorf("no NET event for the blocked metadata flow (%v):\n%s", err, eventTexts(ev))
	}
	line := shutdown(t, sb, c)
	if !regexp.MustCompile(`net_tx=[1-9]\d* net_rx=[1-9]\d* net_blocked=[4-9]`).MatchString(line) {
		t.Errorf("final record %q does not count the network", line)
	}
}

// TestNetRules: a fork's firewall is its own nether.conf's. net_allow
// opens the gateway to the host's loopback (and nothing else), net_block
// closes a public range, net_open lets private addresses through.
func TestNetRules(t *testing.T) {
	t.Parallel()
	lab := newNetLab(t)
	lab.listen(lab.pub, "203.0.113.2:8080", hello("pub"))
	lab.listen(lab.box, "127.0.0.1:9090", hello("loopback"))
	lab.listen(lab.box, "169.254.169.254:80", hello("metadata"))
	lab.listen(lab.box, "192.168.77.1:80", hello("private"))
	for _, tc := range []struct {
		conf    string
		reached map[string]bool
	}{
		{"net_allow = 10.0.2.2/32", map[string]bool{"10.0.2.2:9090": true, "169.254.169.254:80": false, "203.0.113.2:8080": true}},
		{"net_block = 203.0.113.0/24, 198.51.100.0/24", map[string]bool{"203.0.113.2:8080": false, "10.0.2.2:9090": false}},
		{"net_open = 1", map[string]bool{"192.168.77.1:80": true, "10.0.2.2:9090": true, "203.0.113.2:8080": true}},
	} {
		t.Run(tc.conf, func(t *testing.T) {
			sb, c := netFork(t, lab, tc.conf)
			for addr, want := range tc.reached {
				out, _ := timedConnect(t, c, addr)
				if got := strings.HasPrefix(out, "hello from"); got != want {
					t.Errorf("%s: reached=%v (%q), want %v", addr, got, out, want)
				}
			}
			if tc.conf == "net_open = 1" {
				if info := sb.info(c); info["firewall"] != "off" {
					t.Errorf("__info__ firewall=%s with net_open = 1", info["firewall"])
				}
			}
		})
	}
}

// TestNetRateCap: net_rate_kbps paces a download without losing a byte.
func TestNetRateCap(t *testing.T) {
	lab := newNetLab(t)
	const size = 1 << 20
	lab.listen(lab.pub, "203.0.113.2:8080", httpHello("pub", size))
	_, c := netFork(t, lab, "net_rate_kbps = 2000")
	if info := parseReport(mustRun(t, c, "__info__")); info["net_rate_kbps"] != "2000" {
		t.Errorf("__info__ net_rate_kbps=%s", info["net_rate_kbps"])
	}
	t0 := time.Now()
	out := mustRun(t, c, "wget -q -O /tmp/big http://203.0.113.2:8080/ && wc -c < /tmp/big")
	took := time.Since(t0)
	if strings.TrimSpace(out) != strconv.Itoa(size) {
		t.Fatalf("downloaded %q bytes, want %d", out, size)
	}
	rate := float64(size) * 8 / 1000 / took.Seconds()
	t.Logf("1 MiB under net_rate_kbps = 2000 took %s: %.0f kbit/s", took.Round(time.Millisecond), rate)
	if rate > 2000*1.5 {
		t.Errorf("the download ran at %.0f kbit/s under a cap of 2000", rate)
	}
}

// TestNetAfterWake: a connection open at a park cannot cross it (its host
// socket is gone); after the wake the guest's blocked reader sees a reset
// at once, not a hang, and a new connection works. The time from the
// wake to the reset is read on the guest's own clock (/proc/uptime runs
// on from the capture), without the test's polling in it.
func TestNetAfterWake(t *testing.T) {
	lab := newNetLab(t)
	held := lab.listen(lab.pub, "203.0.113.2:7000", hold)
	lab.listen(lab.pub, "203.0.113.2:8080", hello("pub"))
	sb, c := netFork(t, lab)
	mustRun(t, c, "(nc 203.0.113.2 7000 </dev/zero >/dev/null 2>&1; echo ended $(cut -d' ' -f1 /proc/uptime) > /tmp/nc.status) >/dev/null 2>&1 &")
	deadline := time.Now().Add(20 * time.Second)
	for held.accepted.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the guest's connection never reached the server")
		}
		time.Sleep(20 * time.Millisecond)
	}
	parkedAt := mustRun(t, c, "cut -d' ' -f1 /proc/uptime")
	body, exit := run(t, c, "__park__ parked")
	if exit != 0 {
		t.Fatalf("__park__: %q", body)
	}
	sb.wait(30 * time.Second)
	woken := inLab(t, lab, t.TempDir(), "restore = 1", "restore_from = "+filepath.Join(sb.dir, "parked"), "net = 1")
	wc := woken.dial()
	t0 := time.Now()
	for {
		out, _ := run(t, wc, "cat /tmp/nc.status 2>/dev/null")
		if f := strings.Fields(out); len(f) == 2 && f[0] == "ended" {
			at, _ := strconv.ParseFloat(f[1], 64)
			before, _ := strconv.ParseFloat(strings.TrimSpace(parkedAt), 64)
			// The guest's clock stood still while it was parked, so
			// the reset's uptime less the park's is the time the woken
			// guest ran before its connection ended.
			t.Logf("the connection from before the park ended %.0f ms of guest time after the park command (the test saw it %s after the wake's first command)",
				(at-before)*1000, time.Since(t0).Round(time.Millisecond))
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Fatal("a connection from before the park still hangs 10 s after the wake")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, _ := timedConnect(t, wc, "203.0.113.2:8080"); out != "hello from pub" {
		t.Errorf("a new connection after the wake: %q", out)
	}
}

// TestNetForksApart: two forks of one base are both 10.0.2.15, run side
// by side, and never see each other: each has its own NAT, its own
// netlog and counters, its own MAC, and one's listener cannot be reached
// from the other (its 10.0.2.15 is its own).
func TestNetForksApart(t *testing.T) {
	t.Parallel()
	lab := newNetLab(t)
	lab.listen(lab.pub, "203.0.113.2:8080", hello("pub 8080"))
	lab.listen(lab.pub, "203.0.113.2:8081", hello("pub 8081"))
	sbA, a := netFork(t, lab)
	sbB, b := netFork(t, lab)
	// A listens on its 10.0.2.15:9000 and notes any connection it gets.
	mustRun(t, a, "(nc -l -p 9000 </dev/null >/dev/null 2>&1 && echo reached > /tmp/listener) >/dev/null 2>&1 &")
	mustRun(t, a, "for i in 1 2 3 4 5 6 7 8 9 10; do netstat -ltn | grep -q ':9000 ' && break; sleep 0.2; done; netstat -ltn | grep ':9000 '")
	if out, _ := timedConnect(t, b, "10.0.2.15:9000"); out != "" {
		t.Errorf("B read %q from 10.0.2.15:9000", out)
	}
	if out, _ := timedConnect(t, a, "203.0.113.2:8080"); out != "hello from pub 8080" {
		t.Errorf("A's own flow: %q", out)
	}
	if out, _ := timedConnect(t, b, "203.0.113.2:8081"); out != "hello from pub 8081" {
		t.Errorf("B's own flow: %q", out)
	}
	// Each fork's NIC has an address of its own, set at the restore.
	macs := map[string]bool{strings.ToLower(engine.NICMAC): true}
	for name, c := range map[string]*client.Client{"A": a, "B": b} {
		mac := strings.TrimSpace(mustRun(t, c, "cat /sys/class/net/eth0/address"))
		if macs[mac] {
			t.Errorf("fork %s's eth0 is %s, the base's or the other fork's", name, mac)
		}
		macs[mac] = true
	}
	if out, _ := run(t, a, "cat /tmp/listener 2>/dev/null"); out != "" {
		t.Errorf("A's listener was reached (%q): B's 10.0.2.15 reached into A", out)
	}
	for _, f := range []struct {
		name       string
		c          *client.Client
		own, other string
	}{{"A", a, "203.0.113.2:8080", "203.0.113.2:8081"}, {"B", b, "203.0.113.2:8081", "203.0.113.2:8080"}} {
		log := netlogOf(t, f.c)
		if !hasFlow(log, f.own, true) || hasFlow(log, f.other, true) {
			t.Errorf("%s's __netlog__ should hold its own flow %s and not %s: %+v", f.name, f.own, f.other, log)
		}
	}
	shutdown(t, sbA, a)
	shutdown(t, sbB, b)
}

// TestNetFlood: a hostile guest opens connections as fast as it can and
// hammers a blocked address; nether caps its flows, counts the refusals,
// keeps answering and stays small, and the guest's network works again
// once the flood ends.
func TestNetFlood(t *testing.T) {
	lab := newNetLab(t)
	held := lab.listen(lab.pub, "203.0.113.2:7000", hold)
	lab.listen(lab.pub, "203.0.113.2:8080", hello("pub"))
	meta := lab.listen(lab.box, "169.254.169.254:80", hello("metadata"))
	sb, c := netFork(t, lab)
	putTool(t, sb, c)
	out := mustRun(t, c, "/tmp/nettool hold 203.0.113.2:7000 1500 </dev/null")
	t.Logf("hold 1500: %s (the server accepted %d)", strings.TrimSpace(out), held.accepted.Load())
	if n := held.accepted.Load(); n > 1100 {
		t.Errorf("the server accepted %d of the guest's connections; the flow cap should stop it near 1024", n)
	}
	out = mustRun(t, c, "/tmp/nettool attempts 169.254.169.254:80 300")
	t.Logf("300 attempts on the metadata address: %s", strings.TrimSpace(out))
	if !strings.Contains(out, "ok=0 ") || meta.accepted.Load() != 0 {
		t.Errorf("the flood reached the metadata decoy: %s, accepted %d", out, meta.accepted.Load())
	}
	if m := regexp.MustCompile(`p99_ms=([\d.]+)`).FindStringSubmatch(out); m != nil {
		if p99, _ := strconv.ParseFloat(m[1], 64); p99 > 1000 {
			t.Errorf("blocked attempts took up to %.0f ms to be refused", p99)
		}
	}
	st := statsOf(t, c)
	t.Logf("after the flood: net_blocked=%s", st["net_blocked"])
	// The e2e nether is built with -race, whose shadow memory inflates
	// every allocation several times: this bound only catches a runaway
	// (bench/net measures the stack's real cost).
	if rss := testharness.RSSKiB(sb.h.Pid()); rss > 1<<20 {
		t.Errorf("nether's RSS is %d KiB after the flood", rss)
	} else {
		t.Logf("nether's RSS after the flood: %d KiB", rss)
	}
	if out, _ := timedConnect(t, c, "203.0.113.2:8080"); out != "hello from pub" {
		t.Errorf("a connection after the flood: %q", out)
	}
}
