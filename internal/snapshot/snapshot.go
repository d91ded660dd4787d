// Package snapshot is the on-disk artifact format for captured guests:
// writing one durably, committing it, opening and validating it without
// booting anything, and the one-shot claim that makes a park wake once.
//
// An artifact is a directory (0700) of 0600 files:
//
//	ram        guest RAM, flat and usually sparse (absent when RAMMode is "stream")
//	state      the engine's device-state stream (opaque here)
//	meta.json  Meta, below
//	COMMITTED  "nether-snapshot v1 meta-sha256=<hex>\n", written last
//
// It is written in a hidden sibling ".<name>.partial-<random>" and renamed
// into place only once the marker is durable, so a crash at any point
// leaves either nothing under <name> or a complete artifact. This package
// never talks to the engine: the caller writes ram and state.
package snapshot

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
	"strings"
	"sync"
	"time"
)

// FormatVersion is the artifact format this build writes and the only one
// it reads: a restore maps the files, so there is no "mostly compatible".
//
// What bumps it: a change to the files of an artifact or their meaning
// (ram, state, meta.json, COMMITTED), to the top-level fields of Meta, or
// to how files are checksummed. What does not: anything inside a section.
// Each component (the engine, the channel, and every plane to come) owns
// one versioned section of Meta.Sections; a build that adds a component
// adds a section, and older artifacts without it still restore (the
// component starts fresh). A build meets a section it does not know only
// in an artifact from a newer build, and refuses it by name: the guest in
// it depends on state this build cannot bring back.
//
// Version 1 (no sections; the channel and vmgenid were fixed fields) is
// refused: re-bake such bases.
const FormatVersion = 2

// Kind is an artifact's lifecycle contract.
type Kind string

const (
	// KindBase is durable and forks many times.
	KindBase Kind = "base"
	// KindPark is one-shot: a wake claims and consumes it.
	KindPark Kind = "park"
)

// RAMMode says where guest RAM lives.
type RAMMode string

const (
	// RAMFile: RAM is the flat "ram" file, mapped by a restore.
	RAMFile RAMMode = "file"
	// RAMStream: RAM is inside the engine's state stream; no "ram" file.
	RAMStream RAMMode = "stream"
)

// ChunkSize is the granularity of the RAM checksums: small enough that a
// corruption report points somewhere useful, large enough that the list
// stays short (4 bytes per MiB of guest RAM).
const ChunkSize = 1 << 20

// File names inside an artifact.
const (
	fileRAM = "ram"
	// FileDisk is the persistent disk's layer (engine.DiskFileName):
	// checksummed in chunks like ram, holes skipped.
	FileDisk      = "disk"
	fileState     = "state"
	fileMeta      = "meta.json"
	fileCommitted = "COMMITTED"
	fileClaimed   = "CLAIMED"
)

// markerPrefix starts the COMMITTED line; the version after it is the
// format version, so even the marker says which reader it is for.
const markerPrefix = "nether-snapshot v"

// maxMetaSize bounds how much of meta.json Open reads: a RAM chunk list
// costs ~11 bytes per MiB, so 64 MiB covers terabytes of guest RAM while
// refusing to slurp a hostile multi-gigabyte file.
const maxMetaSize = 64 << 20

// Fingerprint is everything a restore must match.
type Fingerprint struct {
	Engine        string `json:"engine"`         // "qemu"
	EngineVersion string `json:"engine_version"` // "7.2.22"
	Machine       string `json:"machine"`        // "pc-i440fx-7.2"
	Accel         string `json:"accel"`          // "tcg" | "kvm"
	KernelSHA256  string `json:"kernel_sha256"`
	ImageSHA256   string `json:"image_sha256"`
	// RootfsSHA256 is the root image's digest; absent for a guest
	// without one (rootfs = busybox), as in every artifact from before
	// root images existed.
	RootfsSHA256 string `json:"rootfs_sha256,omitempty"`
	CPUs         int    `json:"cpus"`
	RAMMB        int    `json:"ram_mb"`
	// GPU: the machine had a display (gpu = 1). Absent in artifacts of
	// machines without one, including every artifact from before
	// displays existed, which is what they were.
	GPU bool `json:"gpu,omitempty"`
	// Net: the machine had a NIC (net = 1); absent likewise.
	Net bool `json:"net,omitempty"`
}

