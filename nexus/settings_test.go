package nexus

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/session"
	"github.com/nethersandbox/nether/nexus/store"
)

// TestValidateCreateSettings: the guest settings are held to nether's own
// rules, refused as ErrInvalid with a message naming the setting, before
// anything is made.
func TestValidateCreateSettings(t *testing.T) {
	img := filepath.Join(t.TempDir(), "rootfs.img")
	if err := os.WriteFile(img, []byte("not really"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string // "" = accepted
	}{
		{"none", Config{}, ""},
		{"a disk", Config{DiskSizeMB: 32}, ""},
		{"the smallest disk", Config{DiskSizeMB: conf.MinDiskSizeMB}, ""},
		{"the largest disk", Config{DiskSizeMB: conf.MaxDiskSizeMB}, ""},
		{"a disk too small", Config{DiskSizeMB: conf.MinDiskSizeMB - 1}, "disk_size_mb 7: 7 is out of range (8..1048576)"},
		{"a disk too large", Config{DiskSizeMB: conf.MaxDiskSizeMB + 1}, "out of range"},
		{"a negative disk", Config{DiskSizeMB: -1}, "disk_size_mb -1"},
		{"run_as a user", Config{RunAs: "nether"}, ""},
		{"run_as root", Config{RunAs: "root"}, ""},
		{"run_as _svc-1", Config{RunAs: "_svc-1"}, ""},
		{"run_as upper case", Config{RunAs: "Bob"}, `run_as Bob: "Bob" is not a user name`},
		{"run_as a digit first", Config{RunAs: "1x"}, "is not a user name"},
		{"run_as too long", Config{RunAs: strings.Repeat("a", conf.MaxUserName+1)}, "1..32 characters"},
		{"run_as with a space", Config{RunAs: "a b"}, "not a single value"},
		{"run_as with a newline", Config{RunAs: "nether\nrestore = 1"}, "control character"},
		{"run_as with blanks", Config{RunAs: " nether"}, "blanks around it"},
		{"rootfs busybox", Config{Rootfs: "busybox"}, ""},
		{"rootfs a file", Config{Rootfs: img}, ""},
		{"rootfs missing", Config{Rootfs: "/nonexistent/rootfs.img"}, "/nonexistent/rootfs.img does not exist"},
		{"rootfs relative", Config{Rootfs: "rootfs.img"}, "want an absolute path"},
		{"rootfs a directory", Config{Rootfs: filepath.Dir(img)}, "not a regular file"},
		{"rootfs with a comment", Config{Rootfs: img + " #x"}, "starts a comment"},
		{"net_allow with a comment", Config{NetAllow: "10.0.0.0/8 #, 0.0.0.0/0"}, "starts a comment"},
		{"cpus out of range", Config{CPUs: 99}, "cpus 99"},
		{"negative cpus", Config{CPUs: -2}, "cpus -2"},
		{"net_allow with a newline", Config{NetAllow: "10.0.0.0/8\nrun_as = root"}, "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateCreate(CreateRequest{Name: "web", Config: tc.cfg})
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want an error containing %q", err, tc.err)
			}
			if !errors.Is(err, ErrInvalid) || Kind(err) != KindBadInput {
				t.Errorf("%v is not ErrInvalid (kind %q)", err, Kind(err))
			}
		})
	}
}

// TestValidateForkRunAs: a fork's run_as is well-formed, and never a
// widening or a change of the snapshot's.
func TestValidateForkRunAs(t *testing.T) {
	for _, tc := range []struct {
		name, has, asked, err string
	}{
		{"inherit root", "", "", ""},
		{"inherit a user", "nether", "", ""},
		{"narrow root", "", "nether", ""},
		{"narrow an explicit root", "root", "nether", ""},
		{"keep the user", "nether", "nether", ""},
		{"widen", "nether", "root", "never widen it"},
		{"change", "nether", "bob", "never change it to another user"},
		{"malformed", "", "Bob", "is not a user name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateFork(ForkRequest{From: "warm", RunAs: tc.asked})
			if err == nil {
				err = checkRunAs("snapshot warm", tc.has, tc.asked)
			}
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid containing %q", err, tc.err)
			}
		})
	}
}

