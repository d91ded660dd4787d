// Package conf parses, validates, defaults and reports nether.conf, the
// per-sandbox settings file that nether reads from its launch directory.
//
// The format is deliberately small: one "key = value" per line, "#"
// comments, single-token values. The parser is strict on purpose: the file
// is written by a platform (or a person) to configure an isolation
// boundary, so a typo or an unimplemented knob must stop the sandbox from
// starting instead of silently running it with weaker settings than asked.
package conf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/firewall"
)

// FileName is the name of the settings file inside the launch directory.
const FileName = "nether.conf"

// Limits on the input. The file is tiny in practice; the caps keep a
// corrupt or hostile file from costing memory and keep error output sane.
const (
	MaxFileBytes = 64 << 10 // whole file
	MaxLineBytes = 4096     // one line, excluding its "\n"
)

// MaxSocketPath is the longest Unix socket path that fits sun_path
// (108 bytes on Linux, including the terminating NUL).
const MaxSocketPath = 107

// Limits on the identity keys. A hostname is one DNS label (RFC 1035), so
// it works unchanged as the guest's hostname and in any name a platform
// builds from it. The id bound keeps it printable in one log field.
const (
	MaxHostname  = 63
	MaxSandboxID = 128
)

// Config is the validated, defaulted content of nether.conf. Paths are
// absolute and cleaned, so consumers never depend on the process's current
// directory.
type Config struct {
	Dir            string // absolute launch directory the file was read from
	ControlSocket  string // "" = console mode; else absolute path of the control socket
	CPUs           int    // 1..32, default 1
	RAMMB          int    // 128..65536, default 512
	MaxOutputBytes int64  // per-command output cap; 0 = unlimited; default 1 MiB
	// MaxTransferBytes bounds one __put__ or __get__; 0 = unlimited.
	MaxTransferBytes int64
	// ConsoleLogMaxBytes bounds console.log: past it, the older half is
	// dropped. 0 = unlimited.
	ConsoleLogMaxBytes int64
	// Budgets, in seconds; 0 = off. Reaching one ends the session.
	MaxRuntimeS  int64 // wall clock since the session began
	MaxCPUS      int64 // host CPU time of the guest
	IdleTimeoutS int64 // no client connected and no command running
	X402         bool  // settlement framing of the teardown record; default off
	GPU          bool  // a display device; __frame__ and __framediff__ read its scanout
	// Networking (net = 1): a NIC behind nether's user-mode NAT.
	Net         bool
	NetOpen     bool           // the firewall off (net_block still applies)
	NetAllow    []netip.Prefix // exceptions to the default deny
	NetBlock    []netip.Prefix // blocked whatever else says
	NetRateKbps int64          // host -> guest cap; 0 = unlimited
	// The data plane: DataSocket (nether's listener) reaches the
	// tenant's server on the guest's 127.0.0.1:AppPort. The egress
	// plane: the tenant's connections to 127.0.0.1:EgressPort reach
	// EgressSocket (the platform's listener). 0 and "" = off.
	AppPort      int
	DataSocket   string
	EgressPort   int
	EgressSocket string
	MaxDataConns int          // both planes together: 1..48, default 48
	DataIdleMS   int64        // a data connection idle both ways this long is reaped; 0 = off
	DataRateKbps int64        // guest -> platform, all connections; 0 = unlimited
	Accel        engine.Accel // default auto; the engine's own type, resolved there
	Kernel       string       // "" = default image built by setup; else absolute path of a regular file
	Image        string       // "" = default initramfs built by setup; else absolute path of a regular file
	// Rootfs is the guest's root file system: "" = the Debian image setup
	// built, RootfsBusybox = none (the initramfs's busybox is the whole
	// userland), else the absolute path of a root image file.
	Rootfs string
	// RunAs is the guest user every command runs as; "" = root, as
	// before. A user name as /etc/passwd spells it; the guest resolves it.
	RunAs string
	// Disk is the persistent disk mounted at /data: "" = none, else the
	// absolute path of its host file (created and formatted when absent).
	// In a restore it names where the fork's own copy-on-write layer
	// lives. DiskSizeMB is the size a new disk gets and the least an
	// existing one must have.
	Disk       string
	DiskSizeMB int

	// Snapshot / fork keys.
	Restore            bool   // boot by restoring RestoreFrom instead of a fresh boot
	RestoreFrom        string // absolute path of the snapshot to restore
	SnapshotAllowDirty bool   // best-effort __snapshot__ when the guest is not quiescent
	ParkDirty          bool   // let __park__ proceed with undelivered bridge bytes
	ValidateSnapshot   string // absolute path of a snapshot to vet (no boot); "" = off
	ForkReseed         bool   // reseed the guest crng via vmgenid on restore; default on

	// Identity handed in by the platform. Both are optional and "" when
	// absent: nether mints what the file leaves out, so "" means "not
	// given", never "none".
	SandboxID string // 1..MaxSandboxID bytes of printable ASCII (0x21-0x7e)
	Hostname  string // one DNS label: 1..MaxHostname of [A-Za-z0-9-], no '-' at either end

	// The boot's identity, handed in by an orchestrator (nexus) that
	// admitted it; "" when not given, and nether mints a BootID then.
	// NodeID names the host, BootID this boot (restore, wake),
	// PlanDigest the admitted plan (64 lowercase hex digits),
	// IdentityToken the orchestrator's signed statement of all that,
	// passed to the guest as it is.
	NodeID        string
	BootID        string
	PlanDigest    string
	IdentityToken string
	// SecretsFD is a descriptor nether inherits, 0 = none: nether reads
	// the sandbox's secrets from it once at start (agentproto's secrets
	// encoding) and closes it, so they are never in a file.
	SecretsFD int

	// Set maps every key present in the file to its line number, so callers
	// can tell explicit settings from defaults when reporting.
	Set map[string]int
}

