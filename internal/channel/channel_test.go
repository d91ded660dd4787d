package channel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pair connects a host and a guest Mux over an in-memory pipe.
func pair(t *testing.T) (host, guest *Mux, hc, gc net.Conn) {
	t.Helper()
	host, guest = New(Host, quietLog()), New(Guest, quietLog())
	hc, gc = net.Pipe()
	host.Attach(hc, false)
	guest.Attach(gc, false)
	t.Cleanup(func() { host.Close(); guest.Close(); hc.Close(); gc.Close() })
	return
}

func accept(t testing.TB, m *Mux) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := m.Accept(ctx)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return s
}

func TestStreamRoundTrip(t *testing.T) {
	for _, size := range []int{0, 1, MaxPayload - 1, MaxPayload + 1, 3 * Window} {
		t.Run("", func(t *testing.T) {
			host, guest, _, _ := pair(t)
			data := make([]byte, size)
			rand.Read(data)
			s, err := host.Open([]byte("echo"))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				s.Write(data)
				s.CloseWrite([]byte("done"))
			}()
			g := accept(t, guest)
			if string(g.Meta()) != "echo" {
				t.Fatalf("meta %q", g.Meta())
			}
			got, err := io.ReadAll(g)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("got %d bytes, want %d", len(got), len(data))
			}
			if string(g.Status()) != "done" {
				t.Fatalf("status %q", g.Status())
			}
		})
	}
}

func TestCreditStopsAFloodingWriter(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, _ := host.Open(nil)
	accept(t, guest) // the peer never reads
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int)
	go func() {
		n, _ := s.WriteContext(ctx, make([]byte, 4*Window))
		done <- n
	}()
	// Once the window is spent, give a writer that ignores credit time
	// to show it, then stop the writer. (Not a fixed deadline for the
	// whole window: a loaded machine under -race may take long to write
	// it.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		host.mu.Lock()
		c := s.credit
		host.mu.Unlock()
		if c == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	n := <-done
	if n != Window {
		t.Fatalf("wrote %d bytes without the reader reading, want exactly one window (%d)", n, Window)
	}
}

func TestResetReachesBothSides(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, _ := host.Open(nil)
	g := accept(t, guest)
	g.Reset("no such file")
	_, err := io.ReadAll(s)
	if !errors.Is(err, ErrReset) {
		t.Fatalf("read after peer reset: %v", err)
	}
}

// TestResendAcrossTransportSwap is the property snapshots rely on: the
// host half is captured, the old transport dies with bytes in flight, a
// restored host half attaches a new transport, and every byte arrives
// exactly once in order, in both directions.
//
// With a bulk lane the restore also wipes the lane (the new engine maps
// fresh memory behind it): descriptors the guest still holds name
// zeroes, everything unacknowledged arrives through the resend, and what
// the restored host sends once the guest answered its resync goes
// through the lane again.
func TestResendAcrossTransportSwap(t *testing.T) {
	for _, withLane := range []bool{false, true} {
		t.Run(fmt.Sprintf("lane=%v", withLane), func(t *testing.T) { resendAcrossSwap(t, withLane) })
	}
}

