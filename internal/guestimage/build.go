package guestimage

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/u-root/u-root/pkg/cpio"
)

// Output file names inside BuildOptions.Out.
const (
	VmlinuxFile   = "vmlinux"
	VmlinuzFile   = "vmlinuz"
	InitramfsFile = "initramfs.cpio"
	ManifestFile  = "manifest.json"
	// ModuleListPath is the in-image file the agent reads: one absolute
	// module path per line, in load order.
	ModuleListPath = "/etc/nether/modules"
	// NetModuleListPath lists, in the same form, the modules a guest with
	// a network (nether.net=1) loads after those of ModuleListPath; none
	// of them is in ModuleListPath.
	NetModuleListPath = "/etc/nether/modules.net"
	// DiskModuleListPath lists, in the same form, the modules a guest
	// with block devices (a root image, a /data disk) loads; none of them
	// is in the lists above.
	DiskModuleListPath = "/etc/nether/modules.disk"
	// Ext4ModuleListPath lists the modules a guest that mounts ext4 (a
	// /data disk, an ext4 root image) loads after DiskModuleListPath's;
	// none of them is in the lists above.
	Ext4ModuleListPath = "/etc/nether/modules.ext4"
)

// formatVersion changes whenever the image layout changes, so that a build
// with identical inputs but a newer builder is not skipped.
// 2: the network's modules, in their own list.
// 3: the block devices' modules, in their own list.
// 4: ext4's modules, in a list of their own.
const formatVersion = 4

// DefaultBusybox is where busybox-static puts its binary.
const DefaultBusybox = "/bin/busybox"

// BuildOptions are the inputs of Build.
type BuildOptions struct {
	Kernel  *Kernel
	Agent   string   // path of the static agent binary; becomes /init
	Busybox string   // static busybox; default DefaultBusybox
	Modules []string // root module names; default DefaultModules
	// NetModules are the root modules only a guest with a network loads;
	// default DefaultNetModules (nil means the default, an empty list
	// none).
	NetModules []string
	// DiskModules are the root modules only a guest with block devices
	// loads; default DefaultDiskModules (nil means the default).
	DiskModules []string
	// Ext4Modules are the root modules only a guest that mounts ext4
	// loads; default DefaultExt4Modules (nil means the default).
	Ext4Modules []string
	Out         string // output directory
}

// Manifest describes a built guest image. It is written to Out/manifest.json.
type Manifest struct {
	Format               int    `json:"format"`
	KernelVersion        string `json:"kernel_version"`
	KernelPackage        string `json:"kernel_package"`
	KernelPackageVersion string `json:"kernel_package_version"`
	PVH                  bool   `json:"pvh"` // vmlinux is bootable with QEMU -kernel
	SHA256               struct {
		Vmlinux   string `json:"vmlinux"`
		Vmlinuz   string `json:"vmlinuz"`
		Initramfs string `json:"initramfs"`
		Agent     string `json:"agent"`
		Busybox   string `json:"busybox"`
	} `json:"sha256"`
	InitramfsSize   int64    `json:"initramfs_size"`
	RootModules     []string `json:"root_modules"`
	BuiltinModules  []string `json:"builtin_modules"` // roots the kernel has built in
	Modules         []string `json:"modules"`         // in-image paths, load order
	NetRootModules  []string `json:"net_root_modules"`
	NetModules      []string `json:"net_modules"` // in-image paths, load order, after Modules
	DiskRootModules []string `json:"disk_root_modules"`
	DiskModules     []string `json:"disk_modules"` // in-image paths, load order, after Modules
	Ext4RootModules []string `json:"ext4_root_modules"`
	Ext4Modules     []string `json:"ext4_modules"` // in-image paths, load order, after DiskModules

	// Stamps records size, mtime and inode of every input and output next
	// to its digest, so an unchanged file is not hashed again: hashing the
	// 66 MB vmlinux twice costs over a second on these machines.
	Stamps map[string]FileStamp `json:"stamps"`

	// Reused is set when Build found an up-to-date image and did nothing.
	Reused bool `json:"-"`
}

// FileStamp identifies one version of a file cheaply.
type FileStamp struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	MTime  int64  `json:"mtime_ns"`
	Ino    uint64 `json:"ino"`
	SHA256 string `json:"sha256"`
}

