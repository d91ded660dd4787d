// Command plane measures the data and egress planes against baselines
// taken in the same run:
//
//   - data-plane requests through a fork's data socket (a new connection
//     each, as a proxy makes them): latency p50/p99 and the throughput of
//     one large answer, against the same requests made inside the guest
//     over its loopback, to the same server;
//
//   - fork -> first request served on the fork's data socket, against
//     fork -> first command answered (alternating, same base);
//
//   - park -> wake -> the awaited reply delivered to a tenant blocked in
//     recv() on an egress connection (seen when its next request reaches
//     the platform), against park -> wake -> first command answered
//     (alternating wakes of one parked tenant).
//
// The tenant is nettool's HTTP server, started in the base and captured
// warm.
//
//	go run ./bench/plane [-n 200] [-mib 32] [-forks 5] [-wakes 5]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/internal/testharness"
)

func main() {
	n := flag.Int("n", 200, "small requests timed each way")
	mib := flag.Int("mib", 32, "MiB of the large answer")
	forks := flag.Int("forks", 5, "forks timed each way")
	wakes := flag.Int("wakes", 5, "wakes timed each way")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()
	tmp, err := os.MkdirTemp("", "nether-bench-plane-")
	check(err)
	defer os.RemoveAll(tmp)
	// Static (netgo, osusergo): the guest has no libc.
	check(testharness.Build(repo, tmp, []string{"-trimpath", "-tags", "netgo,osusergo"}, "./test/nettool"))

	// The base: the tenant's server warm on 127.0.0.1:8080, an egress
	// listener on 9090.
	base, err := harness.Start(repo, "app_port = 8080\negress_port = 9090\n")
	check(err)
	c, err := base.Dial(60 * time.Second)
	check(err)
	check(harness.Run(c, "true"))
	b, err := os.ReadFile(filepath.Join(tmp, "nettool"))
	check(err)
	check(os.WriteFile(filepath.Join(base.Dir, "nettool"), b, 0o700))
	check(harness.Run(c, "__put__ nettool /tmp/nettool"))
	check(harness.Run(c, "chmod 755 /tmp/nettool; /tmp/nettool serve 127.0.0.1:8080 >/dev/null 2>&1 &"))
	check(harness.Run(c, "for i in $(seq 50); do netstat -ltn | grep -q ':8080 ' && exit 0; sleep 0.1; done; exit 1"))
	_, err = harness.Exec(c, "__snapshot__ base")
	check(err)
	art := filepath.Join(tmp, "base")
	check(os.Rename(filepath.Join(base.Dir, "base"), art))
	_, _ = harness.Exec(c, "__shutdown__")
	base.Wait(30 * time.Second)
	base.Close()

	// 1. Requests: through the data socket and inside the guest, in turn.
	fork, err := harness.Start(repo, "restore = 1\nrestore_from = "+art+"\ndata_socket = data.sock\n")
	check(err)
	fc, err := fork.Dial(60 * time.Second)
	check(err)
	check(harness.Run(fc, "true"))
	hc := viaSocket(filepath.Join(fork.Dir, "data.sock"))
	var hostSmall, guestSmall []time.Duration
	var hostRate, guestRate []float64
	for round := 0; round < 2; round++ {
		hostSmall = append(hostSmall, timeGets(hc, "http://tenant/small", *n/2)...)
		out, err := harness.Exec(fc, fmt.Sprintf("/tmp/nettool get http://127.0.0.1:8080/small %d", *n/2))
		check(err)
		guestSmall = append(guestSmall, percentiles(out)...)
		big := timeGets(hc, fmt.Sprintf("http://tenant/big?mib=%d", *mib), 1)
		hostRate = append(hostRate, float64(*mib)/big[0].Seconds())
		out, err = harness.Exec(fc, fmt.Sprintf("/tmp/nettool get 'http://127.0.0.1:8080/big?mib=%d' 1", *mib))
		check(err)
		guestRate = append(guestRate, field(out, "mib_s"))
	}
	fc.Close()
	fork.Close()
	hs, gs := harness.Sorted(hostSmall), harness.Sorted(guestSmall)
	fmt.Printf("data plane, %d small requests each way (a new connection each), %d MiB answers (two rounds):\n", len(hs), *mib)
	fmt.Printf("  latency     data socket p50 %s p99 %s   in-guest loopback p50 %s p99 %s\n",
		ms(harness.Percentile(hs, 50)), ms(harness.Percentile(hs, 99)), ms(harness.Percentile(gs, 50)), ms(harness.Percentile(gs, 99)))
	fmt.Printf("  throughput  data socket %.1f / %.1f MiB/s   in-guest loopback %.1f / %.1f MiB/s   (%.2fx, %.2fx; target >= 0.5x)\n",
		hostRate[0], hostRate[1], guestRate[0], guestRate[1], hostRate[0]/guestRate[0], hostRate[1]/guestRate[1])

	// 2. Fork -> first request, against fork -> first command.
	var firstReq, firstCmd []time.Duration
	for i := 0; i < *forks; i++ {
		sb, err := harness.Start(repo, "restore = 1\nrestore_from = "+art+"\ndata_socket = data.sock\n")
		check(err)
		hc := viaSocket(filepath.Join(sb.Dir, "data.sock"))
		for {
			if _, err := hc.Get("http://tenant/small"); err == nil {
				break
			}
			if time.Since(sb.Started) > time.Minute {
				fail(fmt.Errorf("the fork's data socket never answered"))
			}
			time.Sleep(2 * time.Millisecond)
		}
		firstReq = append(firstReq, time.Since(sb.Started))
		sb.Close()
		d, err := harness.FirstCommand(repo, "restore = 1\nrestore_from = "+art+"\n")
		check(err)
		firstCmd = append(firstCmd, d)
	}
	fr, fcm := harness.Sorted(firstReq), harness.Sorted(firstCmd)
	fmt.Printf("fork -> first request on its data socket: p50 %s   fork -> first command: p50 %s   (%.2fx; target <= 1.2x)\n",
		ms(harness.Percentile(fr, 50)), ms(harness.Percentile(fcm, 50)), ratioP50(fr, fcm))

	// 3. Park -> wake -> awaited reply, against park -> wake -> first
	// command: one tenant waits in recv() through every park.
	egSock := filepath.Join(tmp, "egress.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: egSock, Net: "unix"})
	check(err)
	defer ln.Close()
	conf := func(from string) string {
		return "restore = 1\nrestore_from = " + from + "\negress_socket = " + egSock + "\n"
	}
	sb, err := harness.Start(repo, conf(art))
	check(err)
	cc, err := sb.Dial(60 * time.Second)
	check(err)
	check(harness.Run(cc, fmt.Sprintf("/tmp/nettool converse 127.0.0.1:9090 %d >/tmp/conv.out 2>&1 &", 2**wakes+2)))
	pc, r := acceptEgress(ln)
	readLine(pc, r) // request 1
	var toReply, toCmd []time.Duration
	req := 1
	for i := 0; i < 2**wakes; i++ {
		parkDir, err := os.MkdirTemp(tmp, "park-")
		check(err)
		_, err = harness.Exec(cc, "__park__ p")
		check(err)
		cc.Close()
		check(sb.Wait(30 * time.Second))
		check(os.Rename(filepath.Join(sb.Dir, "p"), filepath.Join(parkDir, "p")))
		sb.Close()
		pc.Close()
		sb, err = harness.Start(repo, conf(filepath.Join(parkDir, "p")))
		check(err)
		if i%2 == 0 {
			// The awaited reply: the resumed connection arrives, the
			// reply goes in, and the tenant's next request comes out.
			pc, r = acceptEgress(ln)
			fmt.Fprintf(pc, "reply %d\n", req)
			req++
			readLine(pc, r)
			toReply = append(toReply, time.Since(sb.Started))
			cc, err = sb.Dial(60 * time.Second)
			check(err)
		} else {
			cc, err = sb.Dial(60 * time.Second)
			check(err)
			check(harness.Run(cc, "true"))
			toCmd = append(toCmd, time.Since(sb.Started))
			pc, r = acceptEgress(ln)
			fmt.Fprintf(pc, "reply %d\n", req)
			req++
			readLine(pc, r)
		}
	}
	cc.Close()
	sb.Close()
	tr, tc := harness.Sorted(toReply), harness.Sorted(toCmd)
	fmt.Printf("park -> wake -> awaited reply delivered to recv(): p50 %s   park -> wake -> first command: p50 %s   (%.2fx; target <= 1.2x)\n",
		ms(harness.Percentile(tr, 50)), ms(harness.Percentile(tc, 50)), ratioP50(tr, tc))
}

// viaSocket is an HTTP client whose every request is a new connection to
// a data socket.
func viaSocket(sock string) *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func timeGets(c *http.Client, url string, n int) []time.Duration {
	var out []time.Duration
	for range n {
		t0 := time.Now()
		resp, err := c.Get(url)
		check(err)
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		check(err)
		if resp.StatusCode != 200 {
			fail(fmt.Errorf("GET %s: %s", url, resp.Status))
		}
		out = append(out, time.Since(t0))
	}
	return out
}

// percentiles turns nettool get's p50 and p99 into two samples each of
// weight one half: enough to compare medians and tails with the host's.
func percentiles(out string) []time.Duration {
	p50 := time.Duration(field(out, "p50_ms") * 1e6)
	p99 := time.Duration(field(out, "p99_ms") * 1e6)
	n := int(field(out, "n"))
	var d []time.Duration
	for i := 0; i < n; i++ {
		if i < n*98/100 {
			d = append(d, p50)
		} else {
			d = append(d, p99)
		}
	}
	return d
}

func field(out, name string) float64 {
	m := regexp.MustCompile(name + `=([\d.]+)`).FindStringSubmatch(out)
	if m == nil {
		fail(fmt.Errorf("no %s in %q", name, out))
	}
	f, err := strconv.ParseFloat(m[1], 64)
	check(err)
	return f
}

func acceptEgress(ln *net.UnixListener) (*net.UnixConn, *bufio.Reader) {
	ln.SetDeadline(time.Now().Add(time.Minute))
	c, err := ln.AcceptUnix()
	check(err)
	r := bufio.NewReader(c)
	readLine(c, r) // the preamble
	return c, r
}

func readLine(c *net.UnixConn, r *bufio.Reader) string {
	c.SetReadDeadline(time.Now().Add(time.Minute))
	l, err := r.ReadString('\n')
	check(err)
	return l
}

func ratioP50(a, b []time.Duration) float64 {
	return float64(harness.Percentile(a, 50)) / float64(harness.Percentile(b, 50))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/plane:", err)
	harness.StopAll()
	os.Exit(1)
}