func resendAcrossSwap(t *testing.T, withLane bool) {
	host := New(Host, quietLog())
	guest := New(Guest, quietLog())
	defer guest.Close()
	var lane *memLane
	chunkSize := 10000
	if withLane {
		lane = newMemLane(testLaneSize)
		host.SetLane(lane, testLaneSize)
		guest.SetLane(lane, testLaneSize)
		chunkSize = 300 << 10
	}
	hc, gc := net.Pipe()
	host.Attach(hc, false)
	guest.Attach(gc, false)

	s, _ := host.Open([]byte("cat"))
	g := accept(t, guest)
	var sent, echoed bytes.Buffer
	// The guest echoes everything back.
	go func() { io.Copy(g, g); g.CloseWrite(nil) }()

	chunk := make([]byte, chunkSize)
	for i := 0; i < 5; i++ {
		rand.Read(chunk)
		sent.Write(chunk)
		s.Write(chunk)
	}
	// Read part of the echo on the old host, then freeze and capture.
	buf := make([]byte, 2*chunkSize)
	n, _ := io.ReadFull(s, buf)
	echoed.Write(buf[:n])
	// That read gave the guest credit back, in a window frame the write
	// loop may not have taken yet; a frozen host would keep it queued.
	// Without it the guest's echo stalls with less than half a window
	// consumed, so it grants nothing back, and the write below, which
	// needs the guest's grants, waits for ever. (With a lane the chunks
	// outgrow a window.) Once it is delivered the guest echoes all it
	// has, and its grants come in while the host is frozen.
	waitUntilDelivered(t, host, guest)
	host.Freeze()
	// More bytes sent while frozen go into the resend queue only.
	rand.Read(chunk)
	sent.Write(chunk)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n, err := s.WriteContext(ctx, chunk); err != nil {
		t.Fatalf("write while frozen: %d of %d bytes, %v (no credit came back from the guest)", n, len(chunk), err)
	}
	st := host.State()
	enc, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// The old process dies: its transport goes away mid-flight.
	host.Close()
	hc.Close()
	gc.Close()
	if lane != nil {
		lane.wipe()
	}

	st2, err := UnmarshalState(enc)
	if err != nil {
		t.Fatal(err)
	}
	host2, err := Restore(st2, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer host2.Close()
	if lane != nil {
		host2.SetLane(lane, testLaneSize)
	}
	streams := host2.Streams()
	if len(streams) != 1 || string(streams[0].Meta()) != "cat" {
		t.Fatalf("restored streams: %v", streams)
	}
	s2 := streams[0]
	hc2, gc2 := net.Pipe()
	defer hc2.Close()
	defer gc2.Close()
	guest.Attach(gc2, false)
	host2.Attach(hc2, false)
	go func() {
		if lane != nil {
			for i := 0; i < 3; i++ {
				rand.Read(chunk)
				sent.Write(chunk)
				s2.Write(chunk)
			}
		}
		s2.CloseWrite(nil)
	}()
	rest, err := io.ReadAll(s2)
	if err != nil {
		t.Fatal(err)
	}
	echoed.Write(rest)
	if sha256.Sum256(echoed.Bytes()) != sha256.Sum256(sent.Bytes()) {
		t.Fatalf("echo differs after the swap: sent %d bytes, got back %d", sent.Len(), echoed.Len())
	}
	if lane != nil && host2.LaneStats().BatchesOut == 0 {
		t.Fatalf("the restored host did not use the lane: %+v", host2.LaneStats())
	}
}

// TestCreditQueuedAtFreezeIsNotLost: a window grant a read queued just
// before a freeze, which the frozen host never wrote, reaches the guest
// after a thaw and after a restore, so the guest's writer waiting for
// that credit carries on. (A lost grant would stall the stream for good
// after a snapshot.)
func TestCreditQueuedAtFreezeIsNotLost(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(fmt.Sprintf("restore=%v", restore), func(t *testing.T) { creditQueuedAtFreeze(t, restore) })
	}
}

func creditQueuedAtFreeze(t *testing.T, restore bool) {
	host, guest := New(Host, quietLog()), New(Guest, quietLog())
	defer func() { host.Close() }() // the restored one, once there is one
	defer guest.Close()
	hc, gc := net.Pipe()
	hold := &holdConn{Conn: hc, entered: make(chan struct{}, 1)}
	host.Attach(hold, false)
	guest.Attach(gc, false)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := accept(t, guest)

	// The host's write loop is held in a write (the ack for the guest's
	// frames) while the host reads half a window: the grant that read
	// makes is queued, and the freeze keeps it there.
	release := hold.hold()
	// The guest writes a window and a half: the last half waits for the
	// credit the host grants when it reads.
	data := make([]byte, Window+Window/2)
	rand.Read(data)
	wrote := make(chan error, 1)
	go func() {
		_, err := g.Write(data)
		wrote <- err
	}()
	waitUntil(t, "the guest spent its window and the host acknowledges it", func() bool {
		host.mu.Lock()
		defer host.mu.Unlock()
		return s.unreadLen == Window && len(hold.entered) == 1
	})
	got := make([]byte, Window/2)
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatal(err)
	}
	host.Freeze()
	release()
	st := host.State()
	grants := 0
	for _, p := range st.Unacked {
		var d Decoder
		d.Feed(append([]byte(nil), p.Encoded...))
		if f, err := d.next(); err == nil && f.typ == typeWindow && f.stream == s.id {
			grants++
		}
	}
	host.mu.Lock()
	queued := len(host.outq)
	host.mu.Unlock()
	if grants != 1 || queued == 0 {
		t.Fatalf("the grant is not held by the frozen host: %d grants unacknowledged, %d frames queued", grants, queued)
	}
	select {
	case err := <-wrote:
		t.Fatalf("the guest's writer finished without the grant: %v", err)
	case <-time.After(20 * time.Millisecond):
	}

	if restore {
		enc, err := st.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		host.Close()
		hc.Close()
		gc.Close()
		back, err := UnmarshalState(enc)
		if err != nil {
			t.Fatal(err)
		}
		if host, err = Restore(back, quietLog()); err != nil {
			t.Fatal(err)
		}
		s = host.Streams()[0]
		hc2, gc2 := net.Pipe()
		defer hc2.Close()
		defer gc2.Close()
		guest.Attach(gc2, false)
		host.Attach(hc2, false)
	} else {
		host.Thaw()
	}

	// The grant alone lets the guest's writer finish: the host reads
	// nothing more until it has (reading would grant more).
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the guest's write: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the guest's writer still waits for the credit granted before the freeze")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rest := make([]byte, len(data)-len(got))
	for n := 0; n < len(rest); {
		k, err := s.ReadContext(ctx, rest[n:])
		if err != nil {
			t.Fatalf("reading after the freeze: %d of %d bytes, %v", n, len(rest), err)
		}
		n += k
	}
	if !bytes.Equal(append(got, rest...), data) {
		t.Fatal("the bytes read differ from the bytes written")
	}
}