// FileInfo records one data file's size and checksums.
type FileInfo struct {
	Size   int64    `json:"size"`
	SHA256 string   `json:"sha256,omitempty"` // state: whole-file sha256
	Chunks []uint32 `json:"chunks,omitempty"` // ram: CRC32C of each ChunkSize chunk; the last may be short
}

// Identity is who was captured.
type Identity struct {
	SandboxID  string `json:"sandbox_id"`
	ParentID   string `json:"parent_id,omitempty"`
	Generation int    `json:"generation"`
	Hostname   string `json:"hostname"`
	TrustClass string `json:"trust_class"`
}

// Section is one owner's versioned part of the metadata. Its data is
// opaque here: valid, non-empty JSON.
type Section struct {
	Version int             `json:"version"`
	Data    json.RawMessage `json:"data"`
}

// Meta is the content of meta.json.
type Meta struct {
	Format      int                 `json:"format"`
	Kind        Kind                `json:"kind"`
	Created     time.Time           `json:"created"`
	Fingerprint Fingerprint         `json:"fingerprint"`
	RAMMode     RAMMode             `json:"ram_mode"`
	Files       map[string]FileInfo `json:"files"` // filled by Commit
	Identity    Identity            `json:"identity"`
	PauseMS     int64               `json:"pause_ms"`
	// Sections holds the engine's section ("engine") and one per session
	// component, keyed by owner.
	Sections map[string]Section `json:"sections"`
}

// SectionEngine is the engine's section; every artifact has one.
const SectionEngine = "engine"

// Artifact is a committed artifact that passed Open's checks.
type Artifact struct {
	Dir  string
	Meta Meta

	// metaSum is sha256(meta.json) as the marker vouched for it; Claim and
	// Verify use it to notice the directory being swapped after Open.
	metaSum [32]byte
}

// FileStamp is what identifies a file's contents without reading them:
// its device, inode, size and times. Any change through the file system
// moves the ctime, which no unprivileged process can set back, so an
// equal stamp means the contents are the ones stamped, unless they were
// changed within the kernel's coarse clock tick of the stamp's ctime
// (whoever trusts a stamp takes it clear of that tick) or below the file
// system.
type FileStamp struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

// ClearAt is when a stamp taken of the file tells it apart from any later
// change: past the tick its ctime was taken on. A file system that keeps
// nanoseconds stamps a change with the kernel's coarse clock (a tick of
// at most 10 ms); one that keeps whole seconds (an ext4 with small
// inodes, some network file systems) rounds it to the second, and FAT
// to two. A ctime of whole seconds is taken for the latter, which at
// worst makes a caller wait or verify when it need not have.
func (s FileStamp) ClearAt() time.Time {
	last := max(s.CtimeNS, s.MtimeNS)
	if last%int64(time.Second) == 0 {
		return time.Unix(0, last).Add(2 * time.Second)
	}
	return time.Unix(0, last).Add(20 * time.Millisecond)
}

// Error classes, for errors.Is. The messages callers see are the specific
// ones built around them; these never appear in the text themselves.
var (
	ErrExists       = errors.New("snapshot already exists")
	ErrNotExist     = errors.New("no such snapshot")
	ErrNotCommitted = errors.New("snapshot not committed")
	ErrWoken        = errors.New("park already claimed or woken")
	ErrNotPark      = errors.New("snapshot is not a park")
	ErrCorrupt      = errors.New("snapshot corrupted")
	ErrIncompatible = errors.New("snapshot incompatible with this nether")
	ErrInvalid      = errors.New("invalid snapshot")
	ErrUnsupported  = errors.New("snapshots are not supported on this platform")
)

// classed is a specific message that errors.Is also matches against a
// class sentinel (and the underlying cause, if any), without repeating the
// sentinel's generic text in the message.
type classed struct {
	class error
	cause error
	msg   string
}

func (e *classed) Error() string { return e.msg }

func (e *classed) Unwrap() []error {
	if e.cause == nil {
		return []error{e.class}
	}
	return []error{e.class, e.cause}
}

// errc builds a classed error; cause (may be nil) is unwrapped but only
// appears in the text if format mentions it.
func errc(class, cause error, format string, args ...any) error {
	return &classed{class: class, cause: cause, msg: fmt.Sprintf(format, args...)}
}

// pathErr prefixes an artifact path, the context every Open/Verify message
// carries.
func pathErr(path string, err error) error {
	return fmt.Errorf("snapshot %s: %w", path, err)
}

