package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

// The planes' tests fork one base whose guest runs a warm tenant server
// (busybox httpd on 127.0.0.1:8080, started before the capture) and has
// nettool, the tenant's outbound client, in /tmp.

const (
	planeAppPort    = 8080
	planeEgressPort = 9090
	bigFileMiB      = 8
)

var (
	planeOnce    sync.Once
	planeArt     string
	planeErr     = "the planes' base was never built"
	planeHTTPPID string
)

func planeBase(t *testing.T) string {
	t.Helper()
	needGuest(t)
	planeOnce.Do(func() {
		dir := filepath.Join(binDir, "plane-base")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		sb := startIn(t, dir, "sandbox_id = e2e-plane-base", fmt.Sprintf("app_port = %d", planeAppPort), fmt.Sprintf("egress_port = %d", planeEgressPort))
		c := sb.dial()
		putTool(t, sb, c)
		mustRun(t, c, fmt.Sprintf("mkdir -p /www && echo 'hello from the tenant' > /www/index.html && dd if=/dev/urandom of=/www/big bs=1M count=%d 2>/dev/null", bigFileMiB))
		mustRun(t, c, fmt.Sprintf("httpd -p 127.0.0.1:%d -h /www", planeAppPort))
		planeHTTPPID = strings.TrimSpace(mustRun(t, c, "pidof httpd"))
		mustRun(t, c, fmt.Sprintf("for i in $(seq 50); do netstat -ltn | grep -q ':%d ' && exit 0; sleep 0.1; done; exit 1", planeEgressPort))
		planeArt = takeSnapshot(t, sb, c, "planebase")
		shutdown(t, sb, c)
		planeErr = ""
	})
	if planeErr != "" {
		t.Fatalf("planes' base: %s", planeErr)
	}
	return planeArt
}

// planeFork forks the base with a data socket and conf.
func planeFork(t *testing.T, conf ...string) (*sandbox, *client.Client, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "data.sock")
	sb := restoreIn(t, dir, planeBase(t), append([]string{"data_socket = " + sock}, conf...)...)
	return sb, sb.dial(), sock
}

// httpVia is an HTTP client whose every connection is a new connection
// to the data socket, as a platform's proxy makes them.
func httpVia(sock string) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			DisableKeepAlives: true,
		},
	}
}

func get(c *http.Client, path string) (string, error) {
	resp, err := c.Get("http://tenant" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %s", resp.Status)
	}
	return string(b), nil
}

// TestDataPlane: a fork of a base with a warm server answers concurrent
// requests on its own data socket without that server restarting; the
// meters count them; __info__ reports the plane.
func TestDataPlane(t *testing.T) {
	t.Parallel()
	sb, c, sock := planeFork(t)
	info := sb.info(c)
	for k, want := range map[string]string{"data_plane": "on", "app_port": "8080", "egress_plane": "off", "max_data_conns": "48"} {
		if info[k] != want {
			t.Errorf("__info__ %s=%q, want %q", k, info[k], want)
		}
	}
	hc := httpVia(sock)
	start := time.Now()
	body, err := get(hc, "/index.html")
	if err != nil || body != "hello from the tenant\n" {
		t.Fatalf("first request: %q, %v", body, err)
	}
	t.Logf("first request on the fork's data socket answered in %s", time.Since(start).Round(time.Millisecond))
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if body, err := get(hc, "/index.html"); err != nil || body != "hello from the tenant\n" {
				t.Errorf("request %d: %q, %v", i, body, err)
			}
		}()
	}
	wg.Wait()
	if pid := strings.TrimSpace(mustRun(t, c, "pidof httpd")); pid != planeHTTPPID {
		t.Errorf("httpd is pid %s in the fork, %s in the base: the warm server restarted", pid, planeHTTPPID)
	}
	st := statsOf(t, c)
	if n, _ := strconv.Atoi(st["data_conns"]); n < 17 {
		t.Errorf("__stats__ data_conns=%s, want at least 17", st["data_conns"])
	}
	if out, _ := strconv.Atoi(st["bytes_out"]); out < 17*len("hello from the tenant\n") {
		t.Errorf("__stats__ bytes_out=%s does not count the data plane", st["bytes_out"])
	}
	line := shutdown(t, sb, c)
	if !regexp.MustCompile(`data_conns=(1[7-9]|[2-9]\d|\d{3,}) data_ms=\d+$`).MatchString(line) {
		t.Errorf("final record %q does not count the data plane", line)
	}
}

