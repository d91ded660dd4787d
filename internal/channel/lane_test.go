package channel

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"
)

// memLane is a bulk lane in ordinary memory, shared by the two Muxes of a
// test as the ivshmem BAR and its memfd are in a sandbox.
type memLane struct {
	mu  sync.Mutex
	mem []byte
}

func newMemLane(size int) *memLane { return &memLane{mem: make([]byte, size)} }

func (l *memLane) ReadAt(p []byte, off int64) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(l.mem)) {
		return 0, io.EOF
	}
	return copy(p, l.mem[off:]), nil
}

func (l *memLane) WriteAt(p []byte, off int64) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(l.mem)) {
		return 0, io.ErrShortWrite
	}
	return copy(l.mem[off:], p), nil
}

// Bytes lets a guest Mux read batches in place, as the agent does from
// its mapping of the BAR.
func (l *memLane) Bytes() []byte { return l.mem }

// wipe is what a restore does to the lane: the new engine process maps
// fresh memory behind the same guest address.
func (l *memLane) wipe() {
	l.mu.Lock()
	clear(l.mem)
	l.mu.Unlock()
}

const testLaneSize = 4 << 20

// lanePair connects a host and a guest Mux over a pipe, each given a lane
// when asked.
func lanePair(t *testing.T, hostLane, guestLane Lane) (host, guest *Mux) {
	t.Helper()
	host, guest = New(Host, quietLog()), New(Guest, quietLog())
	if hostLane != nil {
		if err := host.SetLane(hostLane, testLaneSize); err != nil {
			t.Fatal(err)
		}
	}
	if guestLane != nil {
		if err := guest.SetLane(guestLane, testLaneSize); err != nil {
			t.Fatal(err)
		}
	}
	hc, gc := net.Pipe()
	host.Attach(hc, false)
	guest.Attach(gc, false)
	t.Cleanup(func() { host.Close(); guest.Close(); hc.Close(); gc.Close() })
	return host, guest
}

// echoThrough sends size random bytes from host to guest, which echoes
// them back, and checks they come back whole.
func echoThrough(t *testing.T, host, guest *Mux, size int) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	s, err := host.Open([]byte("echo"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s.Write(data)
		s.CloseWrite(nil)
	}()
	g := accept(t, guest)
	go func() { io.Copy(g, g); g.CloseWrite(nil) }()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echo of %d bytes came back as %d bytes, not the same", size, len(got))
	}
}

func TestLaneCarriesBulkBothWays(t *testing.T) {
	lane := newMemLane(testLaneSize)
	host, guest := lanePair(t, lane, lane)
	echoThrough(t, host, guest, 5*Window+12345)
	hs, gs := host.LaneStats(), guest.LaneStats()
	if !hs.Active || !gs.Active {
		t.Fatalf("lane not in use: host %+v guest %+v", hs, gs)
	}
	if hs.BatchesOut == 0 || gs.BatchesOut == 0 || hs.BatchesIn != gs.BatchesOut || gs.BatchesIn != hs.BatchesOut {
		t.Fatalf("batches do not add up: host %+v guest %+v", hs, gs)
	}
	if hs.BytesOut < 4*Window || gs.BytesOut < 4*Window {
		t.Fatalf("most bytes did not go through the lane: host %+v guest %+v", hs, gs)
	}
	if hs.Refused+gs.Refused != 0 {
		t.Fatalf("descriptors refused: host %+v guest %+v", hs, gs)
	}
	// Small frames still work beside it.
	echoThrough(t, host, guest, 10)
}

func TestLaneUsedOnlyWhenThePeerReadsIt(t *testing.T) {
	cases := []struct {
		name             string
		hostLane, guest  bool
		wantHost, wantGu bool
	}{
		{"guest agent without a lane", true, false, false, false},
		{"host without a lane", false, true, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lane := newMemLane(testLaneSize)
			var hl, gl Lane
			if c.hostLane {
				hl = lane
			}
			if c.guest {
				gl = lane
			}
			host, guest := lanePair(t, hl, gl)
			echoThrough(t, host, guest, 2*Window)
			if hs, gs := host.LaneStats(), guest.LaneStats(); hs.BatchesOut != 0 || gs.BatchesOut != 0 || hs.Active || gs.Active {
				t.Fatalf("lane used without a peer reading it: host %+v guest %+v", hs, gs)
			}
		})
	}
}