// Defaults returns the configuration used when nether.conf sets nothing.
// dir is made absolute; if that fails (no working directory) it is only
// cleaned, since Defaults has no way to report an error.
func Defaults(dir string) *Config {
	abs, err := absDir(dir)
	if err != nil {
		abs = filepath.Clean(dir)
	}
	return &Config{
		Dir:            abs,
		CPUs:           1,
		RAMMB:          512,
		MaxOutputBytes: 1 << 20,
		// A transfer larger than this is more likely a runaway (a sparse
		// 100 GiB file) than a payload; a platform that moves bigger files
		// raises it.
		MaxTransferBytes:   1 << 30,
		ConsoleLogMaxBytes: 4 << 20,
		Accel:              engine.AccelAuto,
		ForkReseed:         true,
		MaxDataConns:       48,
		DiskSizeMB:         DefaultDiskSizeMB,
		Set:                map[string]int{},
	}
}

// Error is a nether.conf problem. File, Line and Key locate it; Line 0 means
// the problem concerns the whole file and Key is "" when no key applies.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string

	err error // underlying cause, if any, for errors.Is / errors.As
}

// Error formats as "file:line: key: msg", dropping parts that do not apply.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Key != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		// A key that came from a malformed line may hold anything printable
		// or not; quote it so the log line stays one unambiguous line.
		if isKeySyntax(e.Key) {
			b.WriteString(e.Key)
		} else {
			b.WriteString(strconv.Quote(e.Key))
		}
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the underlying cause (for example fs.ErrNotExist).
func (e *Error) Unwrap() error { return e.err }

// Load reads and validates nether.conf from dir.
func Load(dir string) (*Config, error) {
	abs, err := absDir(dir)
	if err != nil {
		return nil, &Error{File: FileName, Msg: fmt.Sprintf("cannot resolve launch directory %q: %v", dir, err), err: err}
	}
	path := filepath.Join(abs, FileName)
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &Error{File: FileName, err: err, Msg: fmt.Sprintf(
				"no %s in the launch directory %s; nether reads its settings from there. "+
					"Create it: an empty file boots in console mode, "+
					"and a line like control_socket=/run/nether/<id>.sock enables control mode",
				FileName, abs)}
		}
		return nil, &Error{File: FileName, Msg: fmt.Sprintf("cannot open %s: %v", path, err), err: err}
	}
	defer f.Close()
	// Refuse non-regular files up front: reading a FIFO or device could
	// block forever, and a directory gives a confusing read error.
	if st, err := f.Stat(); err == nil && !st.Mode().IsRegular() {
		return nil, &Error{File: FileName, Msg: fmt.Sprintf("%s is not a regular file (mode %v)", path, st.Mode().Type())}
	}
	return Parse(f, FileName, abs)
}

