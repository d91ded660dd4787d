// Command nettool runs inside a test guest to stress and measure its
// network (busybox has no tool for either): the network tests put it into
// the guest with __put__, and bench/net adds it to a guest image.
//
//	nettool hold ADDR N        open N connections to ADDR at once and keep them open
//	                           until stdin closes or 20 s pass; print opened= failed=
//	nettool attempts ADDR N    try N connections one after another (3 s timeout each);
//	                           print ok= refused= timeout= and the p50/p99 time to an answer
//	nettool send ADDR MIB      write MIB MiB to ADDR; print the rate
//	nettool recv ADDR          read ADDR to its end; print bytes and the rate
//	nettool converse ADDR N    on one connection, N times: send "request <i>", wait in
//	                           recv() for a line, print "pid=<pid> got: <line>"
//	nettool serve ADDR         an HTTP server (a tenant's): /small answers "hello",
//	                           /big?mib=N streams N MiB
//	nettool get URL N          N GETs of URL, each on a new connection; print the
//	                           p50/p99 time to the whole answer and the rate
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	cmd, addr := os.Args[1], os.Args[2]
	arg := func() int {
		if len(os.Args) < 4 {
			usage()
		}
		n, err := strconv.Atoi(os.Args[3])
		if err != nil || n < 1 {
			usage()
		}
		return n
	}
	switch cmd {
	case "hold":
		hold(addr, arg())
	case "attempts":
		attempts(addr, arg())
	case "send":
		send(addr, arg())
	case "recv":
		recv(addr)
	case "converse":
		converse(addr, arg())
	case "serve":
		serve(addr)
	case "get":
		get(addr, arg())
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: nettool hold|attempts|converse ADDR N | send ADDR MIB | recv ADDR | serve ADDR | get URL N")
	os.Exit(2)
}

func hold(addr string, n int) {
	var (
		mu       sync.Mutex
		conns    []net.Conn
		failed   int
		reasons  = map[string]int{}
		wg       sync.WaitGroup
		deadline = time.Now().Add(20 * time.Second)
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				reasons[classify(err)]++
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	fmt.Printf("opened=%d failed=%d reasons=%v\n", len(conns), failed, reasons)
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
	}
	for _, c := range conns {
		c.Close()
	}
}

func attempts(addr string, n int) {
	var times []time.Duration
	counts := map[string]int{}
	for range n {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
		times = append(times, time.Since(t0))
		if err != nil {
			counts[classify(err)]++
			continue
		}
		counts["ok"]++
		c.Close()
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	fmt.Printf("ok=%d refused=%d timeout=%d other=%d p50_ms=%.1f p99_ms=%.1f\n",
		counts["ok"], counts["refused"], counts["timeout"], counts["other"],
		ms(times[len(times)/2]), ms(times[min(len(times)-1, len(times)*99/100)]))
}

func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return "refused"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}

func send(addr string, mib int) {
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	buf := make([]byte, 64<<10)
	t0 := time.Now()
	for range mib * 16 {
		if _, err := c.Write(buf); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, c) // the receiver's close says it has everything
	d := time.Since(t0)
	fmt.Printf("sent_bytes=%d ms=%.0f mib_per_s=%.1f\n", mib<<20, ms(d), float64(mib)/d.Seconds())
}

func recv(addr string) {
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	t0 := time.Now()
	n, err := io.Copy(io.Discard, c)
	d := time.Since(t0)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Printf("recv_bytes=%d ms=%.0f mib_per_s=%.1f\n", n, ms(d), float64(n)/(1<<20)/d.Seconds())
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// converse is a tenant's ordinary outbound client: a request, then a
// plain blocking read for the answer, N times on one connection. The
// egress tests park the sandbox while it waits.
func converse(addr string, n int) {
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	defer c.Close()
	pid := os.Getpid()
	fmt.Printf("pid=%d connected\n", pid)
	buf := make([]byte, 4096)
	for i := 1; i <= n; i++ {
		if _, err := fmt.Fprintf(c, "request %d\n", i); err != nil {
			fmt.Printf("pid=%d write: %v\n", pid, err)
			os.Exit(1)
		}
		var line []byte
		for len(line) == 0 || line[len(line)-1] != '\n' {
			k, err := c.Read(buf)
			line = append(line, buf[:k]...)
			if err != nil {
				fmt.Printf("pid=%d read: %v (after %q)\n", pid, err, line)
				os.Exit(1)
			}
		}
		fmt.Printf("pid=%d got: %s", pid, line)
	}
}

// serve is a tenant's ordinary HTTP server, for the data-plane benchmark.
func serve(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		mib, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		w.Header().Set("Content-Length", strconv.Itoa(mib<<20))
		buf := make([]byte, 1<<20)
		for range mib {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	})
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Println("serve:", err)
		os.Exit(1)
	}
}

// get times n GETs of url, each on a new connection.
func get(url string, n int) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 60 * time.Second}
	var took []time.Duration
	var bytes int64
	start := time.Now()
	for range n {
		t0 := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			fmt.Println("get:", err)
			os.Exit(1)
		}
		k, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			fmt.Println("get:", resp.Status, err)
			os.Exit(1)
		}
		bytes += k
		took = append(took, time.Since(t0))
	}
	total := time.Since(start)
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	pct := func(p float64) float64 { return float64(took[int(p*float64(len(took)-1))]) / 1e6 }
	fmt.Printf("n=%d p50_ms=%.2f p99_ms=%.2f mib_s=%.1f\n", n, pct(0.5), pct(0.99), float64(bytes)/(1<<20)/total.Seconds())
}
