package guestimage

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

type note struct {
	name string
	typ  uint32
	desc []byte
}

// syntheticELF returns a minimal x86_64 ELF64 whose only program header is a
// PT_NOTE segment holding notes.
func syntheticELF(notes []note) []byte {
	le := binary.LittleEndian
	var nb bytes.Buffer
	pad := func() {
		for nb.Len()%4 != 0 {
			nb.WriteByte(0)
		}
	}
	for _, n := range notes {
		name := append([]byte(n.name), 0)
		binary.Write(&nb, le, [3]uint32{uint32(len(name)), uint32(len(n.desc)), n.typ})
		nb.Write(name)
		pad()
		nb.Write(n.desc)
		pad()
	}
	const ehsize, phentsize = 64, 56
	var b bytes.Buffer
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, le, struct {
		Type, Machine                              uint16
		Version                                    uint32
		Entry, Phoff, Shoff                        uint64
		Flags                                      uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum uint16
		Shstrndx                                   uint16
	}{2, 62, 1, 0x1000000, ehsize, 0, 0, ehsize, phentsize, 1, 64, 0, 0})
	binary.Write(&b, le, struct {
		Type, Flags                                uint32
		Offset, Vaddr, Paddr, Filesz, Memsz, Align uint64
	}{4, 4, ehsize + phentsize, 0, 0, uint64(nb.Len()), uint64(nb.Len()), 4})
	b.Write(nb.Bytes())
	return b.Bytes()
}

func TestPVHEntry(t *testing.T) {
	entry := binary.LittleEndian.AppendUint32(nil, 0x1000e40)
	tests := []struct {
		name      string
		notes     []note
		wantOK    bool
		wantEntry uint64
	}{
		{"xen phys32 entry after other notes", []note{
			{"GNU", 3, make([]byte, 20)},
			{"Xen", 6, []byte("linux\x00")}, // XEN_ELFNOTE_GUEST_OS
			{"Xen", 18, entry},
		}, true, 0x1000e40},
		{"only other xen notes", []note{{"Xen", 6, []byte("linux\x00")}}, false, 0},
		{"type 18 but not Xen", []note{{"Linux", 18, entry}}, false, 0},
		{"no notes", nil, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "vmlinux")
			if err := os.WriteFile(p, syntheticELF(tc.notes), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := checkKernelELF(p); err != nil {
				t.Fatal(err)
			}
			got, ok, err := PVHEntry(p)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK || got != tc.wantEntry {
				t.Errorf("PVHEntry = %#x, %v; want %#x, %v", got, ok, tc.wantEntry, tc.wantOK)
			}
		})
	}
}

// TestRealVmlinux checks the kernel that scripts/setup.sh fetched. In CI the
// cache must be there (setup.sh runs first); elsewhere its absence skips
// (missingPrereq).
func TestRealVmlinux(t *testing.T) {
	found, _ := filepath.Glob(filepath.Join(DefaultCacheDir(), "linux-image-*", "vmlinux"))
	if len(found) == 0 {
		missingPrereq(t, "the kernel cache is missing (no "+DefaultCacheDir()+"/linux-image-*/vmlinux)")
	}
	for _, p := range found {
		t.Run(filepath.Base(filepath.Dir(p)), func(t *testing.T) {
			if err := checkKernelELF(p); err != nil {
				t.Fatal(err)
			}
			entry, ok, err := PVHEntry(p)
			if err != nil {
				t.Fatal(err)
			}
			if !ok || entry == 0 {
				t.Fatalf("%s has no PVH entry note", p)
			}
			t.Logf("PVH entry %#x", entry)
			bz := filepath.Join(filepath.Dir(p), "boot")
			imgs, _ := filepath.Glob(filepath.Join(bz, "vmlinuz-*"))
			for _, img := range imgs {
				b, err := os.ReadFile(img)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := bzImagePayload(b); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func TestBzImagePayloadRejectsNonBzImage(t *testing.T) {
	if _, err := bzImagePayload(make([]byte, 4096)); err == nil {
		t.Fatal("accepted zeros as a bzImage")
	}
}