// Parse reads nether.conf text from r and validates it. file names the
// source in errors; dir is the launch directory that relative paths are
// resolved against (made absolute here). Kernel and image paths are checked
// for existence, so Parse touches the file system.
func Parse(r io.Reader, file, dir string) (*Config, error) {
	abs, err := absDir(dir)
	if err != nil {
		return nil, &Error{File: file, Msg: fmt.Sprintf("cannot resolve launch directory %q: %v", dir, err), err: err}
	}
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, &Error{File: file, Msg: fmt.Sprintf("read failed: %v", err), err: err}
	}
	if len(data) > MaxFileBytes {
		return nil, &Error{File: file, Msg: fmt.Sprintf("file is larger than %d KiB; nether.conf holds a handful of settings, this is not one", MaxFileBytes>>10)}
	}
	// Tolerate the BOM some Windows editors prepend; otherwise it would glue
	// itself onto the first key and read as an unknown key.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))

	c := Defaults(abs)
	p := &parser{file: file, c: c}
	lines := bytes.Split(data, []byte("\n"))
	for i, raw := range lines {
		if i == len(lines)-1 && len(raw) == 0 {
			break // text after the final "\n"
		}
		if err := p.line(i+1, raw); err != nil {
			return nil, err
		}
	}
	if err := p.crossCheck(); err != nil {
		return nil, err
	}
	return c, nil
}

type parser struct {
	file string
	c    *Config
}

