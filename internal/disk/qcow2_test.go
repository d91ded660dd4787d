package disk

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// needQEMUTools skips without qemu-img and qemu-io, except in CI.
func needQEMUTools(t *testing.T) { needPackage(t, "qemu-utils", "qemu-img", "qemu-io") }

func qemuTool(t *testing.T, prog string, args ...string) string {
	t.Helper()
	out, err := exec.Command(prog, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
	// qemu-io reports a failed pattern check on stdout and still exits 0.
	if strings.Contains(string(out), "Pattern verification failed") || strings.Contains(string(out), "failed") {
		t.Fatalf("%s %s:\n%s", prog, strings.Join(args, " "), out)
	}
	return string(out)
}

func newLayer(t *testing.T, path, backing string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WriteLayer(f, backing, size); err != nil {
		t.Fatal(err)
	}
}

// A layer WriteLayer makes is one QEMU accepts as its own: qemu-img
// checks it clean and names its backing file and format; reads go
// through to the backing image, writes land in the layer only, and the
// layer stays clean after them.
func TestWriteLayer(t *testing.T) {
	needQEMUTools(t)
	for _, size := range []int64{64 * MiB, 1 << 30, 3<<30 + 512} {
		t.Run(fmt.Sprintf("%d bytes", size), func(t *testing.T) {
			dir := t.TempDir()
			base := filepath.Join(dir, "base.qcow2")
			qemuTool(t, "qemu-img", "create", "-q", "-f", "qcow2", base, formatBytes(size))
			qemuTool(t, "qemu-io", "-c", "write -P 0xcd 1M 64k", base)

			got, err := LayerSize(base)
			if err != nil || got != size {
				t.Fatalf("LayerSize = %d, %v; want %d", got, err, size)
			}
			layer := filepath.Join(dir, "layer.qcow2")
			newLayer(t, layer, base, size)

			qemuTool(t, "qemu-img", "check", "-q", layer)
			var info struct {
				VirtualSize    int64  `json:"virtual-size"`
				Format         string `json:"format"`
				Backing        string `json:"backing-filename"`
				BackingFormat  string `json:"backing-filename-format"`
				DirtyFlag      bool   `json:"dirty-flag"`
				ActualSizeByte int64  `json:"actual-size"`
			}
			if err := json.Unmarshal([]byte(qemuTool(t, "qemu-img", "info", "--output=json", layer)), &info); err != nil {
				t.Fatal(err)
			}
			if info.VirtualSize != size || info.Format != "qcow2" || info.Backing != base || info.BackingFormat != "qcow2" || info.DirtyFlag {
				t.Fatalf("qemu-img info: %+v", info)
			}
			if info.ActualSizeByte > 1*MiB {
				t.Fatalf("the empty layer takes %d bytes on disk", info.ActualSizeByte)
			}

			qemuTool(t, "qemu-io", "-r", "-c", "read -P 0xcd 1M 64k", layer) // through to the base
			qemuTool(t, "qemu-io", "-c", "write -P 0xab 0 128k", "-c", "write -P 0xef "+formatBytes(size-65536)+" 64k", layer)
			qemuTool(t, "qemu-img", "check", "-q", layer)
			qemuTool(t, "qemu-io", "-r", "-c", "read -P 0xab 0 128k", "-c", "read -P 0xcd 1M 64k", layer)
			qemuTool(t, "qemu-io", "-r", "-c", "read -P 0 0 128k", base) // the base never sees the layer's writes
		})
	}
}

func formatBytes(n int64) string { return strconv.FormatInt(n, 10) }

func TestWriteLayerRefuses(t *testing.T) {
	dir := t.TempDir()
	long := "/" + strings.Repeat("d", maxBackingName)
	for _, c := range []struct {
		name, backing string
		size          int64
		want          string
	}{
		{"a relative backing path", "base.qcow2", MiB, "absolute path"},
		{"an empty size", "/base.qcow2", 0, "positive multiple of 512"},
		{"a size that is no multiple of 512", "/base.qcow2", MiB + 1, "positive multiple of 512"},
		{"a backing name longer than qcow2 allows", long, MiB, "longer than qcow2 allows"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = WriteLayer(f, c.backing, c.size)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
			if st, _ := f.Stat(); st.Size() != 0 {
				t.Fatalf("a refused layer wrote %d bytes", st.Size())
			}
		})
	}
}

func TestLayerSizeRefusesRaw(t *testing.T) {
	p := filepath.Join(t.TempDir(), "raw.img")
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LayerSize(p); err == nil || !strings.Contains(err.Error(), "not a qcow2 image") {
		t.Fatalf("err = %v", err)
	}
}
