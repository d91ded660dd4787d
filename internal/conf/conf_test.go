package conf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/firewall"
)

// launchDir builds a launch directory holding a kernel, an initramfs, a
// nested kernel and a directory (to test the regular-file check).
func launchDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{"vmlinuz", "initramfs.cpio", "boot/Image"} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func parseString(t *testing.T, text, dir string) (*Config, error) {
	t.Helper()
	return Parse(strings.NewReader(text), "nether.conf", dir)
}

// sameConfig compares two configs ignoring Set, which records where keys
// came from rather than what they mean.
func sameConfig(a, b *Config) bool {
	x, y := *a, *b
	x.Set, y.Set = nil, nil
	return reflect.DeepEqual(x, y)
}

func TestDefaults(t *testing.T) {
	dir := launchDir(t)
	c := Defaults(dir)
	want := &Config{
		Dir: dir, CPUs: 1, RAMMB: 512, MaxOutputBytes: 1048576,
		MaxTransferBytes: 1 << 30, ConsoleLogMaxBytes: 4 << 20,
		Accel: engine.AccelAuto, ForkReseed: true, MaxDataConns: 48, DiskSizeMB: 64, Set: map[string]int{},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("Defaults = %+v, want %+v", c, want)
	}
	for _, text := range []string{"", "\n\n", "# only a comment\n", "   \t\n  # indented comment\n"} {
		got, err := parseString(t, text, dir)
		if err != nil {
			t.Fatalf("Parse(%q): %v", text, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%q) = %+v, want defaults", text, got)
		}
	}
}

func TestDefaultsRelativeDir(t *testing.T) {
	c := Defaults("some/rel")
	if !filepath.IsAbs(c.Dir) {
		t.Fatalf("Dir %q is not absolute", c.Dir)
	}
}

