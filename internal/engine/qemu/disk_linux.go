package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nethersandbox/nether/internal/disk"
	"github.com/nethersandbox/nether/internal/engine"
)

// The persistent disk. QEMU opens it through -blockdev, in the format
// the session found (a raw ext4 image, or a qcow2 layer nether made),
// with the host page cache and flushes passed through: a guest fsync
// becomes a flush request, which QEMU turns into an fdatasync of the
// file before the guest's fsync returns. QEMU's own image locking stays
// on as a second guard behind the session's lock.

// dataDevice is the persistent disk's block device.
const dataDevice = "virtio-blk-pci,drive=data,serial=" + engine.DataDiskSerial

// qemuImg is the image tool of Debian's qemu-utils.
const qemuImg = "qemu-img"

// dataBlockdev is the -blockdev JSON for the disk (JSON, so a path needs
// no escaping of QEMU's option commas).
func dataBlockdev(d *engine.Disk) string {
	driver := "raw"
	if d.QCOW2 {
		driver = "qcow2"
	}
	node := map[string]any{
		"driver":    driver,
		"node-name": "data",
		"file":      map[string]any{"driver": "file", "filename": d.Path},
	}
	b, _ := json.Marshal(node) // plain strings: cannot fail
	return string(b)
}

// CreateLayer makes path a new qcow2 layer over backing (a committed
// artifact's disk layer, itself qcow2): a few hundred KiB of metadata,
// whatever the disk's size, written in-process (disk.WriteLayer) because
// a fork waits for it. path must not exist: a fork never writes into a
// file that was there before it.
func (e *Engine) CreateLayer(ctx context.Context, path, backing string) (err error) {
	backing, err = filepath.Abs(backing)
	if err != nil {
		return fmt.Errorf("creating the fork's disk layer: %w", err)
	}
	size, err := disk.LayerSize(backing)
	if err != nil {
		return fmt.Errorf("creating the fork's disk layer over %s: %w", backing, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("the fork's disk layer %s already exists: a fork writes into a new layer; remove it or set disk = to a new path", path)
		}
		return fmt.Errorf("creating the fork's disk layer: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("creating the fork's disk layer %s: %w", path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := disk.WriteLayer(f, backing, size); err != nil {
		return fmt.Errorf("creating the fork's disk layer %s over %s: %w", path, backing, err)
	}
	return nil
}

func runQemuImg(ctx context.Context, args ...string) error {
	bin, err := exec.LookPath(qemuImg)
	if err != nil {
		return fmt.Errorf("finding %s: %w (install Debian's qemu-utils, or run scripts/setup.sh)", qemuImg, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", qemuImg, args[0], err, strings.TrimSpace(out.String()))
	}
	return nil
}

// CaptureDisk starts a point-in-time copy of the paused machine's disk
// into the sink's disk file: a backup job with copy-before-write, so the
// guest runs again at once and every block it writes afterwards is
// copied out in its old version first. The copy is a standalone qcow2
// holding only the disk's data (holes and zeros stay unallocated), so it
// costs what the disk holds, not its size.
func (m *Machine) CaptureDisk(ctx context.Context, sink engine.Sink) (func(context.Context) error, error) {
	if !m.disk {
		return nil, errors.New("the machine has no persistent disk")
	}
	size, err := m.diskSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("capturing the disk: %w", err)
	}
	f, err := sink.CreateFile(engine.DiskFileName)
	if err != nil {
		return nil, err
	}
	path := f.Name()
	f.Close()
	if err := runQemuImg(ctx, "create", "-q", "-f", "qcow2", path, fmt.Sprint(size)); err != nil {
		return nil, fmt.Errorf("capturing the disk: %w", err)
	}
	m.captures++
	node := fmt.Sprintf("capture%d", m.captures)
	if _, err := m.qmp.execute(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": node,
		"file": map[string]any{"driver": "file", "filename": path},
	}); err != nil {
		return nil, fmt.Errorf("capturing the disk: opening the copy: %w", err)
	}
	if _, err := m.qmp.execute(ctx, "blockdev-backup", map[string]any{
		"job-id": node, "device": "data", "target": node, "sync": "full", "auto-dismiss": false,
	}); err != nil {
		m.qmp.execute(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node})
		return nil, fmt.Errorf("capturing the disk: starting the copy: %w", err)
	}
	return func(ctx context.Context) error { return m.finishBackup(ctx, node, path) }, nil
}

// finishBackup waits for the backup job to conclude, then releases the
// job and the copy's node and makes the copy durable. A cancelled wait
// cancels the job.
func (m *Machine) finishBackup(ctx context.Context, node, path string) error {
	cleanup := func() {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		m.qmp.execute(c, "job-dismiss", map[string]any{"id": node})
		m.qmp.execute(c, "blockdev-del", map[string]any{"node-name": node})
	}
	delay := time.Millisecond
	for {
		raw, err := m.qmp.execute(ctx, "query-jobs", nil)
		if err != nil {
			select {
			case <-m.done:
				return m.exitError("QEMU exited while copying the disk")
			default:
			}
			if ctx.Err() != nil {
				m.cancelBackup(node)
				cleanup()
				return fmt.Errorf("copying the disk: %w", ctx.Err())
			}
			cleanup()
			return fmt.Errorf("copying the disk: %w", err)
		}
		var jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		json.Unmarshal(raw, &jobs)
		found := false
		for _, j := range jobs {
			if j.ID != node {
				continue
			}
			found = true
			if j.Status == "concluded" {
				cleanup()
				if j.Error != "" {
					return fmt.Errorf("copying the disk: %s", j.Error)
				}
				return syncPath(path)
			}
		}
		if !found {
			cleanup()
			return errors.New("copying the disk: the backup job vanished")
		}
		select {
		case <-ctx.Done():
			m.cancelBackup(node)
			cleanup()
			return fmt.Errorf("copying the disk: %w", ctx.Err())
		case <-m.done:
			return m.exitError("QEMU exited while copying the disk")
		case <-time.After(delay):
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// cancelBackup stops a backup job and waits (briefly) for it to conclude.
func (m *Machine) cancelBackup(node string) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.qmp.execute(c, "job-cancel", map[string]any{"id": node})
	for c.Err() == nil {
		raw, err := m.qmp.execute(c, "query-jobs", nil)
		if err != nil || !bytes.Contains(raw, []byte(`"`+node+`"`)) || bytes.Contains(raw, []byte(`"concluded"`)) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// diskSize is the disk's virtual size, as QEMU sees it.
func (m *Machine) diskSize(ctx context.Context) (int64, error) {
	raw, err := m.qmp.execute(ctx, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return 0, err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
		Image    struct {
			VirtualSize int64 `json:"virtual-size"`
		} `json:"image"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return 0, fmt.Errorf("decoding query-named-block-nodes: %w", err)
	}
	for _, n := range nodes {
		if n.NodeName == "data" && n.Image.VirtualSize > 0 {
			return n.Image.VirtualSize, nil
		}
	}
	return 0, errors.New("QEMU reports no size for the disk")
}

func syncPath(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("syncing the disk copy: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing the disk copy: %w", err)
	}
	return nil
}

var (
	_ engine.DiskCapturer = (*Machine)(nil)
	_ engine.LayerMaker   = (*Engine)(nil)
)