// TestConfTextGuestSettings: the nether.conf nexus writes for each kind
// of session of a sandbox with guest settings, read back by nether's own
// parser in the sandbox's directory. A boot names the sandbox's own disk;
// a restore (a fork, a wake) never names one, so nether puts a fork's
// layer in the child's directory and a wake continues its parked disk.
func TestConfTextGuestSettings(t *testing.T) {
	n := &Nexus{dir: t.TempDir()}
	img := filepath.Join(t.TempDir(), "rootfs.img")
	if err := os.WriteFile(img, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(n.dir, snapshotsDir, "01JSNAPSNAPSNAPSNAPSNAPSNA")
	parent := &Sandbox{ID: "01JPARENTPARENTPARENTPAREN", Hostname: "base", Config: Config{Rootfs: img, RunAs: "nether", DiskSizeMB: 32}}
	parent.Disk = filepath.Join(n.sandboxDir(parent.ID), diskName)
	child := &Sandbox{ID: "01JCHILDCHILDCHILDCHILDCHI", Hostname: "kid", Config: parent.Config, Snapshot: "01JSNAP"}
	child.Disk = filepath.Join(n.sandboxDir(child.ID), forkDiskName)
	plain := &Sandbox{ID: "01JPLAINPLAINPLAINPLAINPLA", Hostname: "plain", Config: Config{RunAs: "root"}}
	web := &Sandbox{ID: "01JWEBWEBWEBWEBWEBWEBWEBWE", Hostname: "web", Config: Config{AppPort: 8000}}
	old := &Sandbox{ID: "01JOLDOLDOLDOLDOLDOLDOLDOL", Hostname: "old", Config: Config{DiskSizeMB: 16}} // no Disk recorded
	for _, tc := range []struct {
		name        string
		sb          *Sandbox
		restoreFrom string
		want        map[string]string // key -> value; "" = absent
	}{
		{"create, boot", parent, "", map[string]string{
			"rootfs": img, "run_as": "nether", "disk": parent.Disk, "disk_size_mb": "32", "restore": ""}},
		{"start after stop: the same disk", parent, "", map[string]string{"disk": filepath.Join(n.sandboxDir(parent.ID), "disk.img")}},
		{"wake from a park", parent, filepath.Join(n.sandboxDir(parent.ID), parkName), map[string]string{
			"rootfs": img, "run_as": "nether", "disk": "", "disk_size_mb": "", "restore": "1"}},
		{"fork: nether's default layer", child, snapDir, map[string]string{
			"rootfs": img, "run_as": "nether", "disk": "", "disk_size_mb": "", "restore": "1", "restore_from": snapDir}},
		{"a fork booted after a stop: its own layer", child, "", map[string]string{
			"disk": filepath.Join(n.sandboxDir(child.ID), "disk.qcow2"), "disk_size_mb": "32", "restore": ""}},
		{"no disk", plain, "", map[string]string{"disk": "", "disk_size_mb": "", "run_as": "root", "rootfs": "", "data_socket": ""}},
		{"an app port: its data socket", web, "", map[string]string{"app_port": "8000", "data_socket": filepath.Join(n.sandboxDir(web.ID), "data.sock")}},
		{"an app port, restored", web, snapDir, map[string]string{"app_port": "8000", "data_socket": filepath.Join(n.sandboxDir(web.ID), "data.sock")}},
		{"a record without its disk path", old, "", map[string]string{"disk": filepath.Join(n.sandboxDir(old.ID), "disk.img"), "disk_size_mb": "16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.restoreFrom != "" {
				os.MkdirAll(tc.restoreFrom, 0o700)
			}
			got, text := confValues(t, n, tc.sb, tc.restoreFrom)
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%s = %q, want %q:\n%s", k, got[k], want, text)
				}
			}
			// A disk is always the sandbox's own, never another's.
			if d := got["disk"]; d != "" && filepath.Dir(d) != n.sandboxDir(tc.sb.ID) {
				t.Errorf("disk = %s is not in the sandbox's directory %s", d, n.sandboxDir(tc.sb.ID))
			}
			if got["run_as"] != tc.sb.Config.RunAs || got["rootfs"] != tc.sb.Config.Rootfs {
				t.Errorf("nether reads run_as %q, rootfs %q", got["run_as"], got["rootfs"])
			}
		})
	}
	if forkDiskName != session.ForkDiskLayer {
		t.Errorf("nexus expects a fork's layer at %s, nether makes it at %s", forkDiskName, session.ForkDiskLayer)
	}
}

// TestDiskPath: where each kind of sandbox keeps its disk.
func TestDiskPath(t *testing.T) {
	n := &Nexus{dir: "/srv/nexus"}
	for _, tc := range []struct {
		name string
		sb   Sandbox
		want string
	}{
		{"none", Sandbox{ID: "A"}, ""},
		{"created", Sandbox{ID: "A", Config: Config{DiskSizeMB: 8}, Disk: "/srv/nexus/sandboxes/A/disk.img"}, "/srv/nexus/sandboxes/A/disk.img"},
		{"forked", Sandbox{ID: "B", Config: Config{DiskSizeMB: 8}, Disk: "/srv/nexus/sandboxes/B/disk.qcow2"}, "/srv/nexus/sandboxes/B/disk.qcow2"},
		{"recorded without a path", Sandbox{ID: "C", Config: Config{DiskSizeMB: 8}}, "/srv/nexus/sandboxes/C/disk.img"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := n.diskPath(&tc.sb); got != tc.want {
				t.Errorf("diskPath = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCreateRecordsSettings: a create records the settings and the disk's
// path in the sandbox's own directory, and a refused one makes nothing.
func TestCreateRecordsSettings(t *testing.T) {
	db, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &Nexus{dir: filepath.Dir(db.Path), db: db}
	sb, err := n.Create(t.Context(), CreateRequest{Name: "web", Config: Config{RunAs: "nether", DiskSizeMB: 32, Rootfs: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := n.Inspect(t.Context(), "web")
	if err != nil {
		t.Fatal(err)
	}
	if got.Config != sb.Config || got.Config.RunAs != "nether" || got.Config.DiskSizeMB != 32 || got.Config.Rootfs != "busybox" {
		t.Errorf("recorded %+v", got.Config)
	}
	if want := filepath.Join(n.sandboxDir(sb.ID), "disk.img"); got.Disk != want {
		t.Errorf("disk %q, want %q", got.Disk, want)
	}
	if _, err := n.Create(t.Context(), CreateRequest{Name: "bad", Config: Config{DiskSizeMB: 4}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a disk of 4 MiB: %v", err)
	}
	if _, err := n.Inspect(t.Context(), "bad"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused create left a record: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(n.dir, sandboxesDir))
	if len(ents) != 1 {
		t.Errorf("%d sandbox directories, want 1", len(ents))
	}
}