// holdConn is a transport whose writes can be held: while held, a write
// waits (and says so on entered) until released.
type holdConn struct {
	net.Conn
	mu      sync.Mutex
	held    chan struct{} // closed to release; nil when not held
	entered chan struct{}
}

// hold makes the next writes wait; the function returned releases them.
func (c *holdConn) hold() (release func()) {
	ch := make(chan struct{})
	c.mu.Lock()
	c.held = ch
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.held = nil
		c.mu.Unlock()
		close(ch)
	}
}

func (c *holdConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held != nil {
		select {
		case c.entered <- struct{}{}:
		default:
		}
		<-held
	}
	return c.Conn.Write(p)
}

// waitUntil polls ok until it holds, or fails the test naming what.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitUntilDelivered waits until every sequenced frame host sent has
// reached guest.
func waitUntilDelivered(t *testing.T, host, guest *Mux) {
	t.Helper()
	host.mu.Lock()
	last := host.nextSeq - 1
	host.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		guest.mu.Lock()
		got := guest.recvSeq
		guest.mu.Unlock()
		if got >= last {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest has the host's frames up to %d, the host sent up to %d", got, last)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStateRoundTrip(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, _ := host.Open([]byte("meta"))
	s.Write([]byte("hello"))
	g := accept(t, guest)
	g.Write([]byte("unread reply"))
	deadline := time.Now().Add(2 * time.Second)
	for {
		host.mu.Lock()
		n := len(s.unread)
		host.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	host.Freeze()
	st := host.State()
	b, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, back) {
		t.Fatalf("state changed in a round trip:\n%+v\n%+v", st, back)
	}
	m, err := Restore(back, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !reflect.DeepEqual(m.State(), st) {
		t.Fatalf("restored mux reports a different state")
	}
	if string(st.Streams[0].Unread) != "unread reply" {
		t.Fatalf("unread bytes not captured: %q", st.Streams[0].Unread)
	}
}

func TestUnmarshalStateRejectsBadInput(t *testing.T) {
	good := &State{Version: StateVersion, Role: Host, NextSeq: 3, NextID: 1,
		Unacked: []PendingFrame{{Seq: 2, Encoded: appendFrame(nil, &frame{typ: typeData, stream: 1, seq: 2, payload: []byte("x")})}}}
	mutate := map[string]func(*State){
		"version":         func(s *State) { s.Version = 99 },
		"role":            func(s *State) { s.Role = 7 },
		"zero next seq":   func(s *State) { s.NextSeq = 0 },
		"id parity":       func(s *State) { s.NextID = 2 },
		"seq beyond next": func(s *State) { s.Unacked[0].Seq = 5 },
		"corrupt frame":   func(s *State) { s.Unacked[0].Encoded[36] ^= 1 },
		"seq mismatch":    func(s *State) { s.Unacked[0].Seq = 1 },
		"repeated stream": func(s *State) { s.Streams = []StreamState{{ID: 1}, {ID: 1}} },
		"credit":          func(s *State) { s.Streams = []StreamState{{ID: 1, Credit: Window + 1}} },
	}
	b, _ := good.Marshal()
	if _, err := UnmarshalState(b); err != nil {
		t.Fatalf("good state refused: %v", err)
	}
	for name, f := range mutate {
		t.Run(name, func(t *testing.T) {
			var st State
			b, _ := good.Marshal()
			UnmarshalStateInto(t, b, &st)
			f(&st)
			bad, _ := st.Marshal()
			if _, err := UnmarshalState(bad); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := UnmarshalState([]byte("{")); err == nil {
		t.Fatal("accepted truncated json")
	}
}

func UnmarshalStateInto(t *testing.T, b []byte, st *State) {
	t.Helper()
	back, err := UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	*st = *back
	st.Unacked = append([]PendingFrame(nil), back.Unacked...)
	for i := range st.Unacked {
		st.Unacked[i].Encoded = append([]byte(nil), back.Unacked[i].Encoded...)
	}
}

func TestDecoderResynchronises(t *testing.T) {
	f1 := appendFrame(nil, &frame{typ: typeData, stream: 1, seq: 1, payload: []byte("one")})
	f2 := appendFrame(nil, &frame{typ: typeData, stream: 1, seq: 2, payload: []byte("two")})
	cases := map[string][]byte{
		"garbage before":       append([]byte("garbage\xa7N\xa7"), f2...),
		"truncated frame":      append(append([]byte(nil), f1[:20]...), f2...),
		"truncated payload":    append(append([]byte(nil), f1[:len(f1)-1]...), f2...),
		"false magic in front": append([]byte{magic0, magic1, 1, 0}, f2...),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			var d Decoder
			// Feed a byte at a time: boundaries must not matter.
			var got []*frame
			for _, b := range in {
				d.Feed([]byte{b})
				for {
					f, err := d.next()
					if err != nil {
						break
					}
					got = append(got, f)
				}
			}
			if len(got) == 0 || string(got[len(got)-1].payload) != "two" {
				t.Fatalf("did not recover frame two: %v", got)
			}
			if d.Skipped == 0 {
				t.Fatal("skipped bytes not counted")
			}
		})
	}
}

// TestPeerThatNeverAcknowledges: a peer that floods opens and never
// acknowledges cannot grow our resend queue without bound.
func TestPeerThatNeverAcknowledges(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	hc, peer := net.Pipe()
	defer peer.Close()
	host.Attach(hc, false)
	// Refuse every stream the peer opens, as nether does with anything
	// but hello; each refusal is a reset frame waiting for an ack.
	go func() {
		for {
			s, err := host.Accept(context.Background())
			if err != nil {
				return
			}
			s.Reset("refused")
		}
	}()
	go io.Copy(io.Discard, peer) // read, never acknowledge
	var buf []byte
	for seq := uint64(1); seq <= 3*maxUnacked; seq++ {
		buf = appendFrame(buf[:0], &frame{typ: typeOpen, stream: uint32(2 * seq), seq: seq, payload: []byte("x")})
		if _, err := peer.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		host.mu.Lock()
		n, recv := len(host.unacked), host.recvSeq
		host.mu.Unlock()
		if recv == 3*maxUnacked {
			if n > maxUnacked+1 {
				t.Fatalf("%d frames wait for acknowledgement; the bound is %d", n, maxUnacked)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host processed %d of %d frames", recv, 3*maxUnacked)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHostTransportEndFailsStreams: when the engine's end of the port goes
// away, every stream on the host half fails at once; no reader or writer
// waits for a peer that cannot answer.
func TestHostTransportEndFailsStreams(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	guest := New(Guest, quietLog())
	defer guest.Close()
	hc, gc := net.Pipe()
	host.Attach(hc, false)
	guest.Attach(gc, true)
	s, err := host.Open([]byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	accept(t, guest)
	done := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 10))
		done <- err
	}()
	gc.Close() // the engine process died
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "gone") {
			t.Fatalf("read after the transport ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader stayed blocked after the transport ended")
	}
	if _, err := host.Open([]byte("y")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Open after the transport ended: %v", err)
	}
}

// chunkReader hands out its bytes in reads of the sizes given, in turn:
// the transport's read boundaries must not matter to the decoder.
type chunkReader struct {
	b     []byte
	sizes []int
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.b), r.sizes[r.i%len(r.sizes)])
	r.i++
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// TestDecoderReadsFullFramesInAnyPieces feeds frames of every size up to
// MaxPayload, with garbage between some, through readFrom in reads of
// the sizes a virtio-serial port (a page) and a socket (whatever is
// there) return; every frame must come out whole and in order, and the
// decoder's buffer must stay its usual size.
func TestDecoderReadsFullFramesInAnyPieces(t *testing.T) {
	var in []byte
	var want [][]byte
	seq := uint64(0)
	for _, n := range []int{0, 1, 35, 36, 4096, maxData, MaxPayload - 1, MaxPayload, 1000, MaxPayload, MaxPayload} {
		p := make([]byte, n)
		rand.Read(p)
		seq++
		in = appendFrame(in, &frame{typ: typeData, stream: 1, seq: seq, payload: p})
		want = append(want, p)
		if n == 1000 {
			in = append(in, "garbage\xa7"...)
		}
	}
	for _, sizes := range [][]int{{4096}, {1}, {65536}, {36, 7, 40000, 4096, 1 << 20}} {
		t.Run(fmt.Sprint(sizes), func(t *testing.T) {
			var d Decoder
			r := &chunkReader{b: in, sizes: sizes}
			var got [][]byte
			for {
				_, err := d.readFrom(r)
				for {
					f, ferr := d.next()
					if ferr != nil {
						break
					}
					got = append(got, f.payload)
				}
				if cap(d.buf) > decoderBuf {
					t.Fatalf("decoder buffer grew to %d bytes", cap(d.buf))
				}
				if err == io.EOF {
					break
				}
			}
			if len(got) != len(want) {
				t.Fatalf("decoded %d frames, want %d", len(got), len(want))
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("frame %d: payload of %d bytes differs (want %d bytes)", i, len(got[i]), len(want[i]))
				}
			}
			if d.Skipped != uint64(len("garbage\xa7")) {
				t.Fatalf("skipped %d bytes, want %d", d.Skipped, len("garbage\xa7"))
			}
		})
	}
}

// TestDecoderPayloadsOwnTheirBytes: a payload handed out must not change
// when the decoder goes on reading into its buffer (payloads are copied
// out, so the buffer can be reused in place).
func TestDecoderPayloadsOwnTheirBytes(t *testing.T) {
	var d Decoder
	var first *frame
	for seq := uint64(1); seq <= 40; seq++ {
		p := bytes.Repeat([]byte{byte(seq)}, MaxPayload)
		d.Feed(appendFrame(nil, &frame{typ: typeData, stream: 1, seq: seq, payload: p}))
		f, err := d.next()
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = f
		}
	}
	if !bytes.Equal(first.payload, bytes.Repeat([]byte{1}, MaxPayload)) {
		t.Fatal("the first payload changed while the decoder read on")
	}
}

// TestReadSpansFramesAndRecyclesBuffers sends many full frames and
// reads them back with reads both smaller and larger than a frame: the
// bytes must arrive intact (recycled payload buffers are never handed out
// while a stream still holds them) and the pool must stay bounded.
func TestReadSpansFramesAndRecyclesBuffers(t *testing.T) {
	host, guest, _, _ := pair(t)
	data := make([]byte, 5*Window+12345)
	rand.Read(data)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s.Write(data)
		s.CloseWrite(nil)
	}()
	g := accept(t, guest)
	var got []byte
	sizes := []int{100, 3 * MaxPayload, 1, MaxPayload, 2 * Window}
	for i := 0; ; i++ {
		buf := make([]byte, sizes[i%len(sizes)])
		n, err := g.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes, want %d, or they differ", len(got), len(data))
	}
	guest.payloads.mu.Lock()
	idle := len(guest.payloads.free)
	guest.payloads.mu.Unlock()
	if idle == 0 || idle > poolMax {
		t.Fatalf("%d idle payload buffers, want 1..%d", idle, poolMax)
	}
}

