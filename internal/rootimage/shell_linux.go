package rootimage

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// openInRoot opens rel inside tree as the guest would see it: symlinks,
// absolute ones included, are resolved with tree as the root
// (RESOLVE_IN_ROOT), so nothing outside the tree is ever opened.
func openInRoot(tree, rel string, flags int) (*os.File, error) {
	root, err := unix.Open(tree, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/" + rel, Err: err}
	}
	return os.NewFile(uintptr(fd), "/"+rel), nil
}

// checkShell fails unless tree has a /bin/sh the guest's x86-64 kernel
// can run: the agent runs every command as /bin/sh -c. It resolves the
// symlinks of /bin/sh (busybox's sh -> busybox, Debian's sh -> dash)
// inside the tree, and of the program interpreter an ELF names.
func checkShell(tree string) error {
	f, err := openInRoot(tree, "bin/sh", unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			if l, lerr := openInRoot(tree, "bin/sh", unix.O_PATH|unix.O_NOFOLLOW); lerr == nil {
				target := readlinkAt(int(l.Fd()), "")
				l.Close()
				return fmt.Errorf("the image's /bin/sh is a symlink to %q, which is not in the image: %w", target, errNoShell)
			}
			return fmt.Errorf("the image has no /bin/sh: %w (an image without a shell, like a distroless one, cannot run them)", errNoShell)
		}
		return fmt.Errorf("opening the image's /bin/sh: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("the image's /bin/sh is a %s, not a program: %w", fileKind(fi.Mode()), errNoShell)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("the image's /bin/sh (mode %v) is not executable: %w", fi.Mode().Perm(), errNoShell)
	}
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return fmt.Errorf("the image's /bin/sh is empty or unreadable (%v): %w", err, errNoShell)
	}
	if string(magic[:2]) == "#!" {
		return nil // a script; its interpreter is the guest's to find
	}
	if !bytes.Equal(magic[:], []byte(elf.ELFMAG)) {
		return fmt.Errorf("the image's /bin/sh is neither an ELF program nor a script: %w", errNoShell)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return fmt.Errorf("the image's /bin/sh is not a readable ELF program (%v): %w", err, errNoShell)
	}
	defer ef.Close()
	if ef.Machine != elf.EM_X86_64 || ef.Class != elf.ELFCLASS64 {
		return fmt.Errorf("the image is for %s (its /bin/sh is a %s %s program): %w", elfArch(ef), ef.Class, ef.Machine, errWrongArch)
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
		if err != nil {
			return fmt.Errorf("reading /bin/sh's program interpreter: %w", err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		rel := strings.TrimLeft(interp, "/")
		if rel == "" {
			return fmt.Errorf("/bin/sh names an empty program interpreter: %w", errNoShell)
		}
		in, err := openInRoot(tree, rel, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("the image's /bin/sh needs its program interpreter %s, which is not in the image: %w", interp, errNoShell)
		}
		in.Close()
	}
	return nil
}

// elfArch names an ELF file's machine as Go and OCI name architectures.
func elfArch(f *elf.File) string {
	switch f.Machine {
	case elf.EM_X86_64:
		if f.Class == elf.ELFCLASS32 {
			return "x32"
		}
		return "amd64"
	case elf.EM_AARCH64:
		return "arm64"
	case elf.EM_ARM:
		return "arm"
	case elf.EM_386:
		return "386"
	case elf.EM_RISCV:
		return "riscv64"
	case elf.EM_PPC64:
		if f.ByteOrder.String() == "LittleEndian" {
			return "ppc64le"
		}
		return "ppc64"
	case elf.EM_S390:
		return "s390x"
	case elf.EM_MIPS:
		return "mips"
	case elf.EM_LOONGARCH:
		return "loong64"
	}
	return f.Machine.String()
}
