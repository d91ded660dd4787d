package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func writeAccounts(t *testing.T) (passwd, group string) {
	t.Helper()
	dir := t.TempDir()
	passwd, group = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\n"+
		"toor:x:0:0:another root:/root:/bin/sh\n"+
		"nether:x:1000:1000::/home/nether:/bin/bash\n"+
		"other:x:1001:1001::/home/other:/bin/sh\n"), 0o644)
	os.WriteFile(group, []byte("root:x:0:\nnether:x:1000:\nusers:x:100:nether,other\naudio:x:29:other\nvideo:x:44:nether\n"), 0o644)
	return passwd, group
}

// The policy narrows root to a user once, keeps a user's policy for an
// empty or equal request, and refuses every widening or change.
func TestRunAsNarrow(t *testing.T) {
	passwd, group := writeAccounts(t)
	for _, tc := range []struct {
		name     string
		start    string // "" = root
		ask      string
		want     string // the policy after; "" = root
		errMatch string
	}{
		{"root keeps root", "", "", "", ""},
		{"root asked root", "", "root", "", ""},
		{"root narrows to a user", "", "nether", "nether", ""},
		{"user inherits", "nether", "", "nether", ""},
		{"user asked itself", "nether", "nether", "nether", ""},
		{"user widened to root", "nether", "root", "nether", "never widen"},
		{"user changed to another", "nether", "other", "nether", "never widen or change"},
		{"unknown user", "", "bob", "", "no such user"},
		{"a second uid 0", "", "toor", "", "has uid 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &runAsPolicy{}
			if tc.start != "" {
				if err := p.narrow(tc.start, passwd, group); err != nil {
					t.Fatal(err)
				}
			}
			err := p.narrow(tc.ask, passwd, group)
			if tc.errMatch == "" && err != nil || tc.errMatch != "" && (err == nil || !strings.Contains(err.Error(), tc.errMatch)) {
				t.Fatalf("narrow(%q) = %v, want an error with %q", tc.ask, err, tc.errMatch)
			}
			got := ""
			if u := p.get(); u != nil {
				got = u.name
			}
			if got != tc.want {
				t.Fatalf("policy is %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSupplementaryGroups(t *testing.T) {
	_, group := writeAccounts(t)
	got, err := supplementaryGroups(group, "nether", 1000)
	if err != nil || !reflect.DeepEqual(got, []uint32{100, 44}) {
		t.Fatalf("groups of nether: %v %v", got, err)
	}
	if got, err := supplementaryGroups(filepath.Join(t.TempDir(), "none"), "nether", 1000); err != nil || got != nil {
		t.Fatalf("no group file: %v %v", got, err)
	}
}

// A command as a user starts with the user's credentials, home and
// environment; as root, with root's.
func TestCommandAttr(t *testing.T) {
	home := t.TempDir()
	u := &account{name: "nether", uid: 1000, gid: 1000, groups: []uint32{100}, home: home}
	a := commandAttr(u, nil)
	if c := a.Sys.Credential; c == nil || c.Uid != 1000 || c.Gid != 1000 || !reflect.DeepEqual(c.Groups, []uint32{100}) {
		t.Fatalf("credential %+v", a.Sys.Credential)
	}
	env := strings.Join(a.Env, "\n")
	for _, want := range []string{"HOME=" + home, "USER=nether", "LOGNAME=nether", "LANG=C.UTF-8", "PATH=/usr/local/sbin"} {
		if !strings.Contains(env, want) {
			t.Errorf("environment lacks %q:\n%s", want, env)
		}
	}
	if a.Dir != home || !a.Sys.Setsid {
		t.Errorf("dir %q setsid %v", a.Dir, a.Sys.Setsid)
	}
	u.home = "/nonexistent"
	if a := commandAttr(u, nil); a.Dir != "/" {
		t.Errorf("a missing home starts in %q, want /", a.Dir)
	}
	if a := commandAttr(nil, nil); a.Sys.Credential != nil || a.Dir != "/root" || !strings.Contains(strings.Join(a.Env, " "), "USER=root") {
		t.Errorf("root's command: %+v", a)
	}
}

// asUser resolves names with the user's permissions (a root-only
// directory is closed to it), creates files the user owns, and leaves the
// calling thread's credentials alone.
func TestAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: changing file-system credentials needs root")
	}
	// Not t.TempDir: its parent is root's alone, and the user must
	// reach the directories inside.
	dir, err := os.MkdirTemp("", "nether-asuser-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	private := filepath.Join(dir, "private")
	os.Mkdir(private, 0o700)
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777) // past the umask
	u := &account{name: "nobody", uid: 65534, gid: 65534}

	err = asUser(u, func() error {
		_, err := os.Create(filepath.Join(private, "f"))
		return err
	})
	if !errors.Is(err, os.ErrPermission) {
		t.Fatalf("creating in a root-only directory as nobody: %v, want permission denied", err)
	}
	var created string
	if err := asUser(u, func() error {
		f, err := os.CreateTemp(open, "f-")
		if err == nil {
			created = f.Name()
			f.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(created)
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 65534 || sys.Gid != 65534 {
		t.Fatalf("file created as nobody belongs to %d:%d", sys.Uid, sys.Gid)
	}
	// This goroutine's thread never changed: root still writes here.
	if err := os.WriteFile(filepath.Join(private, "g"), nil, 0o600); err != nil {
		t.Fatalf("root after asUser: %v", err)
	}
}
