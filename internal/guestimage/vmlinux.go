package guestimage

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit PVH entry
// point. QEMU's -kernel boots an ELF directly (no real-mode setup, no
// in-guest decompression) only when this note is present.
const xenElfnotePhys32Entry = 18

var xzMagic = []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}

// bzImagePayload returns the compressed kernel inside a bzImage. It trusts
// the boot protocol's payload_offset/payload_length (2.08+) and falls back to
// scanning for the XZ magic if the header looks wrong.
func bzImagePayload(img []byte) ([]byte, error) {
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage (no HdrS boot header)")
	}
	setupSects := int(img[0x1f1])
	if setupSects == 0 {
		setupSects = 4 // boot protocol: 0 means 4
	}
	base := (setupSects + 1) * 512
	off := int(binary.LittleEndian.Uint32(img[0x248:]))
	n := int(binary.LittleEndian.Uint32(img[0x24c:]))
	if start := base + off; off > 0 && n > 0 && start+n <= len(img) {
		p := img[start : start+n]
		if bytes.HasPrefix(p, xzMagic) {
			return p, nil
		}
		return nil, fmt.Errorf("bzImage payload is not XZ (starts % x); only XZ kernels are supported", p[:min(6, len(p))])
	}
	if i := bytes.Index(img, xzMagic); i >= 0 {
		return img[i:], nil
	}
	return nil, errors.New("no XZ payload found in bzImage")
}

// ExtractVmlinux decompresses the ELF kernel out of bzImage and writes it
// atomically to dst. xz(1) does the work: the kernel's XZ stream uses the x86
// BCJ filter, which pure-Go xz decoders don't implement.
func ExtractVmlinux(ctx context.Context, bzImage, dst string) error {
	img, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	payload, err := bzImagePayload(img)
	if err != nil {
		return fmt.Errorf("%s: %w", bzImage, err)
	}
	xz, err := exec.LookPath("xz")
	if err != nil {
		return errors.New("xz not found; install xz-utils")
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".vmlinux-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	// --single-stream: the payload is followed by the 4-byte decompressed
	// size that the kernel's own decompressor appends; ignore it.
	cmd := exec.CommandContext(ctx, xz, "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Stdout = tmp
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("decompressing %s: %v: %s", bzImage, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := checkKernelELF(tmp.Name()); err != nil {
		return fmt.Errorf("decompressed %s: %w", bzImage, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

func checkKernelELF(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("ELF is %v/%v, want ELFCLASS64/EM_X86_64", f.Class, f.Machine)
	}
	return nil
}

// PVHEntry returns the physical PVH entry point of an ELF kernel, or
// ok=false when it has no Xen PHYS32_ENTRY note (QEMU then can't boot it
// with -kernel; use the bzImage).
func PVHEntry(vmlinux string) (entry uint64, ok bool, err error) {
	f, err := elf.Open(vmlinux)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	// Only PT_NOTE segments count: that is where QEMU's ELF loader looks.
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return 0, false, err
		}
		if e, found := findXenNote(data, f.ByteOrder); found {
			return e, true, nil
		}
	}
	return 0, false, nil
}

// findXenNote walks ELF notes (namesz, descsz, type, name, desc; name and
// desc padded to 4 bytes) looking for name "Xen", type PHYS32_ENTRY.
func findXenNote(data []byte, bo binary.ByteOrder) (uint64, bool) {
	align4 := func(n uint32) int { return int((n + 3) &^ 3) }
	for len(data) >= 12 {
		namesz, descsz, typ := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		data = data[12:]
		if align4(namesz) > len(data) {
			return 0, false
		}
		name := data[:namesz]
		data = data[align4(namesz):]
		if align4(descsz) > len(data) {
			return 0, false
		}
		desc := data[:descsz]
		data = data[align4(descsz):]
		if string(bytes.TrimRight(name, "\x00")) == "Xen" && typ == xenElfnotePhys32Entry {
			switch len(desc) {
			case 4:
				return uint64(bo.Uint32(desc)), true
			case 8:
				return bo.Uint64(desc), true
			}
			return 0, true
		}
	}
	return 0, false
}