func (p *parser) errf(line int, key, format string, args ...any) *Error {
	return &Error{File: p.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// line parses one physical line (without its "\n").
func (p *parser) line(n int, raw []byte) error {
	// Byte-level checks come first: the rest of the parser works on a Go
	// string and assumes valid, NUL-free UTF-8 of bounded size.
	if len(raw) > MaxLineBytes {
		return p.errf(n, guessKey(raw), "line is %d bytes, longer than the %d-byte limit", len(raw), MaxLineBytes)
	}
	if bytes.IndexByte(raw, 0) >= 0 {
		return p.errf(n, guessKey(raw), "line contains a NUL byte")
	}
	if !utf8.Valid(raw) {
		return p.errf(n, guessKey(raw), "line is not valid UTF-8")
	}
	s := strings.TrimSuffix(string(raw), "\r") // CRLF files
	s = trimBlank(stripComment(s))
	if s == "" {
		return nil
	}
	eq := strings.IndexByte(s, '=')
	if eq < 0 {
		key := firstToken(s)
		if !isKeySyntax(key) {
			key = ""
		}
		return p.errf(n, key, "expected \"key = value\", got %q", s)
	}
	key, val := trimBlank(s[:eq]), trimBlank(s[eq+1:])
	if key == "" {
		return p.errf(n, "", "missing key before \"=\"")
	}
	f := fieldByName(key)
	if f == nil {
		if _, ok := unsupported[key]; ok {
			// Accepting and ignoring a govern cap or a firewall rule would
			// run the sandbox with less protection than the platform asked
			// for, so a known-but-unimplemented key is fatal.
			return p.errf(n, key, "%s is not supported by this build yet", key)
		}
		msg := "unknown key"
		if s := suggest(key); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", s)
		}
		return p.errf(n, key, "%s", msg)
	}
	if first, dup := p.c.Set[key]; dup {
		// Last-one-wins would let a stray line appended by some tool
		// override the intended setting without anyone noticing.
		return p.errf(n, key, "duplicate key (first set on line %d)", first)
	}
	if val == "" {
		return p.errf(n, key, "missing value (remove the line to get the default)")
	}
	if strings.ContainsAny(val, " \t") && !listKeys[key] {
		return p.errf(n, key, "%q is not a single value (values cannot contain spaces or tabs)", val)
	}
	if i := strings.IndexFunc(val, unicode.IsControl); i >= 0 {
		return p.errf(n, key, "%q contains a control character", val)
	}
	if msg := f.set(p.c, val); msg != "" {
		return p.errf(n, key, "%s", msg)
	}
	p.c.Set[key] = n
	return nil
}

// crossCheck enforces rules that involve more than one key.
func (p *parser) crossCheck() error {
	c := p.c
	if c.Restore && c.RestoreFrom == "" {
		return p.errf(c.Set["restore"], "restore", "restore=1 requires restore_from=<absolute path of the snapshot>")
	}
	if !c.Restore && c.RestoreFrom != "" {
		return p.errf(c.Set["restore_from"], "restore_from", "restore_from is set but restore is not 1; add restore=1 or remove restore_from")
	}
	if c.Restore && c.ValidateSnapshot != "" {
		return p.errf(c.Set["validate_snapshot"], "validate_snapshot",
			"cannot be combined with restore=1 (line %d): validating a snapshot and restoring one are separate runs", c.Set["restore"])
	}
	// A restore may leave the ports out: it inherits the ones its
	// artifact was captured with.
	if c.DataSocket != "" && c.AppPort == 0 && !c.Restore {
		return p.errf(c.Set["data_socket"], "data_socket", "needs app_port = <the tenant's server port in the guest>")
	}
	if c.EgressSocket != "" && c.EgressPort == 0 && !c.Restore {
		return p.errf(c.Set["egress_socket"], "egress_socket", "needs egress_port = <the guest port the tenant connects to>")
	}
	socks := map[string]string{}
	for _, k := range []struct{ key, path string }{{"control_socket", c.ControlSocket}, {"data_socket", c.DataSocket}, {"egress_socket", c.EgressSocket}} {
		if k.path == "" {
			continue
		}
		if other, ok := socks[k.path]; ok {
			return p.errf(c.Set[k.key], k.key, "is the same path as %s (line %d); each socket needs its own path", other, c.Set[other])
		}
		socks[k.path] = k.key
	}
	if (c.DataSocket != "" || c.EgressSocket != "") && c.ControlSocket == "" {
		key := "data_socket"
		if c.DataSocket == "" {
			key = "egress_socket"
		}
		return p.errf(c.Set[key], key, "needs control_socket: the planes ride the channel to the guest agent, which console mode does not run")
	}
	return nil
}

// Format renders c as canonical nether.conf text. Only settings that differ
// from the defaults are written, one "key = value" per line in a fixed
// order, so the output is stable and Parse reads it back to an equal Config.
// Paths are written as stored (absolute after Parse).
func (c *Config) Format() string {
	def := Defaults(c.Dir)
	var b strings.Builder
	b.WriteString("# nether.conf (canonical form; unlisted keys are at their defaults)\n")
	for i := range fields {
		f := &fields[i]
		if v := f.get(c); v != f.get(def) {
			sep := " = "
			if strings.HasPrefix(v, "#") {
				// A sandbox id may start with "#", but after a space a "#"
				// opens a comment; glued to the "=" it stays the value.
				sep = " ="
			}
			fmt.Fprintf(&b, "%s%s%s\n", f.name, sep, v)
		}
	}
	return b.String()
}

// Report lists every effective setting as "key=value", defaults included,
// in the same fixed order as Format. Unset paths report an empty value.
func (c *Config) Report() []string {
	out := make([]string, 0, len(fields))
	for i := range fields {
		out = append(out, fields[i].name+"="+fields[i].get(c))
	}
	return out
}

// field describes one supported key: how to parse its value into a Config
// and how to render it back. set returns "" on success or an error message
// (without file/line/key, which the caller adds).
type field struct {
	name string
	set  func(c *Config, v string) string
	get  func(c *Config) string
}

// listKeys take a comma-separated list, whose items may have blanks
// around them (net_allow = 10.0.0.0/8, 192.168.0.0/16): the one place a
// value may contain a space.
var listKeys = map[string]bool{"net_allow": true, "net_block": true}

// fields is in canonical order (Format, Report).
var fields = []field{
	{KeyControlSocket,
		func(c *Config, v string) string { return setSocket(&c.ControlSocket, c.Dir, v) },
		func(c *Config) string { return c.ControlSocket }},
	{KeyCPUs,
		func(c *Config, v string) string { return setInt(&c.CPUs, v, 1, 32) },
		func(c *Config) string { return strconv.Itoa(c.CPUs) }},
	{KeyRAMMB,
		func(c *Config, v string) string { return setInt(&c.RAMMB, v, 128, 65536) },
		func(c *Config) string { return strconv.Itoa(c.RAMMB) }},
	{"max_output_bytes",
		func(c *Config, v string) string { return setUint(&c.MaxOutputBytes, v) },
		func(c *Config) string { return strconv.FormatInt(c.MaxOutputBytes, 10) }},
	{"max_transfer_bytes",
		func(c *Config, v string) string { return setUint(&c.MaxTransferBytes, v) },
		func(c *Config) string { return strconv.FormatInt(c.MaxTransferBytes, 10) }},
	{"console_log_max_bytes",
		func(c *Config, v string) string {
			n, msg := parseUint(v)
			if msg == "" && n != 0 && n < 64<<10 {
				return fmt.Sprintf("%d is below the minimum of 65536 (0 = unlimited)", n)
			}
			if msg == "" {
				c.ConsoleLogMaxBytes = n
			}
			return msg
		},
		func(c *Config) string { return strconv.FormatInt(c.ConsoleLogMaxBytes, 10) }},
	{KeyMaxRuntimeS,
		func(c *Config, v string) string { return setUint(&c.MaxRuntimeS, v) },
		func(c *Config) string { return strconv.FormatInt(c.MaxRuntimeS, 10) }},
	{KeyMaxCPUS,
		func(c *Config, v string) string { return setUint(&c.MaxCPUS, v) },
		func(c *Config) string { return strconv.FormatInt(c.MaxCPUS, 10) }},
	{KeyIdleTimeoutS,
		func(c *Config, v string) string { return setUint(&c.IdleTimeoutS, v) },
		func(c *Config) string { return strconv.FormatInt(c.IdleTimeoutS, 10) }},
	{"x402",
		func(c *Config, v string) string { return setBool(&c.X402, v) },
		func(c *Config) string { return onOff(c.X402) }},
	{"accel",
		func(c *Config, v string) string {
			if a := engine.Accel(v); a.Valid() {
				c.Accel = a
				return ""
			}
			return fmt.Sprintf("%q is not an accelerator (want auto, kvm or tcg)", v)
		},
		func(c *Config) string { return string(c.Accel) }},
	{"kernel",
		func(c *Config, v string) string { return setFile(&c.Kernel, c.Dir, v) },
		func(c *Config) string { return c.Kernel }},
	{"image",
		func(c *Config, v string) string { return setFile(&c.Image, c.Dir, v) },
		func(c *Config) string { return c.Image }},
	{KeyRootfs,
		func(c *Config, v string) string {
			if v == RootfsBusybox {
				c.Rootfs = v
				return ""
			}
			return setFile(&c.Rootfs, c.Dir, v)
		},
		func(c *Config) string { return c.Rootfs }},
	{KeyRunAs,
		func(c *Config, v string) string {
			if msg := checkUserName(v); msg != "" {
				return msg
			}
			c.RunAs = v
			return ""
		},
		func(c *Config) string { return c.RunAs }},
	{KeyDisk,
		func(c *Config, v string) string {
			p := resolve(c.Dir, v)
			if st, err := os.Stat(p); err == nil && !st.Mode().IsRegular() {
				return fmt.Sprintf("%s is not a regular file", p)
			}
			c.Disk = p
			return ""
		},
		func(c *Config) string { return c.Disk }},
	{KeyDiskSizeMB,
		func(c *Config, v string) string { return setInt(&c.DiskSizeMB, v, MinDiskSizeMB, MaxDiskSizeMB) },
		func(c *Config) string { return strconv.Itoa(c.DiskSizeMB) }},
	{KeyRestore,
		func(c *Config, v string) string { return setBool(&c.Restore, v) },
		func(c *Config) string { return zeroOne(c.Restore) }},
	{KeyRestoreFrom,
		func(c *Config, v string) string {
			// Absolute only: the snapshot usually lives in a shared store,
			// and resolving against a per-sandbox directory would silently
			// pick up a different file in each launch directory.
			if !filepath.IsAbs(v) {
				return fmt.Sprintf("%q is not an absolute path", v)
			}
			c.RestoreFrom = filepath.Clean(v)
			return ""
		},
		func(c *Config) string { return c.RestoreFrom }},
	{"snapshot_allow_dirty",
		func(c *Config, v string) string { return setBool(&c.SnapshotAllowDirty, v) },
		func(c *Config) string { return zeroOne(c.SnapshotAllowDirty) }},
	{"park_dirty",
		func(c *Config, v string) string { return setBool(&c.ParkDirty, v) },
		func(c *Config) string { return zeroOne(c.ParkDirty) }},
	{"validate_snapshot",
		func(c *Config, v string) string {
			// Existence is the validator's job: it reports a missing file
			// with the same exit path as a corrupt one.
			c.ValidateSnapshot = resolve(c.Dir, v)
			return ""
		},
		func(c *Config) string { return c.ValidateSnapshot }},
	{"fork_reseed",
		func(c *Config, v string) string { return setBool(&c.ForkReseed, v) },
		func(c *Config) string { return zeroOne(c.ForkReseed) }},
	// The identity keys come last so the positions of the older keys in
	// Report and Format output do not move.
	{KeySandboxID,
		func(c *Config, v string) string {
			if msg := checkSandboxID(v); msg != "" {
				return msg
			}
			c.SandboxID = v
			return ""
		},
		func(c *Config) string { return c.SandboxID }},
	{KeyHostname,
		func(c *Config, v string) string {
			if msg := checkHostname(v); msg != "" {
				return msg
			}
			c.Hostname = v
			return ""
		},
		func(c *Config) string { return c.Hostname }},
	{KeyGPU,
		func(c *Config, v string) string { return setBool(&c.GPU, v) },
		func(c *Config) string { return zeroOne(c.GPU) }},
	{KeyNet,
		func(c *Config, v string) string { return setBool(&c.Net, v) },
		func(c *Config) string { return zeroOne(c.Net) }},
	{"net_open",
		func(c *Config, v string) string { return setBool(&c.NetOpen, v) },
		func(c *Config) string { return zeroOne(c.NetOpen) }},
	{KeyNetAllow,
		func(c *Config, v string) string { return setPrefixes(&c.NetAllow, v) },
		func(c *Config) string { return firewall.FormatList(c.NetAllow) }},
	{KeyNetBlock,
		func(c *Config, v string) string { return setPrefixes(&c.NetBlock, v) },
		func(c *Config) string { return firewall.FormatList(c.NetBlock) }},
	{"net_rate_kbps",
		func(c *Config, v string) string { return setUint(&c.NetRateKbps, v) },
		func(c *Config) string { return strconv.FormatInt(c.NetRateKbps, 10) }},
	{KeyAppPort,
		func(c *Config, v string) string { return setInt(&c.AppPort, v, 1, 65535) },
		func(c *Config) string { return strconv.Itoa(c.AppPort) }},
	{KeyDataSocket,
		func(c *Config, v string) string { return setSocket(&c.DataSocket, c.Dir, v) },
		func(c *Config) string { return c.DataSocket }},
	{"max_data_conns",
		func(c *Config, v string) string { return setInt(&c.MaxDataConns, v, 1, 48) },
		func(c *Config) string { return strconv.Itoa(c.MaxDataConns) }},
	{"data_idle_ms",
		func(c *Config, v string) string { return setUint(&c.DataIdleMS, v) },
		func(c *Config) string { return strconv.FormatInt(c.DataIdleMS, 10) }},
	{"data_rate_kbps",
		func(c *Config, v string) string { return setUint(&c.DataRateKbps, v) },
		func(c *Config) string { return strconv.FormatInt(c.DataRateKbps, 10) }},
	{KeyEgressPort,
		func(c *Config, v string) string { return setInt(&c.EgressPort, v, 1, 65535) },
		func(c *Config) string { return strconv.Itoa(c.EgressPort) }},
	{"egress_socket",
		func(c *Config, v string) string { return setSocket(&c.EgressSocket, c.Dir, v) },
		func(c *Config) string { return c.EgressSocket }},
	// The boot identity keys (an orchestrator's), last for the same reason.
	{KeyNodeID,
		func(c *Config, v string) string { return setID(&c.NodeID, "node id", v) },
		func(c *Config) string { return c.NodeID }},
	{KeyBootID,
		func(c *Config, v string) string { return setID(&c.BootID, "boot id", v) },
		func(c *Config) string { return c.BootID }},
	{KeyPlanDigest,
		func(c *Config, v string) string {
			if msg := checkDigest(v); msg != "" {
				return msg
			}
			c.PlanDigest = v
			return ""
		},
		func(c *Config) string { return c.PlanDigest }},
	{KeyIdentityToken,
		func(c *Config, v string) string {
			if msg := checkPrintable(v, "identity token", MaxIdentityToken); msg != "" {
				return msg
			}
			c.IdentityToken = v
			return ""
		},
		func(c *Config) string { return c.IdentityToken }},
	{KeySecretsFD,
		func(c *Config, v string) string { return setInt(&c.SecretsFD, v, 3, 1<<20) },
		func(c *Config) string { return strconv.Itoa(c.SecretsFD) }},
}

// setSocket sets a Unix socket path, resolved against the launch
// directory, refusing one too long for sun_path.
func setSocket(dst *string, dir, v string) string {
	p := resolve(dir, v)
	if len(p) > MaxSocketPath {
		return fmt.Sprintf("socket path %q is %d bytes; a Unix socket path must be at most %d bytes, use a shorter one (e.g. under /run or /tmp)",
			p, len(p), MaxSocketPath)
	}
	*dst = p
	return ""
}

// setPrefixes parses a CIDR list (net_allow, net_block).
func setPrefixes(dst *[]netip.Prefix, v string) string {
	ps, err := firewall.ParseList(v)
	if err != nil {
		return err.Error()
	}
	*dst = ps
	return ""
}

func fieldByName(name string) *field {
	for i := range fields {
		if fields[i].name == name {
			return &fields[i]
		}
	}
	return nil
}

// unsupported lists keys the spec defines but this build does not implement.
var unsupported = map[string]struct{}{
	"snapshot_save": {},
}

// setUint sets *dst to the unsigned decimal v.
func setUint(dst *int64, v string) string {
	n, msg := parseUint(v)
	if msg == "" {
		*dst = n
	}
	return msg
}

// parseUint parses a plain, unsigned decimal that fits int64.
func parseUint(v string) (int64, string) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Sprintf("%q is not a whole number", v)
		}
	}
	// "010" could be meant as octal by someone used to C or YAML 1.1;
	// refusing it keeps every accepted spelling unambiguous.
	if len(v) > 1 && v[0] == '0' {
		return 0, fmt.Sprintf("%q has a leading zero", v)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Sprintf("%q is too large", v)
	}
	return n, ""
}