// Roles of files in Manifest.Stamps.
const (
	stampVmlinux      = "in/vmlinux"
	stampVmlinuz      = "in/vmlinuz"
	stampAgent        = "in/agent"
	stampBusybox      = "in/busybox"
	stampOutVmlinux   = "out/" + VmlinuxFile
	stampOutVmlinuz   = "out/" + VmlinuzFile
	stampOutInitramfs = "out/" + InitramfsFile
)

func stat(p string) (FileStamp, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return FileStamp{}, err
	}
	st := FileStamp{Path: p, Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.Ino = sys.Ino
	}
	return st, nil
}

// digest returns p's sha256, reusing the one recorded under role in old when
// the file's stamp is unchanged, and records the stamp in m.
func digest(m, old *Manifest, role, p string) (string, error) {
	st, err := stat(p)
	if err != nil {
		return "", err
	}
	if o, ok := old.stamp(role); ok && o.Path == st.Path && o.Size == st.Size && o.MTime == st.MTime && o.Ino == st.Ino && o.SHA256 != "" {
		st.SHA256 = o.SHA256
	} else if st.SHA256, err = FileSHA256(p); err != nil {
		return "", err
	}
	if m.Stamps == nil {
		m.Stamps = map[string]FileStamp{}
	}
	m.Stamps[role] = st
	return st.SHA256, nil
}

func (m *Manifest) stamp(role string) (FileStamp, bool) {
	if m == nil {
		return FileStamp{}, false
	}
	st, ok := m.Stamps[role]
	return st, ok
}

