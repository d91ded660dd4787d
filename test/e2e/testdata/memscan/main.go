// Command memscan counts the copies of byte strings in a Linux guest's
// physical memory, read through /proc/kcore (or /dev/mem when kcore is
// not there). The e2e tests copy it into a sandbox and run it as root.
//
// Each argument is a needle XORed with 0x5a, in hex: the scanner must
// never hold a whole needle in its own memory, or it would find itself.
// It keeps the first four bytes plain (a prefix is no copy) and checks
// the rest a byte at a time through the mask.
//
// With -pid PID first it scans that process's mappings instead
// (/proc/PID/maps and /proc/PID/mem): where in the guest a copy lives.
//
// Output: one line per needle, "N count [phys ...]" (at most 8
// addresses), then "scanned BYTES from SOURCE".
package main

import (
	"bytes"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

const mask = 0x5a

type needle struct {
	prefix []byte // plain
	rest   []byte // masked
	hits   []uint64
}

func (n *needle) len() int { return len(n.prefix) + len(n.rest) }

// scan counts n's matches in b, which starts at physical address base;
// a match must start before limit (the chunk's overlap is the next
// chunk's).
func (n *needle) scan(b []byte, base uint64, limit int) {
	for off := 0; off < limit; {
		i := bytes.Index(b[off:], n.prefix)
		if i < 0 || off+i >= limit {
			return
		}
		at := off + i
		if at+n.len() <= len(b) && n.matchRest(b[at+len(n.prefix):]) {
			n.hits = append(n.hits, base+uint64(at))
		}
		off = at + 1
	}
}

func (n *needle) matchRest(b []byte) bool {
	for k, m := range n.rest {
		if b[k]^mask != m {
			return false
		}
	}
	return true
}

// region is a run of physical memory and where it is in the source.
type region struct {
	phys, off, size uint64
}

// kcoreRegions are /proc/kcore's direct-map segments: the PT_LOADs of
// physical RAM (p_paddr set), below the kernel text mapping (a second
// view of RAM already in the direct map).
func kcoreRegions(f *os.File) ([]region, error) {
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, err
	}
	var out []region
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Paddr == ^uint64(0) || p.Vaddr >= 0xffffffff80000000 {
			continue
		}
		out = append(out, region{phys: p.Paddr, off: p.Off, size: p.Filesz})
	}
	return out, nil
}

// pidRegions are a process's readable mappings, by virtual address.
func pidRegions(pid string) ([]region, error) {
	b, err := os.ReadFile("/proc/" + pid + "/maps")
	if err != nil {
		return nil, err
	}
	var out []region
	for _, l := range strings.Split(string(b), "\n") {
		var lo, hi uint64
		var perm string
		if _, err := fmt.Sscanf(l, "%x-%x %s", &lo, &hi, &perm); err != nil || perm[0] != 'r' || strings.HasSuffix(l, "[vvar]") {
			continue
		}
		out = append(out, region{phys: lo, off: lo, size: hi - lo})
	}
	return out, nil
}

func main() {
	var needles []*needle
	args := os.Args[1:]
	pid := ""
	if len(args) > 1 && args[0] == "-pid" {
		pid, args = args[1], args[2:]
	}
	for _, a := range args {
		m, err := hex.DecodeString(a)
		if err != nil || len(m) < 8 {
			fmt.Fprintf(os.Stderr, "memscan: %q is not a masked needle of 8 bytes or more in hex\n", a)
			os.Exit(2)
		}
		p := make([]byte, 4)
		for i := range p {
			p[i] = m[i] ^ mask
		}
		needles = append(needles, &needle{prefix: p, rest: m[4:]})
	}
	src := "/proc/kcore"
	var f *os.File
	var err error
	var regions []region
	if pid != "" {
		src = "/proc/" + pid + "/mem"
		if regions, err = pidRegions(pid); err == nil {
			f, err = os.Open(src)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "memscan: %v\n", err)
			os.Exit(1)
		}
	} else if f, err = os.Open(src); err == nil {
		regions, err = kcoreRegions(f)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		src = "/dev/mem"
		if f, err = os.Open(src); err != nil {
			fmt.Fprintf(os.Stderr, "memscan: neither /proc/kcore nor /dev/mem: %v\n", err)
			os.Exit(1)
		}
		regions = []region{{size: 1 << 40}} // read until it ends
	}
	const chunk = 4 << 20
	overlap := 0
	for _, n := range needles {
		overlap = max(overlap, n.len()-1)
	}
	buf := make([]byte, chunk+overlap)
	var scanned uint64
	for _, r := range regions {
		for pos := uint64(0); pos < r.size; pos += chunk {
			want := min(uint64(len(buf)), r.size-pos)
			got, err := f.ReadAt(buf[:want], int64(r.off+pos))
			if got > 0 {
				limit := min(got, chunk)
				for _, n := range needles {
					n.scan(buf[:got], r.phys+pos, limit)
				}
				scanned += uint64(limit)
			}
			if err != nil && err != io.EOF {
				break // a hole the source cannot read
			}
			if got < int(want) {
				break
			}
		}
	}
	clear(buf)
	for i, n := range needles {
		fmt.Printf("%d %d", i, len(n.hits))
		for _, h := range n.hits[:min(len(n.hits), 8)] {
			fmt.Printf(" %#x", h)
		}
		fmt.Println()
	}
	fmt.Printf("scanned %d from %s\n", scanned, src)
}