func setInt(dst *int, v string, lo, hi int) string {
	n, msg := parseUint(v)
	if msg != "" {
		return msg
	}
	if n < int64(lo) || n > int64(hi) {
		return fmt.Sprintf("%d is out of range (%d..%d)", n, lo, hi)
	}
	*dst = int(n)
	return ""
}

func setBool(dst *bool, v string) string {
	switch strings.ToLower(v) {
	case "1", "on", "true", "yes":
		*dst = true
	case "0", "off", "false", "no":
		*dst = false
	default:
		return fmt.Sprintf("%q is not a boolean (want 1/0, on/off, true/false or yes/no)", v)
	}
	return ""
}

// checkSandboxID returns "" when v is a usable sandbox id, else why not.
// The id ends up in logs, file names and the guest, so it is held to
// printable ASCII: nothing that needs quoting in a log field or can hide
// (spaces, control characters, look-alike Unicode).
func checkSandboxID(v string) string { return checkPrintable(v, "sandbox id", MaxSandboxID) }

// setID takes a node or boot id: held to the sandbox id's rule, for the
// same reasons (logs, the guest's identity file).
func setID(dst *string, what, v string) string {
	if msg := checkPrintable(v, what, MaxSandboxID); msg != "" {
		return msg
	}
	*dst = v
	return ""
}