// TestWriteFromGivesBackUnusedCredit: credit WriteFrom takes for a read
// that fills less of the frame (or nothing) comes back; the peer sees
// exactly the bytes read.
func TestWriteFromGivesBackUnusedCredit(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := accept(t, guest)
	credit := func() int {
		host.mu.Lock()
		defer host.mu.Unlock()
		return s.credit
	}
	n, err := s.WriteFrom(context.Background(), func(p []byte) (int, error) {
		if len(p) != maxData {
			t.Errorf("read offered %d bytes, want a full frame's %d", len(p), maxData)
		}
		return copy(p, "hello"), nil
	})
	if n != 5 || err != nil || credit() != Window-5 {
		t.Fatalf("WriteFrom sent %d (err %v), credit %d; want 5, nil, %d", n, err, credit(), Window-5)
	}
	boom := errors.New("boom")
	n, err = s.WriteFrom(context.Background(), func(p []byte) (int, error) { return 0, boom })
	if n != 0 || err != boom || credit() != Window-5 {
		t.Fatalf("WriteFrom of nothing: %d, %v, credit %d; want 0, boom, %d", n, err, credit(), Window-5)
	}
	n, err = s.WriteFrom(context.Background(), func(p []byte) (int, error) { return copy(p, " world"), io.EOF })
	if n != 6 || err != io.EOF {
		t.Fatalf("WriteFrom with EOF: %d, %v; want 6, EOF", n, err)
	}
	s.CloseWrite(nil)
	got, err := io.ReadAll(g)
	if err != nil || string(got) != "hello world" {
		t.Fatalf("peer read %q, %v", got, err)
	}
}

