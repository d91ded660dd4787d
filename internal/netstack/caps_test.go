package netstack

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestCaps: past MaxFlows a TCP connect is reset and a UDP flow gets
// nothing; past MaxHalfOpen a connect is reset; each refusal is counted
// and reported with its reason.
func TestCaps(t *testing.T) {
	l := echoServer(t)
	srv := udpEcho(t)
	for _, tc := range []struct {
		name   string
		cfg    Config
		reason string
		run    func(t *testing.T, r rig, release func())
	}{
		{"TCP past the flow limit", Config{MaxFlows: 2}, reasonFlows, func(t *testing.T, r rig, _ func()) {
			for i := 0; i < 2; i++ {
				c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
			}
			if c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr())); err == nil {
				c.Close()
				t.Fatal("a third flow connected")
			}
		}},
		{"UDP past the flow limit", Config{MaxFlows: 1}, reasonFlows, func(t *testing.T, r rig, _ func()) {
			for i, want := range []bool{true, false} {
				c := r.g.dialUDP(t, gw(srv.LocalAddr()))
				c.Write([]byte("x"))
				c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				_, err := c.Read(make([]byte, 10))
				if (err == nil) != want {
					t.Fatalf("flow %d: echo %v, want %v", i, err == nil, want)
				}
			}
		}},
		{"TCP past the half-open limit", Config{MaxHalfOpen: 1}, reasonHalfOpen, func(t *testing.T, r rig, release func()) {
			// The first connect hangs in the host dial; the second
			// is over the limit.
			first := make(chan error, 1)
			go func() {
				c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
				if err == nil {
					c.Close()
				}
				first <- err
			}()
			waitFor(t, func() bool { return r.n.halfOpen.Load() == 1 })
			start := time.Now()
			if c, err := r.g.dial(ctxT(t, 5*time.Second), netip.AddrPortFrom(GatewayAddr, 9)); err == nil {
				c.Close()
				t.Fatal("a second connect got through")
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("the refusal took %v", d)
			}
			release()
			if err := <-first; err != nil {
				t.Fatalf("the first connect: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var flows []Flow
			gate := make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(release)
			cfg := tc.cfg
			cfg.OnFlow = func(f Flow) { mu.Lock(); flows = append(flows, f); mu.Unlock() }
			cfg.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				if network == "tcp4" && tc.reason == reasonHalfOpen {
					select {
					case <-gate:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
			r := newRig(t, cfg)
			tc.run(t, r, release)
			if s := r.n.Stats(); s.Refused != 1 || s.Blocked != 0 {
				t.Fatalf("stats %+v, want one refused", s)
			}
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, f := range flows {
				if !f.Allowed {
					n++
					if f.Reason != tc.reason {
						t.Fatalf("refused flow %+v, want reason %q", f, tc.reason)
					}
				}
			}
			if n != 1 {
				t.Fatalf("flows %+v, want one refused", flows)
			}
		})
	}
}

// TestSYNFlood: a flood of connects to a host that never answers leaves
// at most MaxHalfOpen dials and a bounded number of goroutines, and
// Close ends them.
func TestSYNFlood(t *testing.T) {
	before := runtimeGoroutines()
	var mu sync.Mutex
	dialing, most := 0, 0
	r := newRig(t, Config{MaxHalfOpen: 8, dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		mu.Lock()
		dialing++
		most = max(most, dialing)
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		dialing--
		mu.Unlock()
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := r.g.dial(ctx, netip.MustParseAddrPort("192.0.2.1:80")); err == nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	s := r.n.Stats()
	t.Logf("200 connects: %d dials at most, %d refused, %d goroutines over the baseline", most, s.Refused, runtimeGoroutines()-before)
	if most > 8 || s.Refused == 0 {
		t.Fatalf("%d dials at once, %d refused; want at most 8 and some refused", most, s.Refused)
	}
}