// TestDataPlaneCaps: the 49th connection (past the default and ceiling
// of max_data_conns) is closed at once; connections idle both ways for
// data_idle_ms are reaped; data_rate_kbps paces a download without
// losing a byte.
func TestDataPlaneCaps(t *testing.T) {
	sb, c, sock := planeFork(t, "data_idle_ms = 3000", "data_rate_kbps = 16000")
	var held []net.Conn
	for range 48 {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		held = append(held, conn)
	}
	time.Sleep(100 * time.Millisecond)
	over, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	over.SetReadDeadline(time.Now().Add(5 * time.Second))
	t0 := time.Now()
	if n, err := over.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("the 49th connection read %d, %v; want it closed", n, err)
	}
	t.Logf("the 49th connection was closed after %s", time.Since(t0).Round(time.Millisecond))
	over.Close()
	// The held connections say nothing: reaped after 3 s.
	for i, conn := range held {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("held connection %d: %v, want it reaped", i, err)
		}
	}
	// The rate cap: 8 MiB at 16000 kbit/s is about 4.2 s.
	start := time.Now()
	body, err := get(httpVia(sock), "/big")
	d := time.Since(start)
	if err != nil || len(body) != bigFileMiB<<20 {
		t.Fatalf("the download: %d bytes, %v", len(body), err)
	}
	rate := float64(len(body)*8) / d.Seconds() / 1000
	t.Logf("%d MiB under data_rate_kbps = 16000 took %s: %.0f kbit/s", bigFileMiB, d.Round(time.Millisecond), rate)
	if rate > 16000*1.5 {
		t.Errorf("the download ran at %.0f kbit/s under a cap of 16000", rate)
	}
	st := statsOf(t, c)
	t.Logf("__stats__ data_conns=%s data_ms=%s", st["data_conns"], st["data_ms"])
	shutdown(t, sb, c)
}

// egressListener is the platform's egress socket.
type egressListener struct {
	ln    *net.UnixListener
	conns chan *net.UnixConn
}

func listenEgress(t *testing.T) (*egressListener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	e := &egressListener{ln: ln, conns: make(chan *net.UnixConn, 8)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			e.conns <- c
		}
	}()
	return e, path
}

// accept takes the next egress connection and reads its preamble: the
// connection id, resume and the boot it belongs to.
func (e *egressListener) accept(t *testing.T) (*net.UnixConn, *bufio.Reader, string, string, string) {
	t.Helper()
	select {
	case c := <-e.conns:
		t.Cleanup(func() { c.Close() })
		r := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := r.ReadString('\n')
		c.SetReadDeadline(time.Time{})
		m := regexp.MustCompile(`^NETHER-EGRESS v1 conn=([0-9a-f]{16}) resume=([01]) boot=(\S+)\n$`).FindStringSubmatch(line)
		if err != nil || m == nil {
			t.Fatalf("egress preamble %q, %v", line, err)
		}
		return c, r, m[1], m[2], m[3]
	case <-time.After(30 * time.Second):
		t.Fatal("no egress connection in 30 s")
	}
	return nil, nil, "", "", ""
}

func readLine(t *testing.T, c *net.UnixConn, r *bufio.Reader) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading from the tenant: %q, %v", line, err)
	}
	return line
}