// A descriptor is the peer's word only: out of bounds, or naming bytes
// that are not its batch (stale after a restore, rewritten), it is
// refused whole; a batch that holds valid frames yields exactly those.
func TestLaneBatchRefusesBadDescriptors(t *testing.T) {
	for _, role := range []Role{Host, Guest} {
		lane := newMemLane(testLaneSize)
		m := New(role, quietLog())
		defer m.Close()
		m.SetLane(lane, testLaneSize)
		l := m.lane
		frames := appendFrame(nil, &frame{typ: typeData, stream: 2, seq: 1, payload: bytes.Repeat([]byte("x"), 9000)})
		frames = appendFrame(frames, &frame{typ: typeBulk, payload: make([]byte, laneDescLen)}) // never nested
		frames = appendFrame(frames, &frame{typ: typeWindow, stream: 2, seq: 2, payload: []byte{1, 0, 0, 0}})
		const id = 77
		n := uint32(laneHeaderLen + len(frames))
		lane.WriteAt(append(laneHeader(int64(n), id), frames...), l.rxBase+4096)
		desc := func(off, n uint32, id uint64) []byte {
			b := make([]byte, laneDescLen)
			binary.LittleEndian.PutUint32(b[0:], off)
			binary.LittleEndian.PutUint32(b[4:], n)
			binary.LittleEndian.PutUint64(b[8:], id)
			return b
		}
		cases := []struct {
			name       string
			desc       []byte
			ok         bool
			wantFrames int
		}{
			{"valid batch", desc(4096, n, id), true, 2},
			{"another batch number", desc(4096, n, id+1), false, 0},
			{"another length", desc(4096, n-5, id), false, 0},
			{"past the half", desc(uint32(l.half-100), 200, id), false, 0},
			{"wraps uint32", desc(0xffffff00, 0x200, id), false, 0},
			{"larger than a batch", desc(0, uint32(l.maxBatch+1), id), false, 0},
			{"shorter than a header", desc(4096, 10, id), false, 0},
			{"stale: zeroes", desc(1<<20, 64<<10, 0), false, 0},
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", role, c.name), func(t *testing.T) {
				if (l.view != nil) != (role == Guest) {
					t.Fatalf("role %v reads in place: %v", role, l.view != nil)
				}
				got, ok := l.batch(c.desc, new([]byte), nil, nil)
				if ok != c.ok || len(got) != c.wantFrames {
					t.Fatalf("batch: ok=%v frames=%d, want ok=%v frames=%d", ok, len(got), c.ok, c.wantFrames)
				}
			})
		}
	}
}

// The allocator never hands out a region that overlaps a live one or
// leaves the half, whatever the order of batch sizes and acks.
func TestLaneAllocatorNeverOverlaps(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	l := &laneState{half: 2 << 20, maxBatch: 1 << 20}
	var seq, acked uint64
	allocated := 0
	for i := 0; i < 100000; i++ {
		if rng.IntN(3) == 0 && acked < seq {
			acked += uint64(rng.IntN(int(seq-acked)) + 1)
			l.ackLocked(acked)
			continue
		}
		n := int64(rng.IntN(int(l.maxBatch)) + 1)
		seq++
		off, ok := l.allocLocked(n, seq)
		if !ok {
			continue
		}
		allocated++
		if off < 0 || off+n > l.half {
			t.Fatalf("region [%d, %d) outside the half", off, off+n)
		}
		for _, r := range l.regions[:len(l.regions)-1] {
			if off < r.end && r.off < off+n {
				t.Fatalf("region [%d, %d) overlaps live [%d, %d)", off, off+n, r.off, r.end)
			}
		}
	}
	if allocated < 10000 {
		t.Fatalf("only %d allocations succeeded: the allocator refuses room it has", allocated)
	}
	// Everything acknowledged: the whole half is free again.
	l.ackLocked(seq)
	if _, ok := l.allocLocked(l.maxBatch, seq+1); !ok || len(l.regions) != 1 {
		t.Fatalf("a drained lane refused a full batch")
	}
}
