package qemu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// QEMU's migration stream, as far as nether reads it. A live capture
// (capture_linux.go) runs QEMU's migration into nether, which copies the
// stream into the artifact's "state" file except the pages of the blocks
// it keeps elsewhere: guest RAM goes into the "ram" file at its offsets,
// the channel's lane is written whole at the end, when nothing can change
// it any more. The stream is QEMU's own format (migration/savevm.c and
// migration/ram.c): nether understands the framing and the RAM sections,
// copies every device section byte for byte, and refuses anything else by
// name, so a QEMU that writes something new fails the capture instead of
// producing an artifact that cannot load.
const (
	streamMagic   = 0x5145564d // "QEVM"
	streamVersion = 3

	secStart   = 0x01
	secPart    = 0x02
	secEnd     = 0x03
	secFull    = 0x04
	secSub     = 0x05
	secConfig  = 0x07
	secCommand = 0x08
	secFooter  = 0x7e
	secEOF     = 0x1f

	ramZero     = 0x02
	ramMemSize  = 0x04
	ramPage     = 0x08
	ramEOS      = 0x10
	ramContinue = 0x20

	// streamPage is the target's page size (x86): the unit of the RAM
	// sections and the low bits of a record's header that hold its flags.
	streamPage = 4096
)

// ramFlagNames names the RAM record flags nether does not read, for the
// error that refuses them.
var ramFlagNames = map[uint64]string{
	0x01: "full", 0x40: "xbzrle", 0x80: "hook (RDMA)", 0x100: "compressed pages", 0x200: "multifd flush",
}

// errStreamFormat is wrapped by every refusal of a stream nether cannot
// read.
var errStreamFormat = errors.New("QEMU's migration stream is not in the form nether reads")

// pageFunc receives one page of a block taken out of the stream: its
// offset in the block and its bytes, nil for a zero page. The slice is
// only valid during the call.
type pageFunc func(off int64, page []byte) error

// streamFilter copies a migration stream from in to out, taking out the
// pages of the blocks named in take.
type streamFilter struct {
	in  *bufio.Reader
	out *bufio.Writer
	// addrs: the stream's block list carries each block's guest address
	// (QEMU writes it when x-ignore-shared is on).
	addrs bool
	// take receives the pages of the blocks it names (by their exact
	// RAM block name) instead of the stream; a nil function drops them.
	take map[string]pageFunc
	// choose, when set, sees each block of the list as it is read and
	// may add it to take (or set atEnd).
	choose func(block string, size int64) error
	// beforeEnd, when set, runs when the last RAM section begins: every
	// page of the passes before it has been handed on.
	beforeEnd func() error
	// atEnd runs once, at the end of the last RAM section (QEMU writes
	// it with the vCPUs stopped): the pages it puts join the stream.
	atEnd func(put func(block string, off int64, page []byte) error) error

	blocks  map[string]int64 // RAM block lengths, from the block list
	ramID   uint32           // the RAM section's id
	haveRAM bool
	ramDone bool   // the RAM section's end was read
	cur     string // the block of the last page record read
	buf     [streamPage]byte
}

// run copies the whole stream. It returns once QEMU's end-of-file marker
// and everything after it (QEMU's device description) are copied.
func (f *streamFilter) run() error {
	magic, err := f.u32()
	if err != nil {
		return err
	}
	version, err := f.u32()
	if err != nil {
		return err
	}
	if magic != streamMagic || version != streamVersion {
		return fmt.Errorf("%w: header %#x version %d", errStreamFormat, magic, version)
	}
	f.blocks = map[string]int64{}
	for {
		t, err := f.byte()
		if err != nil {
			return err
		}
		f.out.WriteByte(t)
		switch t {
		case secConfig:
			if err := f.config(); err != nil {
				return err
			}
		case secStart, secFull:
			id, err := f.u32()
			if err != nil {
				return err
			}
			name, err := f.str()
			if err != nil {
				return err
			}
			if _, err := f.copyN(8); err != nil { // instance and version ids
				return err
			}
			if name != "ram" {
				// Device sections have no length: their bytes are only
				// readable by the device. QEMU writes them after the end
				// of RAM, so the rest of the stream is copied as it is.
				if !f.ramDone {
					return fmt.Errorf("%w: section %q before the end of guest memory", errStreamFormat, name)
				}
				return f.rest()
			}
			if t == secFull || f.haveRAM {
				return fmt.Errorf("%w: a second start of guest memory", errStreamFormat)
			}
			f.ramID, f.haveRAM = id, true
			if err := f.ram(secStart); err != nil {
				return err
			}
			if err := f.footer(id); err != nil {
				return err
			}
		case secPart, secEnd:
			id, err := f.u32()
			if err != nil {
				return err
			}
			if !f.haveRAM || id != f.ramID || f.ramDone {
				return fmt.Errorf("%w: section %d continues no open section nether knows", errStreamFormat, id)
			}
			if t == secEnd && f.beforeEnd != nil {
				if err := f.beforeEnd(); err != nil {
					return err
				}
			}
			if err := f.ram(t); err != nil {
				return err
			}
			if err := f.footer(id); err != nil {
				return err
			}
		case secCommand:
			if _, err := f.copyN(2); err != nil {
				return err
			}
			n, err := f.u16()
			if err != nil {
				return err
			}
			if _, err := f.copyN(int(n)); err != nil {
				return err
			}
		case secEOF:
			return f.rest()
		default:
			return fmt.Errorf("%w: section type %#x", errStreamFormat, t)
		}
	}
}