// TestEgressParkAwait is the play the planes exist for: a tenant's
// ordinary blocking recv() on an outbound request sleeps through its
// sandbox's park and completes after the wake, in another nether, and
// again across a second park; its process keeps its PID throughout.
func TestEgressParkAwait(t *testing.T) {
	t.Parallel()
	eg, egSock := listenEgress(t)
	dir := t.TempDir()
	sb := restoreIn(t, dir, planeBase(t), "egress_socket = "+egSock)
	c := sb.dial()
	if info := sb.info(c); info["egress_plane"] != "on" || info["egress_port"] != "9090" {
		t.Errorf("__info__ egress_plane=%s egress_port=%s", info["egress_plane"], info["egress_port"])
	}
	pid := strings.TrimSpace(mustRun(t, c, fmt.Sprintf("/tmp/nettool converse 127.0.0.1:%d 2 > /tmp/conv.out 2>&1 & echo $!", planeEgressPort)))
	pc, r, id, resume, boot := eg.accept(t)
	if resume != "0" {
		t.Errorf("a new egress connection has resume=%s", resume)
	}
	if want := sb.info(c)["boot_id"]; boot != want {
		t.Errorf("the preamble's boot=%s, __info__ boot_id=%s", boot, want)
	}
	if got := readLine(t, pc, r); got != "request 1\n" {
		t.Fatalf("the platform read %q", got)
	}

	// Generation 1: park while the tenant waits in recv().
	wake := func(gen int) *sandbox {
		t.Helper()
		body, exit := run(t, c, "__park__ parked")
		if exit != 0 || !strings.HasPrefix(body, "OK parked parked") {
			t.Fatalf("generation %d __park__: %q exit %d", gen, body, exit)
		}
		sb.wait(30 * time.Second)
		return restoreIn(t, t.TempDir(), filepath.Join(sb.dir, "parked"), "egress_socket = "+egSock)
	}
	woken := wake(1)
	t0 := time.Now()
	pc2, r2, id2, resume2, boot2 := eg.accept(t)
	t.Logf("generation 1: the resumed egress connection reached the platform %s after the woken nether listened", time.Since(t0).Round(time.Millisecond))
	if id2 != id || resume2 != "1" {
		t.Fatalf("after the wake: conn=%s resume=%s, want conn=%s resume=1", id2, resume2, id)
	}
	// The same connection, a new boot: the preamble says which.
	wc := woken.dial()
	if now := woken.info(wc)["boot_id"]; boot2 == boot || boot2 != now {
		t.Errorf("after the wake the preamble's boot=%s (before %s, the woken nether's %s)", boot2, boot, now)
	}
	pc.Close()
	fmt.Fprintf(pc2, "reply 1\n")
	// The tenant's recv() returns and it sends its second request on
	// the same connection.
	if got := readLine(t, pc2, r2); got != "request 2\n" {
		t.Fatalf("the platform read %q after the first reply", got)
	}
	sb, c = woken, wc

	// Generation 2: park again, in the middle of the second recv().
	woken2 := wake(2)
	pc3, _, id3, resume3, _ := eg.accept(t)
	if id3 != id || resume3 != "1" {
		t.Fatalf("after the second wake: conn=%s resume=%s, want conn=%s resume=1", id3, resume3, id)
	}
	pc2.Close()
	fmt.Fprintf(pc3, "reply 2\n")
	c2 := woken2.dial()
	var out string
	deadline := time.Now().Add(20 * time.Second)
	for {
		out = mustRun(t, c2, "cat /tmp/conv.out")
		if strings.Count(out, "\n") >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := fmt.Sprintf("pid=%s connected\npid=%s got: reply 1\npid=%s got: reply 2\n", pid, pid, pid)
	if out != want {
		t.Fatalf("the tenant wrote:\n%s\nwant:\n%s", out, want)
	}
	shutdown(t, woken2, c2)
}

// TestParkDrainGate: bytes the data plane holds for a platform that
// stopped reading cannot cross a park: __park__ refuses, naming the
// connection, and the sandbox keeps running; park_dirty = 1 parks anyway.
func TestParkDrainGate(t *testing.T) {
	t.Parallel()
	for _, dirty := range []bool{false, true} {
		t.Run(fmt.Sprintf("park_dirty=%v", dirty), func(t *testing.T) {
			conf := []string{"snapshot_allow_dirty = 1"}
			if dirty {
				conf = append(conf, "park_dirty = 1")
			}
			sb, c, sock := planeFork(t, conf...)
			conn, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Ask for the big file and never read the answer.
			fmt.Fprintf(conn, "GET /big HTTP/1.0\r\n\r\n")
			time.Sleep(2 * time.Second)
			body, exit := run(t, c, "__park__ parked")
			if !dirty {
				if exit == 0 || !strings.Contains(body, "undelivered bytes") || !strings.Contains(body, "data connection") {
					t.Fatalf("__park__ with a wedged platform: %q exit %d, want ERR naming the data connection", body, exit)
				}
				t.Logf("%s", strings.TrimSpace(body))
				if out := mustRun(t, c, "echo still running"); out != "still running\n" {
					t.Fatalf("after the refused park: %q", out)
				}
				shutdown(t, sb, c)
				return
			}
			if exit != 0 || !strings.HasPrefix(body, "OK parked parked") {
				t.Fatalf("__park__ with park_dirty = 1: %q exit %d", body, exit)
			}
			sb.wait(30 * time.Second)
		})
	}
}

// TestDataSocketIsAFile: a data_socket path holding a regular file stops
// nether before it boots anything, names the key, and leaves the file.
func TestDataSocketIsAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "data.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := runToEnd(t, testharness.Options{Dir: dir, Socket: filepath.Join(dir, "ctl.sock"),
		Conf: []string{"app_port = 8080", "data_socket = " + path}}, 30*time.Second)
	out := sb.stdout.String() + sb.stderr.String()
	if code := sb.h.ExitCode(); code == 0 {
		t.Fatalf("nether exited 0 with a regular file at data_socket:\n%s", out)
	}
	if !strings.Contains(out, "data_socket "+path+" exists and is not a socket") {
		t.Fatalf("the error does not name data_socket:\n%s", out)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "not a socket" {
		t.Fatalf("the file at data_socket was touched: %q, %v", b, err)
	}
	if len(sb.h.QEMUChildren()) > 0 {
		t.Fatal("nether started QEMU before refusing its data socket")
	}
}