// MaxIdentityToken bounds identity_token (a signed statement of a few
// hundred bytes).
const MaxIdentityToken = 2048

// checkPrintable returns "" when v is 1..max bytes of printable ASCII
// without spaces, else why not.
func checkPrintable(v, what string, max int) string {
	if v == "" {
		return "a " + what + " cannot be empty"
	}
	// Length before content, so an overlong value is not quoted in full.
	if len(v) > max {
		return fmt.Sprintf("%s is %d bytes long; at most %d are allowed", what, len(v), max)
	}
	for i, r := range v {
		if r < 0x21 || r > 0x7e {
			return fmt.Sprintf("%q contains %q at byte %d; a %s is printable ASCII (0x21-0x7e) without spaces", v, r, i, what)
		}
	}
	return ""
}

// checkDigest returns "" when v is a sha256 digest in hex (64 lowercase
// digits), else why not.
func checkDigest(v string) string {
	if len(v) != 64 {
		return fmt.Sprintf("plan digest %.70q is %d characters; want the 64 hex digits of a sha256", v, len(v))
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Sprintf("plan digest %q holds %q at %d; want lowercase hex digits", v, c, i)
		}
	}
	return ""
}

// checkHostname returns "" when v is one DNS label, else why not. The
// guest's sethostname would take far more, but a label is what every
// resolver, prompt and platform naming scheme accepts unchanged.
func checkHostname(v string) string {
	if v == "" {
		return "a hostname cannot be empty"
	}
	if len(v) > MaxHostname {
		return fmt.Sprintf("hostname is %d bytes long; a hostname is one DNS label of at most %d characters", len(v), MaxHostname)
	}
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
		case r == '.':
			return fmt.Sprintf("%q contains '.'; a hostname is one DNS label, not a domain name", v)
		default:
			return fmt.Sprintf("%q contains %q; a hostname (DNS label) holds only letters, digits and '-'", v, r)
		}
	}
	if v[0] == '-' || v[len(v)-1] == '-' {
		return fmt.Sprintf("%q starts or ends with '-'; a hostname (DNS label) must start and end with a letter or digit", v)
	}
	return ""
}

