package guestimage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// DefaultModules are the root modules loaded into every guest. Their
// dependencies come from the kernel's modules.dep, never from this list.
//
// On Debian's generic 6.1 kernel all of these are modules (CONFIG_VIRTIO=m),
// none is built in. virtio-serial on pc/q35 needs virtio_pci (transport, it
// pulls virtio_pci_modern_dev/virtio_pci_legacy_dev, virtio, virtio_ring) and
// virtio_console (the serial ports); nothing else: the PCI(e) host bridge and
// port drivers are built in.
//
// Every module costs boot time under TCG (loading, then probing through
// ACPI), so the list holds only what a device of ours needs. virtio_rng
// feeds host entropy to the guest CRNG through a device the kernel reads at
// boot, so the first getrandom() never waits on CPU jitter, whatever the CPU
// model (RDRAND alone is not on every model).
var DefaultModules = []string{"virtio_pci", "virtio_console", "virtio_rng"}

// DefaultNetModules are the root modules a guest with a network (net = 1)
// loads on top of DefaultModules: virtio_net, which needs net_failover and
// failover (both modules on Debian's 6.1 kernels, found through
// modules.dep). They have a list of their own so a guest without a
// network does not pay for loading them.
var DefaultNetModules = []string{"virtio_net"}

// DefaultDiskModules are the root modules a guest with block devices
// loads: virtio_blk for the devices, erofs for a read-only root image,
// overlay for the writable layer over it. A busybox-only guest without a
// disk loads none of them. crc32c_generic comes first: libcrc32c
// (erofs's) and ext4 ask the crypto API for "crc32c" when they load or
// mount, a soft dependency that modules.dep does not list, and without it
// erofs fails to load with ENOENT.
var DefaultDiskModules = []string{"crc32c_generic", "virtio_blk", "erofs", "overlay"}

// DefaultExt4Modules are loaded, after the disk modules, only by a guest
// that mounts ext4: a /data disk, or an ext4 root image. ext4 with jbd2,
// mbcache and crc16 took 0.58 s of a TCG boot, more than the rest of the
// disk modules together, so an erofs root without a disk skips them.
var DefaultExt4Modules = []string{"ext4"}

// ModuleIndex is what the kernel's depmod metadata says about its modules.
type ModuleIndex struct {
	path    map[string]string   // module name -> path relative to the modules dir
	deps    map[string][]string // module name -> names listed in modules.dep
	builtin map[string]bool     // names of built-in "modules"
}

// ModuleName normalises a module name or path the way the kernel does:
// directory and .ko[.xz|.zst|.gz] stripped, '-' turned into '_'.
func ModuleName(s string) string {
	s = path.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// LoadModuleIndex reads modules.dep and modules.builtin from a
// lib/modules/<version> directory.
func LoadModuleIndex(dir string) (*ModuleIndex, error) {
	dep, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules index: %w (was depmod run on %s?)", err, dir)
	}
	defer dep.Close()
	var builtin io.Reader = strings.NewReader("")
	if b, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		defer b.Close()
		builtin = b
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return ParseModuleIndex(dep, builtin)
}

// ParseModuleIndex parses modules.dep ("path: dep-path dep-path ...") and
// modules.builtin (one path per line) content.
func ParseModuleIndex(dep, builtin io.Reader) (*ModuleIndex, error) {
	ix := &ModuleIndex{path: map[string]string{}, deps: map[string][]string{}, builtin: map[string]bool{}}
	sc := bufio.NewScanner(dep)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no ':' in %q", n, line)
		}
		name := ModuleName(p)
		ix.path[name] = strings.TrimPrefix(p, "/")
		var deps []string
		for _, d := range strings.Fields(rest) {
			deps = append(deps, ModuleName(d))
		}
		ix.deps[name] = deps
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	sc = bufio.NewScanner(builtin)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			ix.builtin[ModuleName(line)] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.builtin: %w", err)
	}
	return ix, nil
}

// Builtin reports whether the kernel has the named module built in.
func (ix *ModuleIndex) Builtin(name string) bool { return ix.builtin[ModuleName(name)] }

// Resolve returns the paths (relative to the modules dir, as modules.dep
// spells them) of roots and everything they depend on, dependencies before
// dependents, each once. Roots that are built in are returned in builtin and
// need no loading. A name that the kernel knows neither as a module nor as
// built in is an error, so a typo can't silently produce a guest without
// its driver.
func (ix *ModuleIndex) Resolve(roots []string) (paths, builtin []string, err error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			// depmod refuses cycles; a hand-edited file might not.
			return fmt.Errorf("module dependency cycle through %s", name)
		}
		p, ok := ix.path[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) is not in modules.dep", name, from)
			}
			return fmt.Errorf("module %s is neither in modules.dep nor in modules.builtin", name)
		}
		state[name] = visiting
		// modules.dep already lists the transitive closure, but its order is
		// only a convention of depmod; visiting each dependency's own line
		// makes the load order right whatever order the list has.
		for _, d := range ix.deps[name] {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = done
		paths = append(paths, p)
		return nil
	}
	seenBuiltin := map[string]bool{}
	for _, r := range roots {
		name := ModuleName(r)
		if ix.builtin[name] {
			if !seenBuiltin[name] {
				seenBuiltin[name] = true
				builtin = append(builtin, name)
			}
			continue
		}
		if err := visit(name, ""); err != nil {
			return nil, nil, err
		}
	}
	return paths, builtin, nil
}

// Names returns the names of all modules in the index, sorted (for tests and
// diagnostics).
func (ix *ModuleIndex) Names() []string {
	names := make([]string, 0, len(ix.path))
	for n := range ix.path {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