func TestParseKeys(t *testing.T) {
	dir := launchDir(t)
	tests := []struct {
		name  string
		text  string
		check func(t *testing.T, c *Config)
	}{
		{"control_socket absolute", "control_socket = /tmp/n.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, "/tmp/n.sock")
		}},
		{"control_socket relative", "control_socket=ctl.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, filepath.Join(dir, "ctl.sock"))
		}},
		{"control_socket cleaned", "control_socket = ./a/../ctl.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, filepath.Join(dir, "ctl.sock"))
		}},
		{"control_socket 107 bytes", "control_socket = /" + strings.Repeat("s", 106), func(t *testing.T, c *Config) {
			eq(t, len(c.ControlSocket), 107)
		}},
		{"cpus", "cpus = 4", func(t *testing.T, c *Config) { eq(t, c.CPUs, 4) }},
		{"cpus min", "cpus=1", func(t *testing.T, c *Config) { eq(t, c.CPUs, 1) }},
		{"cpus max", "cpus=32", func(t *testing.T, c *Config) { eq(t, c.CPUs, 32) }},
		{"ram_mb", "ram_mb = 2048", func(t *testing.T, c *Config) { eq(t, c.RAMMB, 2048) }},
		{"ram_mb min", "ram_mb = 128", func(t *testing.T, c *Config) { eq(t, c.RAMMB, 128) }},
		{"ram_mb max", "ram_mb = 65536", func(t *testing.T, c *Config) { eq(t, c.RAMMB, 65536) }},
		{"max_output_bytes", "max_output_bytes = 4096", func(t *testing.T, c *Config) { eq(t, c.MaxOutputBytes, int64(4096)) }},
		{"max_output_bytes unlimited", "max_output_bytes = 0", func(t *testing.T, c *Config) { eq(t, c.MaxOutputBytes, int64(0)) }},
		{"max_transfer_bytes", "max_transfer_bytes = 1024", func(t *testing.T, c *Config) { eq(t, c.MaxTransferBytes, int64(1024)) }},
		{"max_runtime_s", "max_runtime_s = 30", func(t *testing.T, c *Config) { eq(t, c.MaxRuntimeS, int64(30)) }},
		{"max_cpu_s", "max_cpu_s = 5", func(t *testing.T, c *Config) { eq(t, c.MaxCPUS, int64(5)) }},
		{"idle_timeout_s", "idle_timeout_s = 600", func(t *testing.T, c *Config) { eq(t, c.IdleTimeoutS, int64(600)) }},
		{"max_transfer_bytes unlimited", "max_transfer_bytes = 0", func(t *testing.T, c *Config) { eq(t, c.MaxTransferBytes, int64(0)) }},
		{"console_log_max_bytes", "console_log_max_bytes = 65536", func(t *testing.T, c *Config) { eq(t, c.ConsoleLogMaxBytes, int64(65536)) }},
		{"console_log_max_bytes unlimited", "console_log_max_bytes = 0", func(t *testing.T, c *Config) { eq(t, c.ConsoleLogMaxBytes, int64(0)) }},
		{"max_output_bytes int64 max", "max_output_bytes = 9223372036854775807", func(t *testing.T, c *Config) {
			eq(t, c.MaxOutputBytes, int64(9223372036854775807))
		}},
		{"x402 on", "x402 = on", func(t *testing.T, c *Config) { eq(t, c.X402, true) }},
		{"x402 off", "x402 = off", func(t *testing.T, c *Config) { eq(t, c.X402, false) }},
		{"accel auto", "accel = auto", func(t *testing.T, c *Config) { eq(t, c.Accel, engine.AccelAuto) }},
		{"accel kvm", "accel = kvm", func(t *testing.T, c *Config) { eq(t, c.Accel, engine.AccelKVM) }},
		{"accel tcg", "accel = tcg", func(t *testing.T, c *Config) { eq(t, c.Accel, engine.AccelTCG) }},
		{"kernel relative", "kernel = vmlinuz", func(t *testing.T, c *Config) { eq(t, c.Kernel, filepath.Join(dir, "vmlinuz")) }},
		{"kernel nested", "kernel = boot/Image", func(t *testing.T, c *Config) { eq(t, c.Kernel, filepath.Join(dir, "boot", "Image")) }},
		{"kernel absolute", "kernel = " + filepath.Join(dir, "vmlinuz"), func(t *testing.T, c *Config) {
			eq(t, c.Kernel, filepath.Join(dir, "vmlinuz"))
		}},
		{"image relative", "image = initramfs.cpio", func(t *testing.T, c *Config) {
			eq(t, c.Image, filepath.Join(dir, "initramfs.cpio"))
		}},
		{"rootfs default", "", func(t *testing.T, c *Config) { eq(t, c.Rootfs, "") }},
		{"rootfs busybox", "rootfs = busybox", func(t *testing.T, c *Config) { eq(t, c.Rootfs, RootfsBusybox) }},
		{"rootfs relative", "rootfs = initramfs.cpio", func(t *testing.T, c *Config) {
			eq(t, c.Rootfs, filepath.Join(dir, "initramfs.cpio"))
		}},
		{"restore", "restore = 1\nrestore_from = /snaps/base.snap", func(t *testing.T, c *Config) {
			eq(t, c.Restore, true)
			eq(t, c.RestoreFrom, "/snaps/base.snap")
		}},
		{"restore_from cleaned", "restore=yes\nrestore_from=/snaps//x/../base.snap", func(t *testing.T, c *Config) {
			eq(t, c.RestoreFrom, "/snaps/base.snap")
		}},
		{"restore 0 alone", "restore = 0", func(t *testing.T, c *Config) { eq(t, c.Restore, false) }},
		{"snapshot_allow_dirty", "snapshot_allow_dirty = 1", func(t *testing.T, c *Config) { eq(t, c.SnapshotAllowDirty, true) }},
		{"park_dirty", "park_dirty = true", func(t *testing.T, c *Config) { eq(t, c.ParkDirty, true) }},
		{"validate_snapshot relative", "validate_snapshot = nether.snap", func(t *testing.T, c *Config) {
			eq(t, c.ValidateSnapshot, filepath.Join(dir, "nether.snap"))
		}},
		{"validate_snapshot missing file is fine", "validate_snapshot = /nonexistent/x.snap", func(t *testing.T, c *Config) {
			eq(t, c.ValidateSnapshot, "/nonexistent/x.snap")
		}},
		{"fork_reseed off", "fork_reseed = 0", func(t *testing.T, c *Config) { eq(t, c.ForkReseed, false) }},
		{"fork_reseed on", "fork_reseed = 1", func(t *testing.T, c *Config) { eq(t, c.ForkReseed, true) }},

		// Identity.
		{"identity absent", "cpus = 1", func(t *testing.T, c *Config) {
			eq(t, c.SandboxID, "")
			eq(t, c.Hostname, "")
		}},
		{"sandbox_id", "sandbox_id = sb-7f3a", func(t *testing.T, c *Config) { eq(t, c.SandboxID, "sb-7f3a") }},
		{"sandbox_id one byte", "sandbox_id = x", func(t *testing.T, c *Config) { eq(t, c.SandboxID, "x") }},
		{"sandbox_id every printable byte", "sandbox_id = " + printableASCII, func(t *testing.T, c *Config) {
			eq(t, c.SandboxID, printableASCII)
		}},
		{"sandbox_id 128 bytes", "sandbox_id = " + strings.Repeat("i", 128), func(t *testing.T, c *Config) {
			eq(t, len(c.SandboxID), 128)
		}},
		// Only reachable without a space before the "#"; Format must write
		// it back in a form that is not read as a comment.
		{"sandbox_id leading hash", "sandbox_id=#42", func(t *testing.T, c *Config) { eq(t, c.SandboxID, "#42") }},
		{"hostname", "hostname = box-1", func(t *testing.T, c *Config) { eq(t, c.Hostname, "box-1") }},
		{"hostname one char", "hostname = a", func(t *testing.T, c *Config) { eq(t, c.Hostname, "a") }},
		{"hostname digits only", "hostname = 42", func(t *testing.T, c *Config) { eq(t, c.Hostname, "42") }},
		{"hostname case kept", "hostname = Web-Box7", func(t *testing.T, c *Config) { eq(t, c.Hostname, "Web-Box7") }},
		{"hostname inner dashes", "hostname = a--b", func(t *testing.T, c *Config) { eq(t, c.Hostname, "a--b") }},
		{"hostname 63 chars", "hostname = " + strings.Repeat("h", 63), func(t *testing.T, c *Config) {
			eq(t, len(c.Hostname), 63)
		}},
		{"boot identity", "node_id = 01NODE\nboot_id = 01BOOT\nplan_digest = " + strings.Repeat("ab", 32) + "\nidentity_token = a.b\nsecrets_fd = 3", func(t *testing.T, c *Config) {
			eq(t, c.NodeID, "01NODE")
			eq(t, c.BootID, "01BOOT")
			eq(t, c.PlanDigest, strings.Repeat("ab", 32))
			eq(t, c.IdentityToken, "a.b")
			eq(t, c.SecretsFD, 3)
		}},
		{"identity both", "sandbox_id = tenant/42:a\nhostname = tenant-42", func(t *testing.T, c *Config) {
			eq(t, c.SandboxID, "tenant/42:a")
			eq(t, c.Hostname, "tenant-42")
		}},

		// Networking: the specification's own example, blanks included.
		{"net spec example", "net = 1\nnet_allow = 10.0.0.0/8, 192.168.0.0/16\nnet_block = 1.2.3.0/24\nnet_rate_kbps = 2000", func(t *testing.T, c *Config) {
			eq(t, c.Net, true)
			eq(t, firewall.FormatList(c.NetAllow), "10.0.0.0/8, 192.168.0.0/16")
			eq(t, firewall.FormatList(c.NetBlock), "1.2.3.0/24")
			eq(t, c.NetRateKbps, int64(2000))
		}},
		{"net_open", "net = 1\nnet_open = 1", func(t *testing.T, c *Config) { eq(t, c.NetOpen, true) }},
		{"net_allow host", "net_allow = 10.0.2.2", func(t *testing.T, c *Config) { eq(t, firewall.FormatList(c.NetAllow), "10.0.2.2/32") }},

		// Syntax variations.
		{"no spaces", "cpus=2", func(t *testing.T, c *Config) { eq(t, c.CPUs, 2) }},
		{"tabs and padding", "\t cpus \t=\t 2 \t", func(t *testing.T, c *Config) { eq(t, c.CPUs, 2) }},
		{"trailing comment", "cpus = 2 # two vCPUs", func(t *testing.T, c *Config) { eq(t, c.CPUs, 2) }},
		{"trailing comment after tab", "cpus = 2\t#two", func(t *testing.T, c *Config) { eq(t, c.CPUs, 2) }},
		{"hash inside value is not a comment", "control_socket = a#b.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, filepath.Join(dir, "a#b.sock"))
		}},
		{"equals inside value", "control_socket = a=b.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, filepath.Join(dir, "a=b.sock"))
		}},
		{"CRLF", "cpus = 2\r\nram_mb = 1024\r\n", func(t *testing.T, c *Config) {
			eq(t, c.CPUs, 2)
			eq(t, c.RAMMB, 1024)
		}},
		{"BOM", "\xef\xbb\xbfcpus = 3", func(t *testing.T, c *Config) { eq(t, c.CPUs, 3) }},
		{"no final newline", "# c\ncpus = 3", func(t *testing.T, c *Config) { eq(t, c.CPUs, 3) }},
		{"set records lines", "# header\n\ncpus = 2\nram_mb = 256\n", func(t *testing.T, c *Config) {
			if !reflect.DeepEqual(c.Set, map[string]int{"cpus": 3, "ram_mb": 4}) {
				t.Errorf("Set = %v", c.Set)
			}
		}},
		{"unicode path", "control_socket = sökét.sock", func(t *testing.T, c *Config) {
			eq(t, c.ControlSocket, filepath.Join(dir, "sökét.sock"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseString(t, tt.text, dir)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.text, err)
			}
			tt.check(t, c)
			// Every accepted file must survive a Format round trip.
			back, err := parseString(t, c.Format(), dir)
			if err != nil {
				t.Fatalf("reparse of Format output failed: %v\n%s", err, c.Format())
			}
			if !sameConfig(c, back) {
				t.Fatalf("round trip changed config:\n got %+v\nwant %+v\n%s", back, c, c.Format())
			}
		})
	}
}