// Bounds of disk_size_mb. ext4 with a journal needs a few MiB; the top is
// 1 TiB, far past what a sandbox's sparse file should grow to.
const (
	DefaultDiskSizeMB = 64
	MinDiskSizeMB     = 8
	MaxDiskSizeMB     = 1 << 20
)

// MaxUserName is the longest run_as name (useradd's limit).
const MaxUserName = 32

// checkUserName accepts the portable user names useradd does by default:
// a lower-case letter or '_', then lower-case letters, digits, '_' or '-'.
// The guest looks the name up; the host only keeps it well-formed, since
// it travels on the kernel command line.
func checkUserName(v string) string {
	if v == "" || len(v) > MaxUserName {
		return fmt.Sprintf("a user name is 1..%d characters", MaxUserName)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		ok := c >= 'a' && c <= 'z' || c == '_' || i > 0 && (c >= '0' && c <= '9' || c == '-')
		if !ok {
			return fmt.Sprintf("%q is not a user name (a lower-case letter or '_', then lower-case letters, digits, '_' or '-')", v)
		}
	}
	return ""
}

// RootfsBusybox is the rootfs value of a guest without a root image.
const RootfsBusybox = "busybox"

// setFile resolves a kernel/image path and requires a regular file now, so
// a typo fails at startup with the conf line instead of deep in the VMM.
func setFile(dst *string, dir, v string) string {
	p := resolve(dir, v)
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("%s does not exist", p)
	case err != nil:
		return fmt.Sprintf("cannot use %s: %v", p, err)
	case !st.Mode().IsRegular():
		return fmt.Sprintf("%s is not a regular file", p)
	}
	*dst = p
	return ""
}

