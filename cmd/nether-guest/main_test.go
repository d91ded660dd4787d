package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
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

// TestImportRefusesBadArguments: import needs exactly one source and an
// --out, and fails before anything is read or created.
func TestImportRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no source", []string{}, "give exactly one of --tar, --oci-layout, --docker-archive and --image"},
		{"two sources", []string{"--tar", "a.tar", "--image", "debian:12"}, "give exactly one of"},
		{"no out", []string{"--tar", "a.tar", "--out", ""}, "--out is required"},
		{"unknown format", []string{"--tar", "a.tar", "--format", "zfs"}, `unknown root image format "zfs"`},
		{"stray argument", []string{"--tar", "a.tar", "extra"}, "unexpected arguments"},
		{"missing tarball", []string{"--tar", "/nonexistent/a.tar"}, "no such file or directory"},
		{"bad max size", []string{"--tar", "a.tar", "--max-size", "lots"}, `size "lots" is not a positive number`},
		{"zero max size", []string{"--tar", "a.tar", "--max-size", "0"}, `size "0" is not a positive number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			args := append([]string{"--out", out}, tc.args...)
			var stdout, stderr bytes.Buffer
			err := importImage(context.Background(), args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("%s holds %v", dir, ents)
			}
		})
	}
}

// TestParseSize: --max-size takes bytes or binary K, M, G, T.
func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64 // 0: an error
	}{
		{"4096", 4096}, {"8G", 8 << 30}, {"8GiB", 8 << 30}, {"8gb", 8 << 30}, {"512M", 512 << 20},
		{"1.5G", 3 << 29}, {"2T", 2 << 40}, {"1K", 1024}, {"100B", 100},
		{"", 0}, {"G", 0}, {"-1G", 0}, {"0", 0}, {"8X", 0}, {"NaN", 0}, {"1e30", 0}, {"8GG", 0},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSize(tc.in)
			if tc.want == 0 {
				if err == nil {
					t.Fatalf("parseSize(%q) = %d, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestImportHelp: -h describes the sources and the errors.
func TestImportHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := importImage(context.Background(), []string{"-h"}, &stdout, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"--tar FILE", "--oci-layout DIR", "--docker-archive FILE", "--image REF", "rootfs = DIR/rootfs.img", "-format", "-max-size", "digest"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestOutRequired: build and rootfs write only where --out says; run
// without it inside a checkout they used to replace its build/guest.
func TestOutRequired(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for name, run := range map[string]func() error{
		"build": func() error {
			return build(context.Background(), []string{"--agent", "/bin/true"}, io.Discard, io.Discard)
		},
		"rootfs": func() error {
			return rootfs(context.Background(), []string{"--cache", filepath.Join(dir, "cache")}, io.Discard, io.Discard)
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := run(); err == nil || !strings.Contains(err.Error(), "--out is required") {
				t.Fatalf("without --out: %v, want --out is required", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "build")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("build/ was made in the working directory (%v)", err)
			}
		})
	}
}