// crc32c is the Castagnoli table: hardware-accelerated on amd64 and arm64,
// which is what makes checking a multi-GiB RAM file cheap.
var crc32c = crc32.MakeTable(crc32.Castagnoli)

// zeroChunkCRC is computed once: every hole chunk of every RAM file has it.
var zeroChunkCRC = sync.OnceValue(func() uint32 {
	return crc32.Checksum(make([]byte, ChunkSize), crc32c)
})

// ZeroChunkCRC is the CRC32C of ChunkSize zero bytes: the checksum of any
// RAM chunk that lies entirely in a hole.
func ZeroChunkCRC() uint32 { return zeroChunkCRC() }

// chunkCount is how many ChunkSize chunks cover size bytes.
func chunkCount(size int64) int64 { return (size + ChunkSize - 1) / ChunkSize }

// validName refuses anything that is not a single plain path component:
// the artifact is created relative to a directory fd the caller resolved
// safely, and a '/' or dot-name would step outside that.
func validName(name string) error {
	switch {
	case name == "":
		return errc(ErrInvalid, nil, "snapshot name is empty")
	case name == "." || name == "..":
		return errc(ErrInvalid, nil, "snapshot name %q is not a usable name", name)
	case strings.ContainsRune(name, '/'):
		return errc(ErrInvalid, nil, "snapshot name %q contains '/' (give a single path component)", name)
	case strings.ContainsRune(name, 0):
		return errc(ErrInvalid, nil, "snapshot name %q contains a NUL byte", name)
	}
	return nil
}

