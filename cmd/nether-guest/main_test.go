package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootfsRefusesBadArguments: a bad flag fails before anything is built
// or created, naming the problem.
func TestRootfsRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown format", []string{"--format", "zfs"}, `unknown root image format "zfs"`},
		{"bad package", []string{"--packages", "jq,--yes"}, `package "--yes" is not a Debian package name`},
		{"stray argument", []string{"bookworm"}, "unexpected arguments"},
		{"unknown flag", []string{"--suite", "trixie"}, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cache, out := filepath.Join(dir, "cache"), filepath.Join(dir, "out")
			args := append([]string{"--cache", cache, "--out", out}, tc.args...)
			var stdout, stderr bytes.Buffer
			err := rootfs(context.Background(), args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			for _, p := range []string{cache, out} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s was created (%v)", p, err)
				}
			}
		})
	}
}