// printableASCII is every byte a sandbox id may hold, 0x21 through 0x7e.
var printableASCII = func() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		b.WriteByte(c)
	}
	return b.String()
}()

func TestBooleanSpellings(t *testing.T) {
	dir := launchDir(t)
	for _, key := range []string{"x402", "restore", "snapshot_allow_dirty", "park_dirty", "fork_reseed"} {
		for _, v := range []string{"1", "on", "ON", "true", "True", "yes", "YES", "0", "off", "Off", "false", "FALSE", "no", "No"} {
			t.Run(key+"="+v, func(t *testing.T) {
				text := key + " = " + v
				// restore=1 needs its partner; keep the file valid.
				if key == "restore" && strings.Contains("1 on ON true True yes YES", v) {
					text += "\nrestore_from = /s.snap"
				}
				c, err := parseString(t, text, dir)
				if err != nil {
					t.Fatalf("Parse(%q): %v", text, err)
				}
				want := strings.Contains("1 on ON true True yes YES", v)
				got := map[string]bool{
					"x402": c.X402, "restore": c.Restore, "snapshot_allow_dirty": c.SnapshotAllowDirty,
					"park_dirty": c.ParkDirty, "fork_reseed": c.ForkReseed,
				}[key]
				if got != want {
					t.Errorf("%s = %v, want %v", text, got, want)
				}
			})
		}
	}
}