func isHexSHA256(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// validateHeader checks the fields a caller supplies to Commit; Files is
// checked by validateFiles once it is known.
func validateHeader(m *Meta) error {
	if m.Format != FormatVersion {
		return formatErr(m.Format)
	}
	if m.Kind != KindBase && m.Kind != KindPark {
		return errc(ErrInvalid, nil, "unknown kind %q", m.Kind)
	}
	if m.RAMMode != RAMFile && m.RAMMode != RAMStream {
		return errc(ErrInvalid, nil, "unknown ram_mode %q", m.RAMMode)
	}
	if m.Created.IsZero() {
		return errc(ErrInvalid, nil, "created time is missing")
	}
	if m.Fingerprint.Engine == "" {
		return errc(ErrInvalid, nil, "fingerprint has no engine")
	}
	if m.Fingerprint.CPUs <= 0 || m.Fingerprint.RAMMB <= 0 {
		return errc(ErrInvalid, nil, "fingerprint has cpus=%d ram_mb=%d (both must be positive)",
			m.Fingerprint.CPUs, m.Fingerprint.RAMMB)
	}
	if _, ok := m.Sections[SectionEngine]; !ok {
		// Without the engine's part nothing can restore the machine: that
		// artifact is useless, so it is never written.
		return errc(ErrInvalid, nil, "no engine section")
	}
	for _, name := range sortedKeys(m.Sections) {
		sec := m.Sections[name]
		if !validSectionName(name) {
			return errc(ErrInvalid, nil, "section name %q is not [a-z0-9_]{1,32}", name)
		}
		if sec.Version < 1 {
			return errc(ErrInvalid, nil, "section %q has version %d (versions start at 1)", name, sec.Version)
		}
		d := bytes.TrimSpace(sec.Data)
		if len(d) == 0 || bytes.Equal(d, []byte("null")) {
			return errc(ErrInvalid, nil, "section %q is empty", name)
		}
		if !json.Valid(d) {
			return errc(ErrInvalid, nil, "section %q is not valid JSON", name)
		}
	}
	return nil
}

// formatErr refuses an artifact of another format version, saying what to
// do about it.
func formatErr(v int) error {
	hint := ""
	switch {
	case v < FormatVersion:
		hint = " (it was written by an older nether: capture it again)"
	case v > FormatVersion:
		hint = " (it was written by a newer nether)"
	}
	return errc(ErrIncompatible, nil, "format version %d, this nether reads %d%s", v, FormatVersion, hint)
}

func validSectionName(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// validateFiles checks the Files map against RAMMode and the checksum
// shapes: ram present iff RAMMode is file, state always, chunk count
// consistent with the size.
func validateFiles(m *Meta) error {
	for _, name := range sortedKeys(m.Files) {
		if !dataFileName(name) {
			return errc(ErrInvalid, nil, "metadata lists unknown file %q", name)
		}
	}
	st, ok := m.Files[fileState]
	if !ok {
		return errc(ErrInvalid, nil, "metadata lists no state file")
	}
	if st.Size < 0 || !isHexSHA256(st.SHA256) || len(st.Chunks) != 0 {
		return errc(ErrInvalid, nil, "metadata for state is malformed (size %d, sha256 %q)", st.Size, st.SHA256)
	}
	if disk, ok := m.Files[FileDisk]; ok {
		if disk.Size <= 0 || disk.SHA256 != "" || int64(len(disk.Chunks)) != chunkCount(disk.Size) {
			return errc(ErrInvalid, nil, "metadata for disk is malformed (size %d, %d chunk checksums)", disk.Size, len(disk.Chunks))
		}
	}
	ram, hasRAM := m.Files[fileRAM]
	switch {
	case m.RAMMode == RAMFile && !hasRAM:
		return errc(ErrInvalid, nil, "ram_mode is file but metadata lists no ram file")
	case m.RAMMode == RAMStream && hasRAM:
		return errc(ErrInvalid, nil, "ram_mode is stream but metadata lists a ram file")
	}
	if hasRAM {
		if ram.Size <= 0 || ram.SHA256 != "" {
			return errc(ErrInvalid, nil, "metadata for ram is malformed (size %d)", ram.Size)
		}
		if want := chunkCount(ram.Size); int64(len(ram.Chunks)) != want {
			return errc(ErrInvalid, nil, "metadata has %d ram chunk checksums for %d bytes, want %d",
				len(ram.Chunks), ram.Size, want)
		}
	}
	return nil
}

// dataFileName reports whether name is a data file an artifact may hold.
func dataFileName(name string) bool {
	return name == fileRAM || name == fileState || name == FileDisk
}

// chunked reports whether a data file is checksummed in chunks (large,
// sparse files) rather than with one sha256.
func chunked(name string) bool { return name == fileRAM || name == FileDisk }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Match compares fp with the fingerprint the artifact was taken with and
// names the first difference.
func (a *Artifact) Match(fp Fingerprint) error {
	have := a.Meta.Fingerprint
	fields := []struct {
		name       string
		snap, this string
	}{
		{"engine", have.Engine, fp.Engine},
		{"engine_version", have.EngineVersion, fp.EngineVersion},
		{"machine", have.Machine, fp.Machine},
		{"accel", have.Accel, fp.Accel},
		// Before the kernel: gpu = 1 boots another kernel image, and
		// the setting is what the user has to change.
		{"gpu", zeroOne(have.GPU), zeroOne(fp.GPU)},
		{"net", zeroOne(have.Net), zeroOne(fp.Net)},
		{"kernel_sha256", have.KernelSHA256, fp.KernelSHA256},
		{"image_sha256", have.ImageSHA256, fp.ImageSHA256},
		{"rootfs_sha256", orNone(have.RootfsSHA256), orNone(fp.RootfsSHA256)},
		{"cpus", fmt.Sprint(have.CPUs), fmt.Sprint(fp.CPUs)},
		{"ram_mb", fmt.Sprint(have.RAMMB), fmt.Sprint(fp.RAMMB)},
	}
	for _, f := range fields {
		if f.snap != f.this {
			return errc(ErrIncompatible, nil, "snapshot %s was taken with %s=%s; this nether has %s=%s",
				a.Dir, f.name, f.snap, f.name, f.this)
		}
	}
	return nil
}

// orNone shows an absent digest in a message.
func orNone(s string) string {
	if s == "" {
		return "none (rootfs = busybox)"
	}
	return s
}

func zeroOne(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Summary is the one line validate_snapshot prints on success.
func (a *Artifact) Summary() string {
	m := &a.Meta
	kind := string(m.Kind)
	if m.Kind == KindPark {
		kind += " (one-shot)"
	}
	fp := m.Fingerprint
	return fmt.Sprintf("snapshot %s: ok kind=%s format=%d engine=%s %s machine=%s accel=%s cpus=%d ram_mb=%d gpu=%s net=%s ram=%s generation=%d created=%s",
		a.Dir, kind, m.Format, fp.Engine, fp.EngineVersion, fp.Machine, fp.Accel, fp.CPUs, fp.RAMMB, zeroOne(fp.GPU), zeroOne(fp.Net),
		m.RAMMode, m.Identity.Generation, m.Created.UTC().Format(time.RFC3339))
}
