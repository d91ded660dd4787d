package channel

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// scribbledLane is the host's view of a lane whose guest half the guest
// rewrites under its descriptors: the first reads of that half come back
// with bytes changed by damage.
type scribbledLane struct {
	*memLane
	mu     sync.Mutex
	left   int // reads still to damage
	damage func(b []byte)
}

func (l *scribbledLane) ReadAt(p []byte, off int64) (int, error) {
	n, err := l.memLane.ReadAt(p, off)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left > 0 && off >= testLaneSize/2 {
		l.left--
		l.damage(p[:n])
	}
	return n, err
}

// guestToHost sends size random bytes from the guest to the host, as a
// __get__ does, and checks they arrive whole within limit.
func guestToHost(t *testing.T, host, guest *Mux, size int, limit time.Duration) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	s, err := guest.Open([]byte("get"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s.Write(data)
		s.CloseWrite(nil)
	}()
	h := accept(t, host)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(h)
		got <- b
	}()
	select {
	case b := <-got:
		if !bytes.Equal(b, data) {
			t.Fatalf("%d bytes sent, %d arrived, not the same", size, len(b))
		}
	case <-time.After(limit):
		t.Fatalf("the guest's %d bytes did not arrive within %s: the channel stalled", size, limit)
	}
}

// TestLaneRefusedBatchIsSentAgain: a batch the host refuses because its
// bytes changed under the descriptor (its header, a frame's header, a
// payload) is sent again through the port, and nothing is lost; the
// guest stops using its half of the lane, and the host's still works.
func TestLaneRefusedBatchIsSentAgain(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(b []byte)
	}{
		{"batch header", func(b []byte) { b[8] ^= 0xff }},
		{"a frame header", func(b []byte) { b[laneHeaderLen+4] ^= 0xff }},
		{"a payload", func(b []byte) { b[len(b)-1] ^= 0xff }},
		{"cut short", func(b []byte) { clear(b[len(b)-100:]) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := newMemLane(testLaneSize)
			hostView := &scribbledLane{memLane: mem, left: 2, damage: c.damage}
			host, guest := lanePair(t, hostView, mem)
			guestToHost(t, host, guest, 3*Window+777, 10*time.Second)
			hs, gs := host.LaneStats(), guest.LaneStats()
			if hs.Refused == 0 {
				t.Fatalf("no batch was refused: host %+v", hs)
			}
			if gs.Active {
				t.Fatalf("the guest still sends through a half the host refused: guest %+v", gs)
			}
			// The guest's bytes go through the port from now on; the host's
			// still take the lane.
			before := hs.BatchesIn
			guestToHost(t, host, guest, Window, 10*time.Second)
			echoThrough(t, host, guest, 2*Window)
			if hs2, gs2 := host.LaneStats(), guest.LaneStats(); hs2.BatchesIn != before || hs2.BatchesOut == 0 || gs2.Refused != 0 {
				t.Fatalf("after the refusal: host %+v guest %+v", hs2, gs2)
			}
		})
	}
}