func TestParseErrors(t *testing.T) {
	dir := launchDir(t)
	long := "/" + strings.Repeat("s", 107) // 108 bytes: one too many for sun_path
	tests := []struct {
		name string
		text string
		line int
		key  string
		msg  string // substring of Error()
	}{
		// Integers.
		{"cpus not a number", "cpus = abc", 1, "cpus", `"abc" is not a whole number`},
		{"cpus negative", "cpus = -1", 1, "cpus", `"-1" is not a whole number`},
		{"cpus plus sign", "cpus = +2", 1, "cpus", `"+2" is not a whole number`},
		{"cpus underscore", "ram_mb = 1_024", 1, "ram_mb", `"1_024" is not a whole number`},
		{"cpus hex", "cpus = 0x2", 1, "cpus", "not a whole number"},
		{"cpus float", "cpus = 2.0", 1, "cpus", "not a whole number"},
		{"cpus leading zero", "cpus = 02", 1, "cpus", "leading zero"},
		{"cpus zero", "cpus = 0", 1, "cpus", "out of range (1..32)"},
		{"cpus too many", "cpus = 33", 1, "cpus", "33 is out of range (1..32)"},
		{"cpus overflow", "cpus = 99999999999999999999", 1, "cpus", "too large"},
		{"ram_mb too small", "ram_mb = 127", 1, "ram_mb", "out of range (128..65536)"},
		{"ram_mb too big", "ram_mb = 65537", 1, "ram_mb", "out of range (128..65536)"},
		{"ram_mb abc", "\n\nram_mb = abc", 3, "ram_mb", `nether.conf:3: ram_mb: "abc" is not a whole number`},
		{"max_output_bytes negative", "max_output_bytes = -1", 1, "max_output_bytes", "not a whole number"},
		{"max_transfer_bytes words", "max_transfer_bytes = 1G", 1, "max_transfer_bytes", "not a whole number"},
		{"max_runtime_s with a unit", "max_runtime_s = 30s", 1, "max_runtime_s", "not a whole number"},
		{"idle_timeout_s negative", "idle_timeout_s = -1", 1, "idle_timeout_s", "not a whole number"},
		{"max_cpu_s fraction", "max_cpu_s = 1.5", 1, "max_cpu_s", "not a whole number"},
		{"console_log_max_bytes words", "console_log_max_bytes = 4MiB", 1, "console_log_max_bytes", "not a whole number"},
		{"console_log_max_bytes too small", "console_log_max_bytes = 100", 1, "console_log_max_bytes", "below the minimum of 65536"},
		{"max_output_bytes overflow", "max_output_bytes = 9223372036854775808", 1, "max_output_bytes", "too large"},
		{"max_output_bytes suffix", "max_output_bytes = 1M", 1, "max_output_bytes", "not a whole number"},

		// Booleans and enums.
		{"x402 bad", "x402 = maybe", 1, "x402", `"maybe" is not a boolean`},
		{"gpu bad", "gpu = 2", 1, "gpu", `"2" is not a boolean`},
		{"net_allow bad cidr", "net = 1\nnet_allow = 10.0.0.0/8, 192.168.0.1/16", 2, "net_allow", `nether.conf:2: net_allow: "192.168.0.1/16" has bits set past its /16 (did you mean 192.168.0.0/16?)`},
		{"net_allow a name", "net_allow = example.com", 1, "net_allow", `"example.com" is not a CIDR prefix or an address`},
		{"net_block empty item", "net_block = 1.2.3.0/24,", 1, "net_block", "item 2 is empty"},
		{"net_allow missing comma", "net_allow = 10.0.0.0/8 192.168.0.0/16", 1, "net_allow", `is not a CIDR prefix`},
		{"net_rate_kbps bad", "net_rate_kbps = fast", 1, "net_rate_kbps", `"fast" is not a whole number`},
		{"net bad", "net = maybe", 1, "net", `"maybe" is not a boolean`},
		{"net_open bad", "net_open = 2", 1, "net_open", `"2" is not a boolean`},
		{"net spaces elsewhere still refused", "net = 1 1", 1, "net", "is not a single value"},
		{"restore bad", "restore = 2", 1, "restore", "not a boolean"},
		{"snapshot_allow_dirty bad", "snapshot_allow_dirty = y", 1, "snapshot_allow_dirty", "not a boolean"},
		{"park_dirty bad", "park_dirty = enable", 1, "park_dirty", "not a boolean"},
		{"fork_reseed bad", "fork_reseed = -1", 1, "fork_reseed", "not a boolean"},
		{"accel bad", "accel = hvf", 1, "accel", `"hvf" is not an accelerator (want auto, kvm or tcg)`},
		{"accel uppercase", "accel = KVM", 1, "accel", "not an accelerator"},

		// Paths.
		{"control_socket too long", "control_socket = " + long, 1, "control_socket", "at most 107 bytes"},
		{"control_socket relative too long", "control_socket = " + strings.Repeat("s", 107), 1, "control_socket", "at most 107 bytes"},
		{"kernel missing", "kernel = nope", 1, "kernel", filepath.Join(dir, "nope") + " does not exist"},
		{"kernel is dir", "kernel = adir", 1, "kernel", "is not a regular file"},
		{"image missing", "\nimage = /nonexistent/initrd", 2, "image", "/nonexistent/initrd does not exist"},
		{"image is dir", "image = " + dir, 1, "image", "is not a regular file"},
		{"rootfs missing", "rootfs = /nonexistent/rootfs.img", 1, "rootfs", "/nonexistent/rootfs.img does not exist"},
		{"rootfs is dir", "rootfs = " + dir, 1, "rootfs", "is not a regular file"},
		{"restore_from relative", "restore = 1\nrestore_from = base.snap", 2, "restore_from", `"base.snap" is not an absolute path`},

		// Identity.
		{"sandbox_id too long", "sandbox_id = " + strings.Repeat("i", 129), 1, "sandbox_id", "sandbox id is 129 bytes long; at most 128 are allowed"},
		{"sandbox_id non-ASCII", "sandbox_id = sb-é", 1, "sandbox_id", `"sb-é" contains 'é' at byte 3; a sandbox id is printable ASCII (0x21-0x7e) without spaces`},
		{"sandbox_id DEL", "sandbox_id = sb\x7f", 1, "sandbox_id", "control character"},
		{"sandbox_id space", "sandbox_id = sb 1", 1, "sandbox_id", "not a single value"},
		{"sandbox_id empty", "sandbox_id =", 1, "sandbox_id", "missing value"},
		{"sandbox_id duplicate", "sandbox_id = a\nsandbox_id = a", 2, "sandbox_id", "duplicate key (first set on line 1)"},
		{"hostname too long", "hostname = " + strings.Repeat("h", 64), 1, "hostname", "hostname is 64 bytes long; a hostname is one DNS label of at most 63 characters"},
		{"hostname leading dash", "hostname = -box", 1, "hostname", `"-box" starts or ends with '-'`},
		{"plan digest short", "plan_digest = abc", 1, "plan_digest", "want the 64 hex digits of a sha256"},
		{"plan digest upper", "plan_digest = " + strings.Repeat("AB", 32), 1, "plan_digest", "want lowercase hex digits"},
		{"boot id non-ascii", "boot_id = aéb", 1, "boot_id", "printable ASCII"},
		{"node id too long", "node_id = " + strings.Repeat("n", MaxSandboxID+1), 1, "node_id", "node id is 129 bytes long"},
		{"token with a blank", "identity_token = a\tb", 1, "identity_token", "not a single value"},
		{"token too long", "identity_token = " + strings.Repeat("t", MaxIdentityToken+1), 1, "identity_token", "at most 2048"},
		{"secrets fd stdio", "secrets_fd = 2", 1, "secrets_fd", ""},
		{"hostname trailing dash", "hostname = box-", 1, "hostname", `"box-" starts or ends with '-'`},
		{"hostname only dash", "hostname = -", 1, "hostname", "starts or ends with '-'"},
		{"hostname underscore", "hostname = my_box", 1, "hostname", `"my_box" contains '_'; a hostname (DNS label) holds only letters, digits and '-'`},
		{"hostname domain", "\nhostname = box.example.com", 2, "hostname", "contains '.'; a hostname is one DNS label, not a domain name"},
		{"hostname non-ASCII", "hostname = bøx", 1, "hostname", `contains 'ø'`},
		{"hostname empty", "hostname = # none", 1, "hostname", "missing value"},
		{"hostname duplicate", "hostname = a\nhostname = b", 2, "hostname", "duplicate key"},

		// Values.
		{"missing value", "cpus =", 1, "cpus", "missing value"},
		{"missing value before comment", "cpus = # none", 1, "cpus", "missing value"},
		{"two tokens", "cpus = 2 4", 1, "cpus", "not a single value"},
		{"path with space", "kernel = my kernel", 1, "kernel", "not a single value"},
		{"control char", "control_socket = a\x01b", 1, "control_socket", "control character"},
		{"stray CR", "cpus = 2\r\r", 1, "cpus", "control character"},

		// Structure.
		{"no equals", "cpus 2", 1, "cpus", `expected "key = value"`},
		{"bare word", "\n\nhello", 3, "hello", `expected "key = value"`},
		{"no key", " = 3", 1, "", `missing key before "="`},
		{"unknown key", "foo = 1", 1, "foo", "unknown key"},
		{"unknown key suggestion", "ram_gb = 1", 1, "ram_gb", "did you mean ram_mb?"},
		{"uppercase key", "CPUS = 2", 1, "CPUS", "did you mean cpus?"},
		{"key with space", "ram mb = 2", 1, "ram mb", `nether.conf:1: "ram mb": unknown key`},
		{"duplicate", "cpus = 1\n# x\ncpus = 2", 3, "cpus", "duplicate key (first set on line 1)"},
		{"duplicate same value", "x402 = on\nx402 = on", 2, "x402", "duplicate key"},

		// Byte-level.
		{"NUL", "cpus = 1\ncpus\x00 = 2", 2, "", "NUL byte"},
		{"NUL in value names key", "ram_mb = 1\x002", 1, "ram_mb", "NUL byte"},
		{"invalid UTF-8", "# ok\ncontrol_socket = /tmp/\xff.sock", 2, "control_socket", "not valid UTF-8"},
		{"invalid UTF-8 in comment", "# \xc3\x28\n", 1, "", "not valid UTF-8"},
		{"long line", "# " + strings.Repeat("x", 4095), 1, "", "longer than the 4096-byte limit"},
		{"long line names key", "kernel = " + strings.Repeat("x", 4096), 1, "kernel", "longer than the 4096-byte limit"},

		// Cross-field.
		{"restore without restore_from", "restore = 1", 1, "restore", "restore=1 requires restore_from"},
		{"restore_from without restore", "restore_from = /s.snap", 1, "restore_from", "restore is not 1"},
		{"restore_from with restore 0", "restore = 0\nrestore_from = /s.snap", 2, "restore_from", "restore is not 1"},
		{"validate_snapshot with restore", "restore = 1\nrestore_from = /s.snap\nvalidate_snapshot = /s.snap", 3, "validate_snapshot", "cannot be combined with restore=1 (line 1)"},
		{"app_port 0", "app_port = 0", 1, "app_port", "out of range"},
		{"app_port too large", "app_port = 65536", 1, "app_port", "out of range"},
		{"egress_port not a number", "egress_port = http", 1, "egress_port", "not a whole number"},
		{"max_data_conns over the ceiling", "max_data_conns = 49", 1, "max_data_conns", "out of range"},
		{"max_data_conns 0", "max_data_conns = 0", 1, "max_data_conns", "out of range"},
		{"data_socket without app_port", "control_socket = /tmp/c.sock\ndata_socket = /tmp/d.sock", 2, "data_socket", "needs app_port"},
		{"egress_socket without egress_port", "control_socket = /tmp/c.sock\negress_socket = /tmp/e.sock", 2, "egress_socket", "needs egress_port"},
		{"data_socket is the control socket", "control_socket = /tmp/c.sock\napp_port = 80\ndata_socket = /tmp/c.sock", 3, "data_socket", "same path as control_socket (line 1)"},
		{"data_socket in console mode", "app_port = 80\ndata_socket = /tmp/d.sock", 2, "data_socket", "needs control_socket"},
		{"data_socket too long", "data_socket = /" + strings.Repeat("d", 120), 1, "data_socket", "at most 107 bytes"},
		{"run_as upper case", "run_as = Nether", 1, "run_as", "is not a user name"},
		{"run_as with a colon", "run_as = a:b", 1, "run_as", "is not a user name"},
		{"run_as digit first", "run_as = 1user", 1, "run_as", "is not a user name"},
		{"run_as too long", "run_as = " + strings.Repeat("u", 33), 1, "run_as", "1..32 characters"},
		{"disk a directory", "disk = /", 1, "disk", "is not a regular file"},
		{"disk_size_mb too small", "disk_size_mb = 4", 1, "disk_size_mb", "out of range (8..1048576)"},
		{"disk_size_mb not a number", "disk_size_mb = big", 1, "disk_size_mb", "not a whole number"},
	}
	// Every not-yet-implemented spec key must be refused with the same
	// distinct message, whatever its value looks like.
	for _, k := range []string{
		"snapshot_save",
	} {
		tests = append(tests, struct {
			name, text string
			line       int
			key, msg   string
		}{"unsupported " + k, "cpus = 2\n" + k + " = 10.0.0.0/8, 192.168.0.0/16", 2, k,
			"nether.conf:2: " + k + ": " + k + " is not supported by this build yet"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseString(t, tt.text, dir)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want error", tt.text, c)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is %T, want *Error", err, err)
			}
			if ce.File != "nether.conf" || ce.Line != tt.line || ce.Key != tt.key {
				t.Errorf("error at %s:%d key %q, want nether.conf:%d key %q (%v)", ce.File, ce.Line, ce.Key, tt.line, tt.key, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
			// The rendered message names the file, line and key.
			prefix := "nether.conf:" + strconv.Itoa(tt.line) + ": "
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("error %q does not start with %q", err, prefix)
			}
			if tt.key != "" && !strings.Contains(err.Error(), tt.key) {
				t.Errorf("error %q does not name key %q", err, tt.key)
			}
		})
	}
}