// Build writes Out/vmlinux, Out/vmlinuz, Out/initramfs.cpio and
// Out/manifest.json. If the manifest already there was made from the same
// inputs and the outputs still match it, Build returns it without writing.
func Build(opts BuildOptions) (*Manifest, error) {
	if opts.Kernel == nil {
		return nil, errors.New("guestimage.Build: no kernel")
	}
	if opts.Agent == "" {
		return nil, errors.New("guestimage.Build: no agent binary given")
	}
	if opts.Out == "" {
		return nil, errors.New("guestimage.Build: no output directory given")
	}
	if opts.Busybox == "" {
		opts.Busybox = DefaultBusybox
	}
	if opts.Modules == nil {
		opts.Modules = DefaultModules
	}
	if opts.NetModules == nil {
		opts.NetModules = DefaultNetModules
	}
	if opts.DiskModules == nil {
		opts.DiskModules = DefaultDiskModules
	}
	if opts.Ext4Modules == nil {
		opts.Ext4Modules = DefaultExt4Modules
	}
	k := opts.Kernel

	if err := checkStatic(opts.Agent, "agent"); err != nil {
		return nil, err
	}
	if err := checkStatic(opts.Busybox, "busybox"); err != nil {
		if errors.Is(err, errDynamic) {
			return nil, fmt.Errorf("%w; install busybox-static", err)
		}
		return nil, err
	}

	m := &Manifest{
		Format:               formatVersion,
		KernelVersion:        k.Version,
		KernelPackage:        k.Package,
		KernelPackageVersion: k.PackageVersion,
		PVH:                  k.PVH,
		RootModules:          slices.Clone(opts.Modules),
		NetRootModules:       slices.Clone(opts.NetModules),
		DiskRootModules:      slices.Clone(opts.DiskModules),
		Ext4RootModules:      slices.Clone(opts.Ext4Modules),
	}
	// A missing or unreadable old manifest just means a full build.
	old, _ := ReadManifest(opts.Out)
	var err error
	for _, f := range []struct {
		dst        *string
		role, path string
	}{
		{&m.SHA256.Vmlinux, stampVmlinux, k.Vmlinux}, {&m.SHA256.Vmlinuz, stampVmlinuz, k.Vmlinuz},
		{&m.SHA256.Agent, stampAgent, opts.Agent}, {&m.SHA256.Busybox, stampBusybox, opts.Busybox},
	} {
		if *f.dst, err = digest(m, old, f.role, f.path); err != nil {
			return nil, err
		}
	}

	if upToDate(opts.Out, old, m) {
		m.SHA256.Initramfs = old.SHA256.Initramfs
		m.InitramfsSize = old.InitramfsSize
		m.BuiltinModules = old.BuiltinModules
		m.Modules = old.Modules
		m.NetModules = old.NetModules
		m.DiskModules = old.DiskModules
		m.Ext4Modules = old.Ext4Modules
		m.Reused = true
		// Rewrite only when a stamp moved (e.g. the agent was rebuilt with
		// the same bytes), so the next run can skip hashing it again.
		if !maps.EqualFunc(m.Stamps, old.Stamps, func(a, b FileStamp) bool { return a == b }) {
			if err := writeManifest(opts.Out, m); err != nil {
				return nil, err
			}
		}
		return m, nil
	}

	ix, err := LoadModuleIndex(k.ModulesDir)
	if err != nil {
		return nil, err
	}
	modPaths, builtin, err := ix.Resolve(opts.Modules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", k.Version, err)
	}
	netPaths, netBuiltin, err := ix.Resolve(opts.NetModules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: network modules: %w", k.Version, err)
	}
	diskPaths, diskBuiltin, err := ix.Resolve(opts.DiskModules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: block device modules: %w", k.Version, err)
	}
	ext4Paths, ext4Builtin, err := ix.Resolve(opts.Ext4Modules)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: ext4 modules: %w", k.Version, err)
	}
	// A dependency the base list loads already (virtio, say) is loaded
	// once, by the base list; one the disk list loads, by the disk list.
	inBase := func(p string) bool { return slices.Contains(modPaths, p) }
	netPaths = slices.DeleteFunc(netPaths, inBase)
	diskPaths = slices.DeleteFunc(diskPaths, inBase)
	ext4Paths = slices.DeleteFunc(ext4Paths, func(p string) bool { return inBase(p) || slices.Contains(diskPaths, p) })
	for _, b := range slices.Concat(netBuiltin, diskBuiltin, ext4Builtin) {
		if !slices.Contains(builtin, b) {
			builtin = append(builtin, b)
		}
	}
	m.BuiltinModules = builtin

	applets, err := busyboxApplets(opts.Busybox)
	if err != nil {
		return nil, err
	}
	agent, err := os.ReadFile(opts.Agent)
	if err != nil {
		return nil, err
	}
	bb, err := os.ReadFile(opts.Busybox)
	if err != nil {
		return nil, err
	}

	img := newImage()
	img.baseLayout()
	img.file("init", agent, 0o755)
	img.file("bin/busybox", bb, 0o755)
	img.symlink("bin/sh", "busybox")
	for _, a := range applets {
		if a != "busybox" {
			img.symlink("bin/"+a, "busybox")
		}
	}
	modRoot := "lib/modules/" + k.Version
	img.dir(modRoot, 0o755, 0, 0)
	for _, l := range []struct {
		paths []string
		list  string
		dst   *[]string
	}{{modPaths, ModuleListPath, &m.Modules}, {netPaths, NetModuleListPath, &m.NetModules}, {diskPaths, DiskModuleListPath, &m.DiskModules}, {ext4Paths, Ext4ModuleListPath, &m.Ext4Modules}} {
		var list bytes.Buffer
		for _, p := range l.paths {
			data, err := readModule(filepath.Join(k.ModulesDir, filepath.FromSlash(p)))
			if err != nil {
				return nil, err
			}
			inImage := modRoot + "/" + stripCompression(p)
			img.file(inImage, data, 0o644)
			*l.dst = append(*l.dst, "/"+inImage)
			fmt.Fprintf(&list, "/%s\n", inImage)
		}
		img.file(strings.TrimPrefix(l.list, "/"), list.Bytes(), 0o644)
	}

	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, err
	}
	cpioPath := filepath.Join(opts.Out, InitramfsFile)
	sum, size, err := img.writeAtomic(cpioPath)
	if err != nil {
		return nil, err
	}
	m.SHA256.Initramfs, m.InitramfsSize = sum, size
	if err := placeCopy(k.Vmlinux, filepath.Join(opts.Out, VmlinuxFile), m.SHA256.Vmlinux); err != nil {
		return nil, err
	}
	if err := placeCopy(k.Vmlinuz, filepath.Join(opts.Out, VmlinuzFile), m.SHA256.Vmlinuz); err != nil {
		return nil, err
	}
	for role, f := range map[string]string{stampOutInitramfs: InitramfsFile, stampOutVmlinux: VmlinuxFile, stampOutVmlinuz: VmlinuzFile} {
		st, err := stat(filepath.Join(opts.Out, f))
		if err != nil {
			return nil, err
		}
		m.Stamps[role] = st
	}
	m.Stamps[stampOutInitramfs] = withSum(m.Stamps[stampOutInitramfs], m.SHA256.Initramfs)
	m.Stamps[stampOutVmlinux] = withSum(m.Stamps[stampOutVmlinux], m.SHA256.Vmlinux)
	m.Stamps[stampOutVmlinuz] = withSum(m.Stamps[stampOutVmlinuz], m.SHA256.Vmlinuz)
	if err := writeManifest(opts.Out, m); err != nil {
		return nil, err
	}
	return m, nil
}