// TestLaneBatchRefusesTornBatches: a batch whose header matches but whose
// frames do not decode end to end is refused whole; on the host a changed
// payload is refused too (the guest, which trusts the host's half, reads
// it in place unchecked).
func TestLaneBatchRefusesTornBatches(t *testing.T) {
	frames := appendFrame(nil, &frame{typ: typeData, stream: 2, seq: 1, payload: bytes.Repeat([]byte("x"), 9000)})
	frames = appendFrame(frames, &frame{typ: typeWindow, stream: 2, seq: 2, payload: []byte{1, 0, 0, 0}})
	for _, c := range []struct {
		name      string
		tear      func(b []byte) []byte
		hostOK    bool
		guestOK   bool
		wantFrame int
	}{
		{"whole", func(b []byte) []byte { return b }, true, true, 2},
		{"payload byte changed", func(b []byte) []byte { b[headerLen+100] ^= 1; return b }, false, true, 2},
		{"second frame's header changed", func(b []byte) []byte { b[headerLen+9000+5] ^= 1; return b }, false, false, 0},
		{"garbage between frames", func(b []byte) []byte {
			return append(append(append([]byte(nil), b[:headerLen+9000]...), 0, 1, 2), b[headerLen+9000:]...)
		}, false, false, 0},
		{"last frame cut", func(b []byte) []byte { return b[:len(b)-2] }, false, false, 0},
	} {
		for _, role := range []Role{Host, Guest} {
			t.Run(c.name+"/"+map[Role]string{Host: "host", Guest: "guest"}[role], func(t *testing.T) {
				lane := newMemLane(testLaneSize)
				m := New(role, quietLog())
				defer m.Close()
				m.SetLane(lane, testLaneSize)
				body := c.tear(append([]byte(nil), frames...))
				n := int64(laneHeaderLen + len(body))
				lane.WriteAt(append(laneHeader(n, 9), body...), m.lane.rxBase)
				got, ok := m.lane.batch(laneDescriptor(0, n, 9).enc[headerLen:], new([]byte), nil, nil)
				wantOK := c.hostOK
				if role == Guest {
					wantOK = c.guestOK
				}
				want := 0
				if wantOK {
					want = c.wantFrame
				}
				if ok != wantOK || len(got) != want {
					t.Fatalf("batch: ok=%v frames=%d, want ok=%v frames=%d", ok, len(got), wantOK, want)
				}
			})
		}
	}
}

// rawPeer is the far end of a host Mux's transport, spoken to frame by
// frame: what a guest sends, byte for byte.
type rawPeer struct {
	conn   net.Conn
	frames chan *frame
}