func TestFileTooLarge(t *testing.T) {
	dir := launchDir(t)
	// Exactly at the limit is fine; one byte more is not.
	line := "# " + strings.Repeat("x", 1021) + "\n" // 1024 bytes
	ok := strings.Repeat(line, 64)
	if _, err := parseString(t, ok, dir); err != nil {
		t.Fatalf("64 KiB file rejected: %v", err)
	}
	_, err := parseString(t, ok+"\n", dir)
	var ce *Error
	if !errors.As(err, &ce) || ce.Line != 0 || !strings.Contains(err.Error(), "larger than 64 KiB") {
		t.Fatalf("oversized file: got %v", err)
	}
	if !strings.HasPrefix(err.Error(), "nether.conf: ") {
		t.Errorf("file-level error %q should start with the file name", err)
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{File: "nether.conf", Line: 3, Key: "ram_mb", Msg: `"abc" is not a whole number`}, `nether.conf:3: ram_mb: "abc" is not a whole number`},
		{Error{File: "nether.conf", Msg: "file is larger than 64 KiB"}, "nether.conf: file is larger than 64 KiB"},
		{Error{File: "nether.conf", Line: 2, Msg: "line contains a NUL byte"}, "nether.conf:2: line contains a NUL byte"},
		{Error{File: "nether.conf", Line: 1, Key: "a\nb", Msg: "unknown key"}, `nether.conf:1: "a\nb": unknown key`},
		{Error{Msg: "bare"}, "bare"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.e.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Run("reads nether.conf", func(t *testing.T) {
		dir := launchDir(t)
		if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("control_socket = ctl.sock\nkernel = vmlinuz\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, c.Dir, dir)
		eq(t, c.ControlSocket, filepath.Join(dir, "ctl.sock"))
		eq(t, c.Kernel, filepath.Join(dir, "vmlinuz"))
	})
	t.Run("relative dir", func(t *testing.T) {
		dir := launchDir(t)
		if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("cpus = 2\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Chdir(dir)
		c, err := Load(".")
		if err != nil {
			t.Fatal(err)
		}
		eq(t, c.CPUs, 2)
		if !filepath.IsAbs(c.Dir) {
			t.Errorf("Dir %q not absolute", c.Dir)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		dir := t.TempDir()
		_, err := Load(dir)
		if err == nil {
			t.Fatal("Load of a directory without nether.conf succeeded")
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error %v should wrap fs.ErrNotExist", err)
		}
		for _, want := range []string{"no nether.conf", dir, "control_socket"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	})
	t.Run("error names file and line", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("cpus = 1\nram_mb = abc\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || err.Error() != `nether.conf:2: ram_mb: "abc" is not a whole number` {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("nether.conf is a directory", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "nether.conf"), 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestFormat(t *testing.T) {
	dir := launchDir(t)
	t.Run("defaults write no keys", func(t *testing.T) {
		f := Defaults(dir).Format()
		for _, l := range strings.Split(strings.TrimSpace(f), "\n") {
			if !strings.HasPrefix(l, "#") {
				t.Errorf("default Format has key line %q", l)
			}
		}
	})
	t.Run("every key round trips", func(t *testing.T) {
		text := strings.Join([]string{
			"control_socket = ctl.sock",
			"cpus = 8",
			"ram_mb = 4096",
			"max_output_bytes = 0",
			"x402 = yes",
			"accel = tcg",
			"kernel = vmlinuz",
			"image = initramfs.cpio",
			"restore = on",
			"restore_from = /var/snaps/base.snap",
			"snapshot_allow_dirty = true",
			"park_dirty = 1",
			"fork_reseed = no",
			"sandbox_id = sb-0001",
			"hostname = box-1",
		}, "\n")
		c, err := parseString(t, text, dir)
		if err != nil {
			t.Fatal(err)
		}
		f := c.Format()
		want := "# nether.conf (canonical form; unlisted keys are at their defaults)\n" +
			"control_socket = " + filepath.Join(dir, "ctl.sock") + "\n" +
			"cpus = 8\n" +
			"ram_mb = 4096\n" +
			"max_output_bytes = 0\n" +
			"x402 = on\n" +
			"accel = tcg\n" +
			"kernel = " + filepath.Join(dir, "vmlinuz") + "\n" +
			"image = " + filepath.Join(dir, "initramfs.cpio") + "\n" +
			"restore = 1\n" +
			"restore_from = /var/snaps/base.snap\n" +
			"snapshot_allow_dirty = 1\n" +
			"park_dirty = 1\n" +
			"fork_reseed = 0\n" +
			"sandbox_id = sb-0001\n" +
			"hostname = box-1\n"
		if f != want {
			t.Fatalf("Format =\n%s\nwant\n%s", f, want)
		}
		back, err := parseString(t, f, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !sameConfig(c, back) {
			t.Fatalf("round trip: got %+v want %+v", back, c)
		}
	})
	t.Run("validate_snapshot round trips", func(t *testing.T) {
		c, err := parseString(t, "validate_snapshot = s.snap", dir)
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseString(t, c.Format(), dir)
		if err != nil || !sameConfig(c, back) {
			t.Fatalf("round trip: %v %+v", err, back)
		}
	})
}

func TestReport(t *testing.T) {
	dir := launchDir(t)
	c, err := parseString(t, "control_socket = /tmp/n.sock\ncpus = 2\nx402 = on\n", dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"control_socket=/tmp/n.sock",
		"cpus=2",
		"ram_mb=512",
		"max_output_bytes=1048576",
		"max_transfer_bytes=1073741824",
		"console_log_max_bytes=4194304",
		"max_runtime_s=0",
		"max_cpu_s=0",
		"idle_timeout_s=0",
		"x402=on",
		"accel=auto",
		"kernel=",
		"image=",
		"rootfs=",
		"run_as=",
		"disk=",
		"disk_size_mb=64",
		"restore=0",
		"restore_from=",
		"snapshot_allow_dirty=0",
		"park_dirty=0",
		"validate_snapshot=",
		"fork_reseed=1",
		"sandbox_id=",
		"hostname=",
		"gpu=0",
		"net=0",
		"net_open=0",
		"net_allow=",
		"net_block=",
		"net_rate_kbps=0",
		"app_port=0",
		"data_socket=",
		"max_data_conns=48",
		"data_idle_ms=0",
		"data_rate_kbps=0",
		"egress_port=0",
		"egress_socket=",
		"node_id=",
		"boot_id=",
		"plan_digest=",
		"identity_token=",
		"secrets_fd=0",
	}
	if got := c.Report(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Report =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	t.Run("identity", func(t *testing.T) {
		c, err := parseString(t, "hostname = box-1\nsandbox_id = sb-1\ngpu = 1\n", dir)
		if err != nil {
			t.Fatal(err)
		}
		got := c.Report()
		i := slices.Index(got, "sandbox_id=sb-1")
		if i < 0 || i+3 > len(got) || !reflect.DeepEqual(got[i:i+3], []string{"sandbox_id=sb-1", "hostname=box-1", "gpu=1"}) {
			t.Fatalf("Report has %q, want sandbox_id=sb-1, hostname=box-1, gpu=1 in a row", got)
		}
	})
}

// TestIdentityCheckers covers the validators directly, including the
// empty value the parser refuses before they run.
func TestIdentityCheckers(t *testing.T) {
	tests := []struct {
		name   string
		check  func(string) string
		v      string
		wantOK bool
	}{
		{"id empty", checkSandboxID, "", false},
		{"id tilde and bang", checkSandboxID, "!~", true},
		{"id space", checkSandboxID, "a b", false},
		{"id tab", checkSandboxID, "a\tb", false},
		{"id NUL", checkSandboxID, "a\x00", false},
		{"id invalid UTF-8", checkSandboxID, "a\xff", false},
		{"id 128", checkSandboxID, strings.Repeat("x", 128), true},
		{"id 129", checkSandboxID, strings.Repeat("x", 129), false},
		{"host empty", checkHostname, "", false},
		{"host label", checkHostname, "a-1", true},
		{"host upper", checkHostname, "ABC", true},
		{"host 63", checkHostname, strings.Repeat("a", 63), true},
		{"host 64", checkHostname, strings.Repeat("a", 64), false},
		{"host leading dash", checkHostname, "-a", false},
		{"host trailing dash", checkHostname, "a-", false},
		{"host dot", checkHostname, "a.b", false},
		{"host slash", checkHostname, "a/b", false},
		{"host invalid UTF-8", checkHostname, "a\xff", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.check(tt.v)
			if (msg == "") != tt.wantOK {
				t.Fatalf("check(%q) = %q, want ok=%v", tt.v, msg, tt.wantOK)
			}
		})
	}
}

func eq[T comparable](t *testing.T, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

// run_as and disk parse to what they say: a relative disk resolves
// against the launch directory, and a file that does not exist yet is
// fine (nether creates it).
func TestRunAsAndDisk(t *testing.T) {
	dir := launchDir(t)
	c, err := parseString(t, "run_as = nether\ndisk = data/d.img\ndisk_size_mb = 128\n", dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.RunAs != "nether" || c.Disk != filepath.Join(dir, "data/d.img") || c.DiskSizeMB != 128 {
		t.Fatalf("parsed %q %q %d", c.RunAs, c.Disk, c.DiskSizeMB)
	}
	back, err := parseString(t, c.Format(), dir)
	if err != nil || !sameConfig(c, back) {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	for _, name := range []string{"_svc", "a-b_c9", "root"} {
		if _, err := parseString(t, "run_as = "+name, dir); err != nil {
			t.Errorf("run_as = %s: %v", name, err)
		}
	}
}