func withSum(st FileStamp, sum string) FileStamp { st.SHA256 = sum; return st }

func writeManifest(dir string, m *Manifest) error {
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ManifestFile), append(js, '\n'), 0o644)
}

// ReadManifest reads dir/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	m := new(Manifest)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	return m, nil
}

// upToDate reports whether out holds an image (described by old) built from
// exactly the inputs in want, with its outputs intact: a hand-edited or
// truncated output is noticed (by stamp, else by digest) and rebuilt.
// It records the outputs' stamps in want.
func upToDate(out string, old, want *Manifest) bool {
	if old == nil {
		return false
	}
	if old.Format != want.Format || old.KernelVersion != want.KernelVersion ||
		old.KernelPackageVersion != want.KernelPackageVersion ||
		old.SHA256.Vmlinux != want.SHA256.Vmlinux || old.SHA256.Vmlinuz != want.SHA256.Vmlinuz ||
		old.SHA256.Agent != want.SHA256.Agent || old.SHA256.Busybox != want.SHA256.Busybox ||
		!slices.Equal(old.RootModules, want.RootModules) ||
		!slices.Equal(old.NetRootModules, want.NetRootModules) ||
		!slices.Equal(old.DiskRootModules, want.DiskRootModules) ||
		!slices.Equal(old.Ext4RootModules, want.Ext4RootModules) {
		return false
	}
	for _, f := range []struct{ role, name, sum string }{
		{stampOutVmlinux, VmlinuxFile, old.SHA256.Vmlinux},
		{stampOutVmlinuz, VmlinuzFile, old.SHA256.Vmlinuz},
		{stampOutInitramfs, InitramfsFile, old.SHA256.Initramfs},
	} {
		if got, err := digest(want, old, f.role, filepath.Join(out, f.name)); err != nil || got != f.sum {
			return false
		}
	}
	return true
}

var errDynamic = errors.New("dynamically linked")

// checkStatic makes sure p is an ELF executable without an interpreter: the
// initramfs has no libc or dynamic loader.
func checkStatic(p, what string) error {
	f, err := elf.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s binary %s does not exist", what, p)
		}
		return fmt.Errorf("%s at %s is not an ELF executable: %w", what, p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s at %s is %w", what, p, errDynamic)
		}
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s at %s is for %v, the guest is x86_64", what, p, f.Machine)
	}
	return nil
}

// busyboxApplets runs the given busybox to learn its applets, so the symlinks
// always match the binary that goes into the image.
func busyboxApplets(bb string) ([]string, error) {
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", bb, err)
	}
	var applets []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		a := strings.TrimSpace(sc.Text())
		if a != "" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	if !slices.Contains(applets, "sh") {
		return nil, fmt.Errorf("%s has no sh applet", bb)
	}
	return applets, nil
}

// readModule returns a module as a plain ELF .ko: the agent loads modules
// with finit_module and passes no decompression flags.
func readModule(p string) ([]byte, error) {
	var tool []string
	switch {
	case strings.HasSuffix(p, ".ko"):
		return os.ReadFile(p)
	case strings.HasSuffix(p, ".ko.xz"):
		tool = []string{"xz", "-dc"}
	case strings.HasSuffix(p, ".ko.zst"):
		tool = []string{"zstd", "-dcq"}
	case strings.HasSuffix(p, ".ko.gz"):
		tool = []string{"gzip", "-dc"}
	default:
		return nil, fmt.Errorf("module %s: unknown file type", p)
	}
	if _, err := exec.LookPath(tool[0]); err != nil {
		return nil, fmt.Errorf("module %s is compressed and %s is not installed", p, tool[0])
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tool[0], append(tool[1:], p)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompressing %s: %v: %s", p, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

func stripCompression(p string) string {
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if s, ok := strings.CutSuffix(p, ".ko"+ext); ok {
			return s + ".ko"
		}
	}
	return p
}

// image collects initramfs entries by path; written sorted, so the archive
// depends only on its contents.
type image struct {
	recs map[string]cpio.Record
}

func newImage() *image { return &image{recs: map[string]cpio.Record{}} }

func (im *image) add(r cpio.Record) {
	r.Name = cpio.Normalize(r.Name)
	im.recs[r.Name] = r
	// Every parent must exist before the kernel unpacks a child into it.
	for d := path.Dir(r.Name); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := im.recs[d]; !ok {
			im.recs[d] = cpio.Directory(d, 0o755)
		}
	}
}