// TestEgressFlood: a tenant that opens egress connections as fast as it
// can gets max_data_conns of them bridged and the rest closed at once;
// the control socket keeps answering and the platform sees no more than
// the cap.
func TestEgressFlood(t *testing.T) {
	t.Parallel()
	eg, egSock := listenEgress(t)
	sb := restoreIn(t, t.TempDir(), planeBase(t), "egress_socket = "+egSock, "max_data_conns = 8")
	c := sb.dial()
	// 100 connections held open for a while, from the guest.
	mustRun(t, c, fmt.Sprintf("(sleep 6 | /tmp/nettool hold 127.0.0.1:%d 100 > /tmp/hold.out 2>&1) >/dev/null 2>&1 &", planeEgressPort))
	var platform []*net.UnixConn
	deadline := time.After(4 * time.Second)
collect:
	for {
		select {
		case pc := <-eg.conns:
			platform = append(platform, pc)
			defer pc.Close()
		case <-deadline:
			break collect
		}
	}
	t0 := time.Now()
	if out := mustRun(t, c, "echo alive"); out != "alive\n" {
		t.Errorf("the control socket during the flood: %q", out)
	}
	t.Logf("a command during the flood answered in %s; the platform got %d connections", time.Since(t0).Round(time.Millisecond), len(platform))
	if len(platform) != 8 {
		t.Errorf("the platform got %d egress connections under max_data_conns = 8", len(platform))
	}
	shutdown(t, sb, c)
}