// config copies the configuration section: the machine type and the
// subsections QEMU 7.2 to 10 write there.
func (f *streamFilter) config() error {
	n, err := f.u32()
	if err != nil {
		return err
	}
	if n > 256 {
		return fmt.Errorf("%w: a machine name of %d bytes", errStreamFormat, n)
	}
	if _, err := f.copyN(int(n)); err != nil {
		return err
	}
	for {
		b, err := f.in.Peek(1)
		if err != nil {
			return fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
		}
		if b[0] != secSub {
			return nil
		}
		f.byte()
		f.out.WriteByte(secSub)
		name, err := f.str()
		if err != nil {
			return err
		}
		if _, err := f.copyN(4); err != nil { // its version
			return err
		}
		switch name {
		case "configuration/capabilities":
			count, err := f.u32()
			if err != nil {
				return err
			}
			if count > 64 {
				return fmt.Errorf("%w: %d capabilities", errStreamFormat, count)
			}
			for i := uint32(0); i < count; i++ {
				if _, err := f.str(); err != nil {
					return err
				}
			}
		case "configuration/target-page-bits":
			if _, err := f.copyN(4); err != nil {
				return err
			}
		case "configuration/uuid":
			if _, err := f.copyN(16); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: configuration subsection %q", errStreamFormat, name)
		}
	}
}

// ram copies one RAM section's data (typ is its section type), up to
// and including its end-of-section record, taking out the pages of the
// blocks in take. QEMU's START holds the block list and nothing else,
// and page records come only in PART and END sections: anything else is
// refused, so the pages nether takes always belong to the one list it
// read.
func (f *streamFilter) ram(typ byte) error {
	last := typ == secEnd
	listed := false
	for {
		h, err := f.in.Peek(8)
		if err != nil {
			return fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
		}
		header := binary.BigEndian.Uint64(h)
		flags, addr := header&(streamPage-1), int64(header&^(streamPage-1))
		f.in.Discard(8)
		switch {
		case flags == ramMemSize:
			if typ != secStart || listed {
				return fmt.Errorf("%w: a block list after the start of guest memory", errStreamFormat)
			}
			listed = true
			f.writeU64(header)
			if err := f.blockList(addr); err != nil {
				return err
			}
		case flags == ramEOS:
			if typ == secStart && !listed {
				return fmt.Errorf("%w: guest memory began without its block list", errStreamFormat)
			}
			if last {
				f.ramDone = true
				if f.atEnd != nil {
					if err := f.atEnd(f.put); err != nil {
						return err
					}
				}
			}
			f.writeU64(header)
			return nil
		case flags&^ramContinue == ramZero || flags&^ramContinue == ramPage:
			if typ == secStart {
				return fmt.Errorf("%w: a page record before the end of the block list's section", errStreamFormat)
			}
			if err := f.record(header, flags, addr); err != nil {
				return err
			}
		default:
			for bit, name := range ramFlagNames {
				if flags&bit != 0 {
					return fmt.Errorf("%w: guest memory sent as %s", errStreamFormat, name)
				}
			}
			return fmt.Errorf("%w: guest memory record flags %#x", errStreamFormat, flags)
		}
	}
}