func (im *image) dir(name string, mode uint64, uid, gid uint64) {
	r := cpio.Directory(name, mode)
	r.UID, r.GID = uid, gid
	im.add(r)
}

func (im *image) file(name string, data []byte, mode uint64) {
	im.add(cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | mode}))
}

func (im *image) symlink(name, target string) { im.add(cpio.Symlink(name, target)) }

func (im *image) baseLayout() {
	for _, d := range []string{"dev", "proc", "sys", "run", "etc", "etc/nether", "bin", "sbin", "lib", "var"} {
		im.dir(d, 0o755, 0, 0)
	}
	im.dir("root", 0o700, 0, 0)
	im.dir("tmp", 0o1777, 0, 0)
	im.dir("var/tmp", 0o1777, 0, 0)
	im.dir("home", 0o755, 0, 0)
	im.dir("home/nether", 0o755, 1000, 1000)
	// The kernel opens /dev/console for init's stdio before init runs; with
	// an initramfs root nothing mounts devtmpfs first, so without this node
	// the agent would start with no stdin/stdout/stderr.
	im.add(cpio.CharDev("dev/console", 0o600, 5, 1))
	im.add(cpio.CharDev("dev/null", 0o666, 1, 3))
	im.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nnether:x:1000:1000:nether:/home/nether:/bin/sh\n"), 0o644)
	im.file("etc/group", []byte("root:x:0:\nnether:x:1000:\n"), 0o644)
	im.file("etc/hostname", []byte("sandbox\n"), 0o644)
	im.file("etc/hosts", []byte("127.0.0.1 localhost\n::1 localhost\n"), 0o644)
	im.file("etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644)
}

// writeAtomic writes the archive to a temp file and renames it to p.
// Records go out sorted by name (parents sort before children), with
// mtime 0 and inode numbers by position, so identical inputs give identical
// bytes. It returns the archive's sha256 and size.
func (im *image) writeAtomic(p string) (string, int64, error) {
	names := make([]string, 0, len(im.recs))
	for n := range im.recs {
		names = append(names, n)
	}
	sort.Strings(names)

	tmp, err := os.CreateTemp(filepath.Dir(p), ".initramfs-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(tmp, h), 1<<20)
	cw := &countWriter{w: bw}
	w := cpio.Newc.Writer(cw)
	for i, n := range names {
		r := im.recs[n]
		uid, gid := r.UID, r.GID
		r = cpio.MakeReproducible(r)
		r.UID, r.GID = uid, gid // keep the deliberate owners (/home/nether)
		r.Ino = uint64(i + 1)
		r.NLink = 1
		if r.Mode&cpio.S_IFMT == cpio.S_IFDIR {
			r.NLink = 2
		}
		if err := w.WriteRecord(r); err != nil {
			return "", 0, fmt.Errorf("writing %s: %w", n, err)
		}
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return "", 0, err
	}
	if err := bw.Flush(); err != nil {
		return "", 0, err
	}
	if err := tmp.Sync(); err != nil {
		return "", 0, err
	}
	if err := tmp.Close(); err != nil {
		return "", 0, err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", 0, err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// placeCopy puts src at dst unless dst already has the wanted digest. It
// hardlinks when it can (same filesystem: no 60 MB copy) and copies
// otherwise, always through a temp name so dst is never half-written.
func placeCopy(src, dst, wantSum string) error {
	if got, err := FileSHA256(dst); err == nil && got == wantSum {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		if err := copyFile(src, tmp); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func writeFileAtomic(p string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// FileSHA256 is the hex sha256 of the file at p.
func FileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