// TestStateCountsCreditAWriterHolds: a state captured while a WriteFrom
// is reading has the credit it took as unspent, since a Mux restored from
// the state never sends that frame.
func TestStateCountsCreditAWriterHolds(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	accept(t, guest)
	var during *State
	s.WriteFrom(context.Background(), func(p []byte) (int, error) {
		during = host.State()
		return copy(p, "x"), nil
	})
	if c := during.Streams[0].Credit; c != Window {
		t.Fatalf("state taken during a write has credit %d, want %d", c, Window)
	}
	if c := host.State().Streams[0].Credit; c != Window-1 {
		t.Fatalf("state after the write has credit %d, want %d", c, Window-1)
	}
}

// TestAcksAreBatchedAndPrompt: a burst of frames is acknowledged by a
// few frames, not one each, and the last of them within ackDelay (and a
// margin) of the burst's end, so the peer's resend queue empties.
func TestAcksAreBatchedAndPrompt(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	hc, peer := net.Pipe()
	defer peer.Close()
	host.Attach(hc, false)
	acks := make(chan uint64, 1000)
	go func() {
		var d Decoder
		for {
			if _, err := d.readFrom(peer); err != nil {
				return
			}
			for {
				f, err := d.next()
				if err != nil {
					break
				}
				// Every frame carries the ack field, and the host sends only
				// acks and its attach's resync. Under load the resync can go
				// out after the whole burst arrived, carrying the last ack
				// itself (and no standalone ack is due then).
				if f.typ == typeAck || f.typ == typeResync && f.ack > 0 {
					acks <- f.ack
				}
			}
		}
	}()
	const burst = 10 * ackFrames
	var buf []byte
	buf = appendFrame(buf, &frame{typ: typeOpen, stream: 2, seq: 1})
	for seq := uint64(2); seq <= burst; seq++ {
		buf = appendFrame(buf, &frame{typ: typeData, stream: 2, seq: seq, payload: []byte("x")})
	}
	if _, err := peer.Write(buf); err != nil {
		t.Fatal(err)
	}
	n := 0
	deadline := time.After(5 * time.Second)
	for {
		select {
		case a := <-acks:
			n++
			if a == burst {
				if n > burst/ackFrames+1 {
					t.Fatalf("%d ack frames for %d frames; want at most %d", n, burst, burst/ackFrames+1)
				}
				return
			}
		case <-deadline:
			t.Fatalf("the burst's last frame was never acknowledged (%d ack frames)", n)
		}
	}
}

