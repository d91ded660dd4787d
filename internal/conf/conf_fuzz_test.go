package conf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that no input panics Parse, that every failure is a
// located *Error, and that every accepted file survives a Format round trip.
func FuzzParse(f *testing.F) {
	// Seeds beyond testdata/fuzz/FuzzParse: one line per key, so the fuzzer
	// starts from every value parser.
	for _, s := range []string{
		"control_socket = ctl.sock",
		"cpus = 2\nram_mb = 1024",
		"max_output_bytes = 0",
		"x402 = on # bill",
		"accel = kvm",
		"kernel = vmlinuz\nimage = initramfs",
		"restore = 1\nrestore_from = /s/base.snap\nfork_reseed = 0",
		"validate_snapshot = s.snap\nsnapshot_allow_dirty = yes\npark_dirty = no",
		"sandbox_id = sb-1\nhostname = box-1",
	} {
		f.Add([]byte(s))
	}
	// A fixed launch directory with the files the seeds name, so kernel and
	// image values can succeed and be round-tripped too.
	dir := f.TempDir()
	for _, name := range []string{"vmlinuz", "initramfs"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(strings.NewReader(string(data)), "nether.conf", dir)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is %T, want *Error", err, err)
			}
			if ce.File != "nether.conf" || ce.Line < 0 {
				t.Fatalf("badly located error %+v", ce)
			}
			return
		}
		text := c.Format()
		back, err := Parse(strings.NewReader(text), "nether.conf", dir)
		if err != nil {
			t.Fatalf("Format output does not parse: %v\ninput: %q\nformat:\n%s", err, data, text)
		}
		if !sameConfig(c, back) {
			t.Fatalf("round trip changed config\ninput: %q\nformat:\n%s\n got %+v\nwant %+v", data, text, back, c)
		}
		// Format is canonical: formatting the re-parsed config is a fixed point.
		if again := back.Format(); again != text {
			t.Fatalf("Format not stable:\n%s\nvs\n%s", text, again)
		}
		// Report must cover every key exactly once.
		if n := len(c.Report()); n != len(fields) {
			t.Fatalf("Report has %d lines, want %d", n, len(fields))
		}
	})
}