// resolve makes v absolute against dir and cleans it, so equal paths
// compare equal and Format output re-parses to the same value.
func resolve(dir, v string) string {
	if filepath.IsAbs(v) {
		return filepath.Clean(v)
	}
	return filepath.Join(dir, v)
}

func absDir(dir string) (string, error) {
	if dir == "" {
		dir = "."
	}
	return filepath.Abs(dir)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func zeroOne(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// stripComment removes a "#" comment. "#" starts a comment only at the
// start of the line or after a space/tab, so a value such as a#b is kept.
func stripComment(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
			return s[:i]
		}
	}
	return s
}

func trimBlank(s string) string { return strings.Trim(s, " \t") }

func firstToken(s string) string {
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

// guessKey extracts the key from a line that failed a byte-level check, so
// even those errors can name the key when the line has a plausible one.
func guessKey(raw []byte) string {
	eq := bytes.IndexByte(raw, '=')
	if eq < 0 {
		return ""
	}
	k := trimBlank(string(raw[:eq]))
	if !isKeySyntax(k) {
		return ""
	}
	return k
}

// isKeySyntax reports whether s looks like a key: lowercase ASCII letters,
// digits and underscores.
func isKeySyntax(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// suggest returns the supported key closest to an unknown one, or "" when
// nothing is close enough to be a plausible typo.
func suggest(key string) string {
	if len(key) > 64 {
		return ""
	}
	k := strings.ReplaceAll(strings.ToLower(key), "-", "_")
	best, bestD := "", 3
	for i := range fields {
		if d := editDistance(k, fields[i].name); d < bestD {
			best, bestD = fields[i].name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance over bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
