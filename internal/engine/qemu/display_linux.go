package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/framebuf"
)

// displayDevice is the display a Spec.Display machine gets: virtio-gpu
// with VGA compatibility. Until a guest DRM driver takes it over (ours
// loads none) its scanout is plain VGA, so the firmware's and the
// kernel's VGA text console show on it with no guest module at all.
const displayDevice = "virtio-vga"

// maxScreendump bounds what Screendump reads back: a PPM header and the
// largest frame framebuf accepts.
const maxScreendump = framebuf.MaxPixBytes + 64

// Screendump asks QEMU to write the scanout as a PPM into an anonymous
// memory file handed to it over QMP (add-fd, then screendump to its
// /dev/fdset path), and reads it back. Nothing is ever named on a
// filesystem, so there is no file to protect or to leave behind, however
// the call ends.
func (m *Machine) Screendump(ctx context.Context) ([]byte, error) {
	if !m.display {
		return nil, engine.ErrNoDisplay
	}
	fd, err := unix.MemfdCreate("nether-screendump", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("screendump: creating its memory file: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "screendump")
	defer mem.Close()
	// QEMU opens an fdset path write-only and only takes a descriptor of
	// the same access mode: a write-only reopening of the memfd.
	wr, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("screendump: reopening its memory file write-only: %w", err)
	}
	raw, err := m.qmp.executeFD(ctx, "add-fd", nil, wr)
	wr.Close() // QEMU holds its own copy now, or none
	if err != nil {
		return nil, fmt.Errorf("screendump: handing QEMU the memory file: %w", err)
	}
	var added struct {
		FDSet int `json:"fdset-id"`
	}
	if err := json.Unmarshal(raw, &added); err != nil {
		return nil, fmt.Errorf("screendump: decoding add-fd's reply %s: %w", raw, err)
	}
	defer func() {
		// QEMU's copy goes with its fdset, also when the screendump
		// failed or our context ended.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		m.qmp.execute(rctx, "remove-fd", map[string]any{"fdset-id": added.FDSet})
	}()
	if _, err := m.qmp.execute(ctx, "screendump", map[string]any{
		"filename": fmt.Sprintf("/dev/fdset/%d", added.FDSet),
	}); err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	fi, err := mem.Stat()
	if err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("screendump: QEMU wrote nothing")
	}
	if fi.Size() > maxScreendump {
		return nil, fmt.Errorf("screendump: QEMU wrote %d bytes, more than the %d a frame may have", fi.Size(), maxScreendump)
	}
	b := make([]byte, fi.Size())
	if _, err := mem.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("screendump: reading its memory file: %w", err)
	}
	return b, nil
}

// warnPVHDisplay warns when a display machine boots an ELF kernel: QEMU
// enters it through PVH, which hands the kernel no screen description,
// so the kernel keeps a dummy console and the display shows only what the
// firmware printed. A bzImage (build/guest/vmlinuz) boots through the
// Linux boot protocol, whose setup code records VGA text mode, and the
// guest's ttys show on the display.
func warnPVHDisplay(log *slog.Logger, kernel string) {
	f, err := os.Open(kernel)
	if err != nil {
		return // Start reports a missing kernel itself
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err == nil && bytes.Equal(magic[:], []byte("\x7fELF")) {
		log.Warn("the display will not show the guest's consoles: the kernel is an ELF image booted through PVH; boot a bzImage (vmlinuz) for a display",
			"kernel", kernel)
	}
}