// blockList copies the list of RAM blocks, total bytes long.
func (f *streamFilter) blockList(total int64) error {
	var sum int64
	for sum < total {
		name, err := f.str()
		if err != nil {
			return err
		}
		u, err := f.u64()
		if err != nil {
			return err
		}
		n := int64(u)
		if f.addrs {
			if _, err := f.copyN(8); err != nil {
				return err
			}
		}
		if n <= 0 || n%streamPage != 0 || n > total-sum {
			return fmt.Errorf("%w: block %q of %d bytes in a list of %d", errStreamFormat, name, n, total)
		}
		f.blocks[name] = n
		sum += n
		if f.choose != nil {
			if err := f.choose(name, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// record handles one page record whose header was read.
func (f *streamFilter) record(header, flags uint64, off int64) error {
	var raw []byte // the block name as it stands in the stream
	if flags&ramContinue == 0 {
		n, err := f.byte()
		if err != nil {
			return err
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(f.in, name); err != nil {
			return fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
		}
		f.cur = string(name)
		raw = append([]byte{n}, name...)
	} else if f.cur == "" {
		return fmt.Errorf("%w: a page record continues no block", errStreamFormat)
	}
	size, ok := f.blocks[f.cur]
	if !ok {
		return fmt.Errorf("%w: a page of block %q, which the block list does not name", errStreamFormat, f.cur)
	}
	if off < 0 || off >= size {
		return fmt.Errorf("%w: a page at %#x of block %q, %d bytes long", errStreamFormat, uint64(off), f.cur, size)
	}
	var page []byte
	if flags&ramPage != 0 {
		if _, err := io.ReadFull(f.in, f.buf[:]); err != nil {
			return fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
		}
		page = f.buf[:]
	} else {
		fill, err := f.byte()
		if err != nil {
			return err
		}
		if fill != 0 {
			return fmt.Errorf("%w: a page filled with %#x", errStreamFormat, fill)
		}
	}
	if take, ok := f.take[f.cur]; ok {
		if take == nil {
			return nil
		}
		return take(off, page)
	}
	f.writeU64(header)
	f.out.Write(raw)
	if page != nil {
		f.out.Write(page)
	} else {
		f.out.WriteByte(0)
	}
	return nil
}

// put writes one page of block into the stream, a zero page when page
// is all zeroes (or nil). Each record names its block: the stream's
// previous record may be of another.
func (f *streamFilter) put(block string, off int64, page []byte) error {
	size, ok := f.blocks[block]
	if !ok || off < 0 || off%streamPage != 0 || off >= size {
		return fmt.Errorf("writing page %#x of block %q, which the stream's block list does not have", off, block)
	}
	if page != nil && len(page) != streamPage {
		return fmt.Errorf("writing a page of %d bytes", len(page))
	}
	if page != nil && isZero(page) {
		page = nil
	}
	flags := uint64(ramZero)
	if page != nil {
		flags = ramPage
	}
	f.writeU64(uint64(off) | flags)
	f.out.WriteByte(byte(len(block)))
	f.out.WriteString(block)
	if page != nil {
		f.out.Write(page)
	} else {
		f.out.WriteByte(0)
	}
	f.cur = block
	return nil
}

// footer copies a section footer (machine types since QEMU 2.x write
// one) and checks it closes section id.
func (f *streamFilter) footer(id uint32) error {
	b, err := f.in.Peek(1)
	if err != nil {
		return fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
	}
	if b[0] != secFooter {
		return nil
	}
	f.byte()
	f.out.WriteByte(secFooter)
	got, err := f.u32()
	if err != nil {
		return err
	}
	if got != id {
		return fmt.Errorf("%w: section %d closed by the footer of %d", errStreamFormat, id, got)
	}
	return nil
}

// rest copies everything up to QEMU's end of the stream.
func (f *streamFilter) rest() error {
	if _, err := f.in.WriteTo(f.out); err != nil {
		return fmt.Errorf("copying QEMU's device state: %w", err)
	}
	return nil
}

// The readers below copy what they read to out, except byte: its callers
// decide.

func (f *streamFilter) byte() (byte, error) {
	b, err := f.in.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
	}
	return b, nil
}

func (f *streamFilter) copyN(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(f.in, b); err != nil {
		return nil, fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
	}
	f.out.Write(b)
	return b, nil
}

func (f *streamFilter) u16() (uint16, error) {
	b, err := f.copyN(2)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint16(b), nil
}

func (f *streamFilter) u32() (uint32, error) {
	b, err := f.copyN(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (f *streamFilter) u64() (uint64, error) {
	b, err := f.copyN(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// str copies a string with a one-byte length.
func (f *streamFilter) str() (string, error) {
	n, err := f.in.ReadByte()
	if err != nil {
		return "", fmt.Errorf("reading QEMU's migration stream: %w", unexpected(err))
	}
	f.out.WriteByte(n)
	b, err := f.copyN(int(n))
	return string(b), err
}

func (f *streamFilter) writeU64(v uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	f.out.Write(b[:])
}

// unexpected turns a clean end of file inside the stream into what it
// is: a stream cut short.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
