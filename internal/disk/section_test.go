package disk

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// A wake trusts the park's stamp of its disk only while the stamp is
// exactly the file's; any change moves the ctime and brings back the full
// comparison of checksums, which refuses what changed and accepts what
// did not. validate_snapshot never trusts the stamp.
func TestParkedDiskStamp(t *testing.T) {
	ctx := context.Background()
	newDisk := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "disk.img")
		b := make([]byte, 3*snapshot.ChunkSize)
		for i := range b {
			b[i] = byte(i * 7)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	park := func(t *testing.T, p string) Section {
		t.Helper()
		sec, err := Parked(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if sec.Stamp == nil {
			t.Fatal("the park recorded no stamp of an untouched disk")
		}
		return sec
	}
	// Past the coarse clock's tick of the park's stamp.
	later := func() { time.Sleep(60 * time.Millisecond) }

	t.Run("an untouched disk is known by its stamp", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		// Checksums that no longer match would refuse a full comparison:
		// passing says the stamp was trusted.
		sec.Chunks[1] ^= 1
		stamped, err := CheckLive(ctx, sec, true)
		if err != nil || !stamped {
			t.Fatalf("stamped=%v err=%v, want the stamp trusted", stamped, err)
		}
		if _, err := CheckLive(ctx, sec, false); err == nil || !strings.Contains(err.Error(), "chunk 1") {
			t.Fatalf("validate_snapshot's full comparison: %v, want chunk 1 named", err)
		}
	})

	t.Run("a touched but unchanged disk is compared in full and accepted", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		later()
		if err := os.Chmod(p, 0o640); err != nil {
			t.Fatal(err)
		}
		stamped, err := CheckLive(ctx, sec, true)
		if err != nil || stamped {
			t.Fatalf("stamped=%v err=%v, want a full comparison that passes", stamped, err)
		}
	})

	t.Run("a changed disk is refused even with its mtime set back", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		later()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff}, 2*snapshot.ChunkSize+5); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckLive(ctx, sec, true); err == nil || !strings.Contains(err.Error(), "chunk 2") {
			t.Fatalf("err = %v, want chunk 2 named", err)
		}
	})

	t.Run("a disk written just before the park is stamped clear of the tick", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		if time.Now().Before(sec.Stamp.ClearAt()) {
			t.Fatalf("the stamp was taken %s after the disk's ctime, before it was clear of its tick", time.Since(time.Unix(0, sec.Stamp.CtimeNS)))
		}
	})

	t.Run("a park from before stamps is compared in full", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		sec.Stamp = nil
		if stamped, err := CheckLive(ctx, sec, true); err != nil || stamped {
			t.Fatalf("stamped=%v err=%v", stamped, err)
		}
	})
}

// The disk section refuses what it cannot mean.
func TestDecodeSection(t *testing.T) {
	for _, tc := range []struct{ name, data, err string }{
		{"empty", `{}`, ""},
		{"layer", `{"layer":true}`, ""},
		{"live", `{"live":"/d.img","size":1048576,"chunks":[1]}`, ""},
		{"both", `{"layer":true,"live":"/d.img","size":1,"chunks":[1]}`, "both"},
		{"relative live", `{"live":"d.img","size":1,"chunks":[1]}`, "malformed"},
		{"chunks short", `{"live":"/d.img","size":3145728,"chunks":[1]}`, "malformed"},
		{"not json", `[`, "disk section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSection(json.RawMessage(tc.data))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

// The section's name, version and bytes are part of the artifact format:
// artifacts written before must restore, and these are what they hold.
func TestSectionFormat(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, make([]byte, snapshot.ChunkSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	stamp := snapshot.FileStamp{}
	for _, tc := range []struct {
		name string
		path string
		kind snapshot.Kind
		want string // "" = a park's live disk, checked below
	}{
		{"no disk", "", snapshot.KindBase, `{}`},
		{"no disk, park", "", snapshot.KindPark, `{}`},
		{"base", p, snapshot.KindBase, `{"layer":true}`},
		{"park", p, snapshot.KindPark, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewComponent(tc.path)
			if c.Name() != "disk" || c.Version() != 1 || c.Required() {
				t.Fatalf("section %q version %d required %v, want disk 1 false", c.Name(), c.Version(), c.Required())
			}
			b, err := c.Save(tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" {
				if string(b) != tc.want {
					t.Fatalf("%s, want %s", b, tc.want)
				}
				return
			}
			sec, err := DecodeSection(b)
			if err != nil || sec.Live != p || sec.Size != snapshot.ChunkSize+1 || len(sec.Chunks) != 2 {
				t.Fatalf("park section %s (%v)", b, err)
			}
		})
	}
	b, _ := json.Marshal(Section{Live: "/d", Size: 5, Chunks: []uint32{7}, Stamp: &stamp})
	if want := `{"live":"/d","size":5,"chunks":[7],"stamp":{"dev":0,"ino":0,"size":0,"mtime_ns":0,"ctime_ns":0}}`; string(b) != want {
		t.Fatalf("%s, want %s", b, want)
	}
}
