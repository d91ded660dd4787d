package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, path string)
		wantErr string
	}{
		{"fresh path", func(*testing.T, string) {}, ""},
		{"stale socket of a dead process is replaced", func(t *testing.T, path string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}, ""},
		{"live socket is refused", func(t *testing.T, path string) {
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, "served by a running process"},
		{"regular file is refused and kept", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "exists and is not a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.sock")
			tc.prepare(t, path)
			l, err := Listen(path, "data_socket")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "data_socket") {
					t.Fatalf("Listen: %v, want an error naming data_socket and %q", err, tc.wantErr)
				}
				if b, rerr := os.ReadFile(path); tc.name == "regular file is refused and kept" && (rerr != nil || string(b) != "precious") {
					t.Fatalf("the file was touched: %q %v", b, rerr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("socket mode %v, %v; want 0600", fi.Mode(), err)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			a, err := l.AcceptUnix()
			if err != nil {
				t.Fatal(err)
			}
			if uid, err := PeerUID(a); err != nil || uid != os.Getuid() {
				t.Fatalf("PeerUID %d, %v; want %d", uid, err, os.Getuid())
			}
			a.Close()
			c.Close()
			l.Close()
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Fatalf("Close left the socket file: %v", err)
			}
		})
	}
}

// TestCloseKeepsSuccessor: a listener that lost its path to a successor
// does not remove the successor's socket when it closes.
func TestCloseKeepsSuccessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	first, err := Listen(path, "control_socket")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	second, err := Listen(path, "control_socket")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	first.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the successor's socket is gone: %v", err)
	}
}