// TestIdleAckComesAfterADelay: a lone frame, with no traffic back to
// carry the ack, is acknowledged on its own by the ack timer, so the
// sender's resend queue empties (and a snapshot gate sees it settle).
func TestIdleAckComesAfterADelay(t *testing.T) {
	host, guest, _, _ := pair(t)
	if _, err := host.Open([]byte("x")); err != nil {
		t.Fatal(err)
	}
	accept(t, guest)
	deadline := time.Now().Add(5 * time.Second)
	for {
		host.mu.Lock()
		n := len(host.unacked)
		host.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the open frame was never acknowledged")
		}
		time.Sleep(time.Millisecond)
	}
}

// gatedConn is a transport whose writes wait for a gate and are kept;
// reads come from the peer end of a pipe.
type gatedConn struct {
	io.Reader
	gate    chan struct{}
	mu      sync.Mutex
	written []byte
}

func (c *gatedConn) Write(p []byte) (int, error) {
	<-c.gate
	c.mu.Lock()
	c.written = append(c.written, p...)
	c.mu.Unlock()
	return len(p), nil
}

// TestSentFrameIsNotRecycledWhileWritten: a frame acknowledged while the
// write loop is still writing it keeps its buffer until the write ends;
// only then does the buffer go back for another frame.
func TestSentFrameIsNotRecycledWhileWritten(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	in, peer := net.Pipe()
	defer peer.Close()
	conn := &gatedConn{Reader: in, gate: make(chan struct{})}
	host.Attach(conn, false)
	conn.gate <- struct{}{} // the resync frame
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, maxData)
	rand.Read(data)
	if n, err := s.WriteFrom(context.Background(), func(p []byte) (int, error) { return copy(p, data), nil }); n != maxData || err != nil {
		t.Fatalf("WriteFrom: %d, %v", n, err)
	}
	idle := func() int {
		host.frames.mu.Lock()
		defer host.frames.mu.Unlock()
		return len(host.frames.free)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Let the open frame through; the data frame's write now waits.
	conn.gate <- struct{}{}
	waitFor("the write loop holds the data frame", func() bool {
		host.mu.Lock()
		defer host.mu.Unlock()
		return len(host.outq) == 0
	})
	// The peer acknowledges both frames while the data frame is written.
	if _, err := peer.Write(appendFrame(nil, &frame{typ: typeAck, ack: 2})); err != nil {
		t.Fatal(err)
	}
	waitFor("the ack is taken", func() bool {
		host.mu.Lock()
		defer host.mu.Unlock()
		return len(host.unacked) == 0
	})
	if n := idle(); n != 0 {
		t.Fatalf("%d frame buffers recycled while the write loop still writes one", n)
	}
	conn.gate <- struct{}{}
	waitFor("the buffer comes back after its write", func() bool { return idle() == 1 })
	var d Decoder
	conn.mu.Lock()
	d.Feed(conn.written)
	conn.mu.Unlock()
	var got []byte
	for {
		f, err := d.next()
		if err != nil {
			break
		}
		if f.typ == typeData {
			got = f.payload
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the data frame on the wire is not the one written")
	}
}

// failAfter is a writer that takes n bytes, then fails.
type failAfter struct {
	n   int
	got []byte
}

var errSink = errors.New("sink full")

func (w *failAfter) Write(p []byte) (int, error) {
	if len(w.got)+len(p) > w.n {
		k := w.n - len(w.got)
		w.got = append(w.got, p[:k]...)
		return k, errSink
	}
	w.got = append(w.got, p...)
	return len(p), nil
}

// TestWriteToHandsOverEveryByte: io.Copy through the stream's WriteTo
// delivers every byte in order and returns at the peer's CloseWrite with
// its status readable, grants credit as it goes (the sender writes
// several windows), and stops at the writer's error.
func TestWriteToHandsOverEveryByte(t *testing.T) {
	host, guest, _, _ := pair(t)
	data := make([]byte, 3*Window+777)
	rand.Read(data)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s.Write(data)
		s.CloseWrite([]byte("sent"))
	}()
	g := accept(t, guest)
	var got bytes.Buffer
	n, err := io.Copy(struct{ io.Writer }{&got}, g) // io.Copy takes g's WriteTo
	if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("io.Copy: %d bytes, %v; want %d intact", n, err, len(data))
	}
	if string(g.Status()) != "sent" {
		t.Fatalf("status %q", g.Status())
	}

	s2, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	go s2.Write(data[:Window])
	g2 := accept(t, guest)
	w := &failAfter{n: 1000}
	if n, err := g2.WriteTo(w); !errors.Is(err, errSink) || n != 1000 || !bytes.Equal(w.got, data[:1000]) {
		t.Fatalf("WriteTo into a failing writer: %d, %v", n, err)
	}

	s3, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	g3 := accept(t, guest)
	s3.Reset("gone")
	if _, err := g3.WriteTo(io.Discard); !errors.Is(err, ErrReset) {
		t.Fatalf("WriteTo of a reset stream: %v", err)
	}
}

