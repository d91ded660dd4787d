package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFindMapping(t *testing.T) {
	maps := strings.Join([]string{
		"55d0c0a00000-55d0c0b00000 r-xp 00000000 fd:01 1234   /usr/bin/qemu-system-x86_64",
		"7f0000000000-7f0000400000 rw-p 00001000 00:01 77     /memfd:nether-channel-lane (deleted)",
		"7f1000000000-7f1000200000 rw-p 00000000 00:01 78     /memfd:nether-channel-lane (deleted)",
		"7f2000000000-7f2000400000 rw-p 00000000 00:01 79     /memfd:nether-guest-ram (deleted)",
		"7f3000000000-7f3000400000 rw-p 00000000 00:01 80     /memfd:nether-channel-lane (deleted)",
		"7f4000000000-7f4000400000 rw-p 00000000 00:00 0 ",
	}, "\n") + "\n"
	p := filepath.Join(t.TempDir(), "maps")
	os.WriteFile(p, []byte(maps), 0o600)
	// The lane is the whole file from its start: not the map at an
	// offset, not the one of another size, not another memfd.
	got, err := findMapping(p, "/memfd:"+laneMemfdName, laneBytes)
	if err != nil || got != 0x7f3000000000 {
		t.Fatalf("findMapping = %#x, %v; want 0x7f3000000000", got, err)
	}
	if _, err := findMapping(p, "/memfd:nothing", laneBytes); err == nil || !strings.Contains(err.Error(), "no mapping of /memfd:nothing") {
		t.Fatalf("a missing mapping: err = %v", err)
	}
}

// The lane reaches QEMU's memory through /proc/PID/mem: here our own, at
// a mapping of a memfd named as QEMU's is.
func TestProcLaneReadsAndWritesTheMapping(t *testing.T) {
	f, err := newLane()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := mmapFile(f, laneBytes)
	if err != nil {
		t.Fatal(err)
	}
	var l procLane
	if err := l.open(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WriteAt([]byte("through proc"), laneBytes-12); err != nil {
		t.Fatal(err)
	}
	if string(mem[laneBytes-12:]) != "through proc" {
		t.Fatalf("the mapping holds %q", mem[laneBytes-12:])
	}
	copy(mem[100:], "from the map")
	buf := make([]byte, 12)
	if _, err := l.ReadAt(buf, 100); err != nil || string(buf) != "from the map" {
		t.Fatalf("ReadAt = %q, %v", buf, err)
	}
	if _, err := l.ReadAt(buf, laneBytes-4); err == nil {
		t.Fatal("a read past the lane succeeded")
	}
	l.close()
	if _, err := l.WriteAt(buf, 0); err == nil {
		t.Fatal("a write after close succeeded")
	}
	if err := l.open(os.Getpid()); err == nil {
		t.Fatal("open after close succeeded")
	}
}

func mmapFile(f *os.File, size int) ([]byte, error) {
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}
