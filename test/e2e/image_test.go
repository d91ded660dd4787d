package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/rootimage"
	"github.com/nethersandbox/nether/internal/testharness"
)

var (
	guestToolOnce sync.Once
	guestToolBin  string
	guestToolErr  error
)

// netherGuest builds cmd/nether-guest once per run, beside the other
// binaries TestMain built.
func netherGuest(t *testing.T) string {
	t.Helper()
	guestToolOnce.Do(func() {
		guestToolErr = testharness.Build(repoRoot, binDir, nil, "./cmd/nether-guest")
		guestToolBin = filepath.Join(binDir, "nether-guest")
	})
	if guestToolErr != nil {
		t.Fatalf("building nether-guest: %v", guestToolErr)
	}
	return guestToolBin
}

// busyboxTree makes the smallest root with a working /bin/sh: the host's
// static busybox (Debian's busybox-static, which setup installs) with a
// symlink for each of its applets, and a root user.
func busyboxTree(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox is not installed (scripts/setup.sh installs busybox-static): %v", err)
	}
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "bin/sh")); err != nil {
		t.Fatalf("busybox has no sh applet: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// tarTree writes the tree under root as a tar stream, names relative to
// root, as docker export does.
func tarTree(t *testing.T, w io.Writer, root string) {
	t.Helper()
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatalf("archiving %s: %v", root, err)
	}
}

func marker(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// importImage runs nether-guest import with args into a fresh --out and
// returns the image's path, logging the time it took and the image's size.
func importGuest(t *testing.T, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image")
	args = append([]string{"import", "--out", out}, args...)
	bin := netherGuest(t)
	start := time.Now()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nether-guest %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	took := time.Since(start)
	img := filepath.Join(out, rootimage.ImageFile)
	m, err := rootimage.ReadManifest(filepath.Join(out, rootimage.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != m.Bytes || m.Platform != "linux/amd64" || m.Format != rootimage.FormatErofs {
		t.Fatalf("manifest %+v for an image of %d bytes", m, fi.Size())
	}
	t.Logf("import took %s; image %.2f MiB: %s", took.Round(time.Millisecond), float64(fi.Size())/(1<<20), strings.TrimSpace(stdout.String()))
	return img
}

// checkImageGuest boots a sandbox on img and checks its root is that
// image: the test's file is there, /bin/sh is busybox's, and / is the
// overlay over it.
func checkImageGuest(t *testing.T, img, hello string) *client.Client {
	t.Helper()
	t0 := time.Now()
	sb := start(t, "rootfs = "+img)
	c := sb.dial()
	if out := mustRun(t, c, "cat /hello.txt"); out != hello+"\n" {
		t.Fatalf("/hello.txt = %q, want %q", out, hello+"\n")
	}
	t.Logf("booted and ran the first command in %s", time.Since(t0).Round(time.Millisecond))
	if out := mustRun(t, c, "readlink /bin/sh; awk '$2 == \"/\" {print $3}' /proc/mounts; cat /etc/hostname; id -u; pwd"); out != "busybox\noverlay\nsandbox\n0\n/root\n" {
		t.Fatalf("imported guest: %q", out)
	}
	mustRun(t, c, "echo w > /tmp/w && cat /tmp/w && echo w > /bin/written")
	return c
}

// TestImageFromTarball: a root tarball (as docker export writes one,
// gzip-compressed) imported with nether-guest import --tar boots as the
// guest's root with rootfs = <image>.
func TestImageFromTarball(t *testing.T) {
	t.Parallel()
	needGuest(t)
	root := busyboxTree(t)
	hello := "from the tarball " + marker(t)
	if err := os.WriteFile(filepath.Join(root, "hello.txt"), []byte(hello+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "root.tar.gz")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	tarTree(t, zw, root)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	img := importGuest(t, "--tar", archive)
	checkImageGuest(t, img, hello)
}

// TestImageFromOCILayout: an OCI image layout of two layers, the second
// whiting out a file and making a directory opaque, imported with
// nether-guest import --oci-layout from an index that also has an arm64
// image, boots with the layers flattened.
func TestImageFromOCILayout(t *testing.T) {
	t.Parallel()
	needGuest(t)
	root := busyboxTree(t)
	for p, data := range map[string]string{"etc/gone": "lower", "opt/old/a": "lower", "opt/keep": "kept"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var lower bytes.Buffer
	tarTree(t, &lower, root)
	hello := "from the OCI layout " + marker(t)
	upper := tarOfFiles(t, map[string]string{
		"etc/.wh.gone":         "",
		"opt/old/.wh..wh..opq": "",
		"opt/old/b":            "upper",
		"hello.txt":            hello + "\n",
	})
	img := ociImageOf(t, "amd64", lower.Bytes(), upper)
	other := ociImageOf(t, "arm64", upper)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	c := checkImageGuest(t, importGuest(t, "--oci-layout", dir), hello)
	if out := mustRun(t, c, "test ! -e /etc/gone && ls /opt/old && cat /opt/keep"); out != "b\nkept" {
		t.Fatalf("flattened layers: %q, want /etc/gone whited out and /opt/old holding only b", out)
	}
}

// tarOfFiles is a tar stream of regular files (their directories implied).
func tarOfFiles(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// ociImageOf is an image for linux/arch of the tar streams, bottom first.
func ociImageOf(t *testing.T, arch string, layers ...[]byte) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