// buffersSink records WriteBuffers calls; failAt makes the call that
// would pass that many bytes in all write only up to it and fail.
type buffersSink struct {
	got    bytes.Buffer
	calls  int
	failAt int
}

func (b *buffersSink) Write(p []byte) (int, error) { panic("WriteTo must prefer WriteBuffers") }

func (b *buffersSink) WriteBuffers(bufs [][]byte) (int64, error) {
	b.calls++
	var n int64
	for _, p := range bufs {
		if b.failAt > 0 && b.got.Len()+len(p) > b.failAt {
			k := b.failAt - b.got.Len()
			b.got.Write(p[:k])
			return n + int64(k), errSink
		}
		b.got.Write(p)
		n += int64(len(p))
	}
	return n, nil
}

// TestWriteToPrefersWriteBuffers: a writer that takes several buffers
// gets every payload that has arrived in one call, and a failure part way
// is reported with the bytes it took.
func TestWriteToPrefersWriteBuffers(t *testing.T) {
	host, guest, _, _ := pair(t)
	data := make([]byte, Window)
	rand.Read(data)
	s, _ := host.Open(nil)
	s.Write(data) // a window's worth: no credit to wait for
	s.CloseWrite(nil)
	g := accept(t, guest)
	// Everything has arrived before WriteTo starts.
	for deadline := time.Now().Add(5 * time.Second); ; {
		guest.mu.Lock()
		done := g.remoteClosed
		guest.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream never arrived whole")
		}
		time.Sleep(time.Millisecond)
	}
	w := &buffersSink{}
	if n, err := g.WriteTo(w); err != nil || n != int64(len(data)) || !bytes.Equal(w.got.Bytes(), data) {
		t.Fatalf("WriteTo: %d bytes, %v; want %d intact", n, err, len(data))
	}
	if w.calls != 1 {
		t.Fatalf("%d calls for %d bytes that had all arrived: want one", w.calls, len(data))
	}

	s2, _ := host.Open(nil)
	go s2.Write(data[:Window])
	g2 := accept(t, guest)
	w2 := &buffersSink{failAt: 50000}
	if n, err := g2.WriteTo(w2); !errors.Is(err, errSink) || n != 50000 || !bytes.Equal(w2.got.Bytes(), data[:50000]) {
		t.Fatalf("WriteTo into a failing writer: %d, %v", n, err)
	}
}