func newRawPeer(t *testing.T, host *Mux) *rawPeer {
	t.Helper()
	hc, pc := net.Pipe()
	t.Cleanup(func() { hc.Close(); pc.Close() })
	p := &rawPeer{conn: pc, frames: make(chan *frame, 1024)}
	go func() {
		var d Decoder
		for {
			_, err := d.readFrom(pc)
			for {
				f, ferr := d.next()
				if ferr != nil {
					break
				}
				select {
				case p.frames <- f:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	host.Attach(hc, false)
	return p
}

func (p *rawPeer) send(t *testing.T, f *frame) {
	t.Helper()
	if _, err := p.conn.Write(appendFrame(nil, f)); err != nil {
		t.Fatal(err)
	}
}

// waitFrame waits for a frame from the host that match accepts.
func (p *rawPeer) waitFrame(t *testing.T, what string, limit time.Duration, match func(*frame) bool) {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case f := <-p.frames:
			if match(f) {
				return
			}
		case <-deadline:
			t.Fatalf("the host sent no %s within %s", what, limit)
		}
	}
}

// TestGapAsksForResend: frames that arrive after a gap (the ones before
// it lost on this transport) make the host ask the peer, with a resync,
// to send again; the frames it then resends are taken in order.
func TestGapAsksForResend(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	p := newRawPeer(t, host)
	isResync := func(f *frame) bool { return f.typ == typeResync }
	p.waitFrame(t, "resync on attach", 5*time.Second, isResync)
	open := &frame{typ: typeOpen, stream: 2, seq: 1, payload: []byte("x")}
	data := &frame{typ: typeData, stream: 2, seq: 2, payload: []byte("hello")}
	p.send(t, data) // seq 1 lost
	p.waitFrame(t, "resync after the gap", 5*time.Second, isResync)
	p.send(t, open)
	p.send(t, data)
	s, err := host.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	n, err := s.Read(b)
	if err != nil || string(b[:n]) != "hello" {
		t.Fatalf("read %q, %v; want hello", b[:n], err)
	}
}

// TestLivenessDeclaresSilentPeerDead: a peer that answers nothing while
// a stream waits on it (a guest that removed the channel's device) gets a
// keepalive, then the channel closes: the stream fails with ErrClosed
// naming the silence, Dead is closed, and Err says the same.
func TestLivenessDeclaresSilentPeerDead(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	p := newRawPeer(t, host)
	host.SetLiveness(500 * time.Millisecond)
	s, err := host.Open([]byte("exec"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	failed := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 10))
		failed <- err
	}()
	p.waitFrame(t, "keepalive", 5*time.Second, func(f *frame) bool { return f.typ == typeWindow && f.stream == 0 })
	select {
	case err := <-failed:
		took := time.Since(began)
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stopped answering") {
			t.Fatalf("read on a silent channel: %v", err)
		}
		if took < 500*time.Millisecond || took > 2*time.Second {
			t.Fatalf("the channel closed %s after the peer went silent, want 0.5-2 s", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader stayed blocked on a peer that answers nothing")
	}
	select {
	case <-host.Dead():
	default:
		t.Fatal("Dead is not closed")
	}
	if err := host.Err(); err == nil || !strings.Contains(err.Error(), "stopped answering") {
		t.Fatalf("Err: %v", err)
	}
}

// TestLivenessKeepsAQuietLivePeer: a live peer with nothing to say for
// many times the silence bound keeps its channel (its acks of the
// keepalives are enough), and the keepalive in flight never counts as a
// frame a snapshot gate waits for.
func TestLivenessKeepsAQuietLivePeer(t *testing.T) {
	host, guest, _, _ := pair(t)
	host.SetLiveness(300 * time.Millisecond)
	s, err := host.Open([]byte("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	g := accept(t, guest)
	time.Sleep(1500 * time.Millisecond)
	if err := host.Err(); err != nil {
		t.Fatalf("a live, quiet peer's channel closed: %v", err)
	}
	host.mu.Lock()
	seq := host.nextSeq
	host.mu.Unlock()
	if seq < 4 {
		t.Fatalf("no keepalive went out in 1.5 s of silence (next seq %d)", seq)
	}
	g.Write([]byte("done"))
	g.CloseWrite(nil)
	if b, err := io.ReadAll(s); err != nil || string(b) != "done" {
		t.Fatalf("after the silence: %q, %v", b, err)
	}
	host.mu.Lock()
	host.pingLocked()
	host.mu.Unlock()
	if n := host.Unacked(); n != 0 {
		t.Fatalf("Unacked counts the keepalive: %d", n)
	}
}

// TestLivenessResendsUnacknowledged: frames that stay unacknowledged
// while the peer says nothing (lost with nothing after them to show a
// gap, to an older agent that would not ask anyway) are sent again
// unasked, before the silence closes the channel.
func TestLivenessResendsUnacknowledged(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	p := newRawPeer(t, host)
	host.SetLiveness(time.Second)
	if _, err := host.Open([]byte("x")); err != nil {
		t.Fatal(err)
	}
	isOpen := func(f *frame) bool { return f.typ == typeOpen && f.seq == 1 }
	p.waitFrame(t, "open", 5*time.Second, isOpen)
	began := time.Now()
	p.waitFrame(t, "resend of the open", 2*time.Second, isOpen)
	if took := time.Since(began); took > 900*time.Millisecond {
		t.Fatalf("the open went again %s later, want within the silence bound (1 s)", took)
	}
}

// TestRefusedPeerIsNotAnnouncedAgain: once the host refused the guest's
// batches it never again says it reads the guest's half, not even when
// the guest resyncs.
func TestRefusedPeerIsNotAnnouncedAgain(t *testing.T) {
	host := New(Host, quietLog())
	defer host.Close()
	host.SetLane(newMemLane(testLaneSize), testLaneSize)
	p := newRawPeer(t, host)
	p.waitFrame(t, "announce on attach", 5*time.Second, func(f *frame) bool { return f.typ == typeBulk && len(f.payload) == 0 })
	var desc [laneDescLen]byte
	binary.LittleEndian.PutUint32(desc[4:], 64<<10) // zeroes: not a batch
	p.send(t, &frame{typ: typeBulk, payload: desc[:]})
	p.waitFrame(t, "resync after the refusal", 5*time.Second, func(f *frame) bool { return f.typ == typeResync })
	p.send(t, &frame{typ: typeResync})
	p.send(t, &frame{typ: typeOpen, stream: 2, seq: 1, payload: []byte("x")})
	if _, err := host.Accept(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for {
		select {
		case f := <-p.frames:
			if f.typ == typeBulk && len(f.payload) == 0 {
				t.Fatal("the host announced the lane again after refusing the guest's half")
			}
			continue
		default:
		}
		break
	}
}