// TestSmallWriteSmallFrame: a small Write costs a frame of its own size,
// not a full frame's buffer waiting in the resend queue.
func TestSmallWriteSmallFrame(t *testing.T) {
	host, guest, _, _ := pair(t)
	s, err := host.Open(nil)
	if err != nil {
		t.Fatal(err)
	}
	accept(t, guest)
	host.Freeze() // frames stay queued, unacknowledged
	if _, err := s.Write([]byte("ten bytes!")); err != nil {
		t.Fatal(err)
	}
	host.mu.Lock()
	last := host.unacked[len(host.unacked)-1]
	host.mu.Unlock()
	if cap(last.enc) != headerLen+10 {
		t.Fatalf("a 10-byte write queued a frame buffer of %d bytes", cap(last.enc))
	}
	host.Thaw()
}

// An open's metadata may carry secrets: once decoded, the only copy is
// the frame's payload, never the decoder's buffer, whether the frame
// came whole, split across reads (its start moved to the front), or with
// the buffer grown under it.
func TestDecoderLeavesNoCopyOfAnOpen(t *testing.T) {
	secret := []byte("SECRET-3f9a1c-not-anywhere-else")
	meta := append(append(bytes.Repeat([]byte{'m'}, 300), secret...), bytes.Repeat([]byte{'m'}, 300)...)
	open := appendFrame(nil, &frame{typ: typeOpen, stream: 2, seq: 1, payload: meta})
	data := appendFrame(nil, &frame{typ: typeData, stream: 2, seq: 2, payload: bytes.Repeat([]byte{'d'}, 20<<10)})
	for _, tc := range []struct {
		name  string
		feeds [][]byte
	}{
		{"whole", [][]byte{open}},
		{"split", [][]byte{data[:len(data)-1], append(data[len(data)-1:], open[:400]...), open[400:]}},
		{"grown", [][]byte{open[:500], append(open[500:len(open):len(open)], bytes.Repeat([]byte{0}, 3*decoderBuf)...)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			d.buf = make([]byte, 0, decoderBuf)
			var got *frame
			for _, p := range tc.feeds {
				before := d.buf[:cap(d.buf)]
				d.Feed(p)
				for {
					f, err := d.next()
					if err != nil {
						break
					}
					if f.typ == typeOpen {
						got = f
					}
				}
				if bytes.Contains(before, secret) && &before[0] != &d.buf[:cap(d.buf)][0] {
					t.Errorf("a buffer the decoder dropped holds the open's metadata")
				}
			}
			if got == nil || !bytes.Equal(got.payload, meta) {
				t.Fatalf("decoded %v", got)
			}
			if bytes.Contains(d.buf[:cap(d.buf)], secret) {
				t.Errorf("the decoder's buffer holds the open's metadata after decoding it")
			}
		})
	}
}

// Filler (Mux.Pad) crosses the transport whole, in order, and the peer
// discards it without a word: the stream opened after it arrives intact,
// and nothing was skipped as garbage.
func TestPadIsDiscardedInOrder(t *testing.T) {
	host, guest, _, _ := pair(t)
	host.Pad(3 * MaxPayload)
	s, err := host.Open([]byte("after the filler"))
	if err != nil {
		t.Fatal(err)
	}
	s.CloseWrite([]byte("done"))
	g := accept(t, guest)
	if string(g.Meta()) != "after the filler" {
		t.Fatalf("meta %q", g.Meta())
	}
	guest.mu.Lock()
	skipped, in := guest.skipped, guest.bytesIn
	guest.mu.Unlock()
	if skipped != 0 || in > 1024 {
		t.Errorf("the guest skipped %d bytes and counted %d payload bytes in: filler must be parsed and dropped", skipped, in)
	}
}
