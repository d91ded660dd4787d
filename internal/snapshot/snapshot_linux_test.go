//go:build linux

package snapshot

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const testRAMSize = 64 << 20

// ramExtents are the scattered data runs of the test RAM: whole chunks,
// a run straddling a chunk boundary, and the tail of the file.
var ramExtents = []struct{ off, len int64 }{
	{5 << 20, 3 << 20},               // chunks 5-7
	{17<<20 + 512<<10, 1 << 20},      // chunks 17-18, straddling
	{testRAMSize - 64<<10, 64 << 10}, // last chunk, 63
}

var testFingerprint = Fingerprint{
	Engine:        "qemu",
	EngineVersion: "7.2.22",
	Machine:       "pc-i440fx-7.2",
	Accel:         "tcg",
	KernelSHA256:  strings.Repeat("ab", 32),
	ImageSHA256:   strings.Repeat("cd", 32),
	CPUs:          1,
	RAMMB:         64,
}

func testMeta(kind Kind, mode RAMMode) *Meta {
	return &Meta{
		Kind:        kind,
		Created:     time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		Fingerprint: testFingerprint,
		RAMMode:     mode,
		Identity:    Identity{SandboxID: "sb-1", Generation: 1, Hostname: "box", TrustClass: "tenant"},
		PauseMS:     42,
		Sections: map[string]Section{
			SectionEngine: {Version: 1, Data: json.RawMessage(`{"ram":"file","vmgenid":"6e4f1c55-2a8b-4b1e-9d3e-0f6b7c1a2d3e"}`)},
			"channel":     {Version: 1, Data: json.RawMessage(`{"next_stream":3,"conns":[]}`)},
		},
	}
}

func randBytes(t testing.TB, n int64) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func openDir(t testing.TB, dir string) *os.File {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// writeSparseRAM fills f as a 64 MiB sparse RAM image.
func writeSparseRAM(t testing.TB, f *os.File) {
	t.Helper()
	if err := f.Truncate(testRAMSize); err != nil {
		t.Fatal(err)
	}
	for _, e := range ramExtents {
		if _, err := f.WriteAt(randBytes(t, e.len), e.off); err != nil {
			t.Fatal(err)
		}
	}
}

// makeArtifact commits an artifact named name in dir and returns its path.
func makeArtifact(t testing.TB, dir, name string, kind Kind, mode RAMMode) string {
	t.Helper()
	w, err := Create(openDir(t, dir), name)
	if err != nil {
		t.Fatal(err)
	}
	if mode == RAMFile {
		ram, err := w.CreateFile("ram")
		if err != nil {
			t.Fatal(err)
		}
		writeSparseRAM(t, ram)
		ram.Close()
	}
	st, err := w.CreateFile("state")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(randBytes(t, 100<<10)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := w.Commit(testMeta(kind, mode)); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestRoundTrip(t *testing.T) {
	for _, mode := range []RAMMode{RAMFile, RAMStream} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			path := makeArtifact(t, dir, "base", KindBase, mode)
			if got := entries(t, dir); len(got) != 1 || got[0] != "base" {
				t.Fatalf("parent holds %v, want just [base] (no partial left behind)", got)
			}
			a, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Verify(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := a.Match(testFingerprint); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("snapshot %s: ok kind=base format=2 engine=qemu 7.2.22 machine=pc-i440fx-7.2 accel=tcg cpus=1 ram_mb=64 gpu=0 net=0 ram=%s generation=1 created=2026-03-01T12:00:00Z", path, mode)
			if got := a.Summary(); got != want {
				t.Errorf("Summary:\n got %s\nwant %s", got, want)
			}
			if a.Meta.Identity.Hostname != "box" || string(a.Meta.Sections["channel"].Data) != `{"next_stream":3,"conns":[]}` {
				t.Errorf("metadata did not round-trip: %+v", a.Meta)
			}
			checkModes(t, path)
			if mode == RAMFile {
				checkChunks(t, filepath.Join(path, "ram"), a.Meta.Files["ram"].Chunks)
			}
		})
	}
}

func checkModes(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	for _, name := range entries(t, path) {
		fi, err := os.Lstat(filepath.Join(path, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o600 {
			t.Errorf("%s mode %v, want regular 0600", name, fi.Mode())
		}
	}
}

// checkChunks recomputes the chunk CRCs the slow, obvious way.
func checkChunks(t *testing.T, ram string, got []uint32) {
	t.Helper()
	b, err := os.ReadFile(ram)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != (len(b)+ChunkSize-1)/ChunkSize {
		t.Fatalf("%d chunks for %d bytes", len(got), len(b))
	}
	for i := range got {
		end := min((i+1)*ChunkSize, len(b))
		if want := crc32.Checksum(b[i*ChunkSize:end], crc32c); got[i] != want {
			t.Errorf("chunk %d crc %08x, want %08x", i, got[i], want)
		}
	}
}

func TestZeroChunkCRC(t *testing.T) {
	if got, want := ZeroChunkCRC(), crc32.Checksum(make([]byte, ChunkSize), crc32.MakeTable(crc32.Castagnoli)); got != want {
		t.Fatalf("ZeroChunkCRC %08x, want %08x", got, want)
	}
}

// TestDataChunks checks that hole chunks are recognised as holes, i.e.
// never read. A mismatch fails: the files are made on tmpfs (/dev/shm)
// when the machine has one, because tmpfs reports holes page by page
// wherever TMPDIR points, so a wrong answer there is a dataChunks bug, not
// a filesystem that reports holes coarsely.
func TestDataChunks(t *testing.T) {
	dir, fsType := holeExactDir(t)
	type extent struct{ off, len int64 }
	tests := []struct {
		name    string
		size    int64
		extents []extent
		want    []int // chunks holding data
	}{
		{"scattered runs", testRAMSize, func() []extent {
			var es []extent
			for _, e := range ramExtents {
				es = append(es, extent{e.off, e.len})
			}
			return es
		}(), []int{5, 6, 7, 17, 18, 63}},
		{"all hole", 8 << 20, nil, nil},
		{"all data", 3 << 20, []extent{{0, 3 << 20}}, []int{0, 1, 2}},
		{"two bytes across a chunk boundary", 4 << 20, []extent{{2<<20 - 1, 2}}, []int{1, 2}},
		{"one page inside a chunk", 8 << 20, []extent{{4<<20 + 8<<10, 4 << 10}}, []int{4}},
		{"data in a short last chunk", 2<<20 + 4096, []extent{{2 << 20, 4096}}, []int{2}},
		{"hole in a short last chunk", 2<<20 + 4096, []extent{{0, 4096}}, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := os.CreateTemp(dir, "ram-")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(tt.size); err != nil {
				t.Fatal(err)
			}
			for _, e := range tt.extents {
				if _, err := f.WriteAt(randBytes(t, e.len), e.off); err != nil {
					t.Fatal(err)
				}
			}
			data, err := dataChunks(f, tt.size)
			if err != nil {
				t.Fatal(err)
			}
			if n := chunkCount(tt.size); int64(len(data)) != n {
				t.Fatalf("%d chunk flags for %d bytes, want %d", len(data), tt.size, n)
			}
			var got []int
			for i, d := range data {
				if d {
					got = append(got, i)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("data chunks %v, want %v (file in %s, %s)", got, tt.want, dir, fsType)
			}
		})
	}
	t.Run("hole chunk CRCs", func(t *testing.T) {
		// A short last chunk in a hole has the CRC of its own length of zeros.
		g, err := os.Create(filepath.Join(dir, "short"))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if err := g.Truncate(ChunkSize + 4096); err != nil {
			t.Fatal(err)
		}
		crcs, err := ramChunkCRCs(context.Background(), g, ChunkSize+4096)
		if err != nil {
			t.Fatal(err)
		}
		if len(crcs) != 2 || crcs[0] != ZeroChunkCRC() || crcs[1] != crc32.Checksum(make([]byte, 4096), crc32c) {
			t.Fatalf("hole chunk crcs %08x", crcs)
		}
	})
}

// holeExactDir returns a fresh directory for files whose holes must be
// reported exactly, and a description of its filesystem for failure
// messages: a directory on the tmpfs at /dev/shm when there is one
// (tmpfs reports holes per page unless huge pages are forced on shmem),
// else t.TempDir(), whose filesystem may or may not be exact.
func holeExactDir(t *testing.T) (string, string) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		dir, err := os.MkdirTemp("/dev/shm", "snapshot-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir, "tmpfs"
		}
		t.Logf("cannot use tmpfs /dev/shm (%v); the sparse file goes to the test's temporary directory", err)
	}
	dir := t.TempDir()
	if err := unix.Statfs(dir, &st); err != nil {
		return dir, fmt.Sprintf("filesystem unknown: %v", err)
	}
	return dir, fmt.Sprintf("filesystem magic %#x, not tmpfs", st.Type)
}

// rewriteMeta edits meta.json as generic JSON and re-signs the marker, to
// build artifacts that are consistent but semantically wrong.
func rewriteMeta(t *testing.T, path string, edit func(m map[string]any)) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(path, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	raw, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(path, "meta.json"), raw)
	writeFile(t, filepath.Join(path, "COMMITTED"), []byte(markerLine(sha256.Sum256(raw))))
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func TestOpenAndVerifyFailures(t *testing.T) {
	tests := []struct {
		name       string
		mode       RAMMode
		damage     func(t *testing.T, path string)
		wantOpen   string // substring of Open's error; "" means Open succeeds
		wantVerify string // substring of Verify's error, when Open succeeds
		wantIs     error
	}{
		{
			name:     "uncommitted",
			damage:   func(t *testing.T, p string) { os.Remove(filepath.Join(p, "COMMITTED")) },
			wantOpen: "not committed (no COMMITTED marker: the capture did not finish)",
			wantIs:   ErrNotCommitted,
		},
		{
			name: "meta edited",
			damage: func(t *testing.T, p string) {
				raw, _ := os.ReadFile(filepath.Join(p, "meta.json"))
				writeFile(t, filepath.Join(p, "meta.json"), bytes.Replace(raw, []byte(`"box"`), []byte(`"evil"`), 1))
			},
			wantOpen: "meta.json does not match the COMMITTED marker",
			wantIs:   ErrCorrupt,
		},
		{
			name:     "malformed marker",
			damage:   func(t *testing.T, p string) { writeFile(t, filepath.Join(p, "COMMITTED"), []byte("done\n")) },
			wantOpen: "COMMITTED marker is malformed",
			wantIs:   ErrCorrupt,
		},
		{
			name: "marker from a newer format",
			damage: func(t *testing.T, p string) {
				writeFile(t, filepath.Join(p, "COMMITTED"), []byte("nether-snapshot v7 whatever=1\n"))
			},
			wantOpen: "format version 7, this nether reads 2",
			wantIs:   ErrIncompatible,
		},
		{
			name:     "truncated ram",
			damage:   func(t *testing.T, p string) { truncate(t, filepath.Join(p, "ram"), 1<<20) },
			wantOpen: "ram is 1048576 bytes, metadata says 67108864 (truncated?)",
			wantIs:   ErrCorrupt,
		},
		{
			name:     "extended ram",
			damage:   func(t *testing.T, p string) { truncate(t, filepath.Join(p, "ram"), testRAMSize+4096) },
			wantOpen: "ram is 67112960 bytes, metadata says 67108864 (extended after commit?)",
			wantIs:   ErrCorrupt,
		},
		{
			name:       "bit flip in a data chunk of ram",
			damage:     func(t *testing.T, p string) { flipByte(t, filepath.Join(p, "ram"), 17<<20+700<<10) },
			wantVerify: "ram chunk 17 (offset 17825792) does not match its checksum (corrupted)",
			wantIs:     ErrCorrupt,
		},
		{
			name: "data written into a hole chunk of ram",
			damage: func(t *testing.T, p string) {
				f, err := os.OpenFile(filepath.Join(p, "ram"), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				f.WriteAt([]byte{1}, 40<<20+123)
			},
			wantVerify: "ram chunk 40 (offset 41943040) does not match its checksum (corrupted)",
			wantIs:     ErrCorrupt,
		},
		{
			name:       "bit flip in state",
			damage:     func(t *testing.T, p string) { flipByte(t, filepath.Join(p, "state"), 5000) },
			wantVerify: "state does not match its sha256 (corrupted)",
			wantIs:     ErrCorrupt,
		},
		{
			name:     "missing state",
			damage:   func(t *testing.T, p string) { os.Remove(filepath.Join(p, "state")) },
			wantOpen: "state is missing",
			wantIs:   ErrCorrupt,
		},
		{
			name: "symlink instead of ram",
			damage: func(t *testing.T, p string) {
				ram := filepath.Join(p, "ram")
				other := filepath.Join(t.TempDir(), "ram")
				if err := os.Rename(ram, other); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(other, ram); err != nil {
					t.Fatal(err)
				}
			},
			wantOpen: "ram is a symlink, not a regular file",
			wantIs:   ErrCorrupt,
		},
		{
			name:     "unknown kind",
			damage:   func(t *testing.T, p string) { rewriteMeta(t, p, func(m map[string]any) { m["kind"] = "weird" }) },
			wantOpen: `unknown kind "weird"`,
			wantIs:   ErrInvalid,
		},
		{
			name: "wrong format version",
			damage: func(t *testing.T, p string) {
				rewriteMeta(t, p, func(m map[string]any) { m["format"] = 7; m["future"] = true })
			},
			wantOpen: "format version 7, this nether reads 2",
			wantIs:   ErrIncompatible,
		},
		{
			name:     "unknown metadata field",
			damage:   func(t *testing.T, p string) { rewriteMeta(t, p, func(m map[string]any) { m["surprise"] = 1 }) },
			wantOpen: "meta.json is not valid metadata",
			wantIs:   ErrCorrupt,
		},
		{
			name:     "unknown ram mode",
			damage:   func(t *testing.T, p string) { rewriteMeta(t, p, func(m map[string]any) { m["ram_mode"] = "cloud" }) },
			wantOpen: `unknown ram_mode "cloud"`,
			wantIs:   ErrInvalid,
		},
		{
			name:     "ram present in stream mode",
			damage:   func(t *testing.T, p string) { rewriteMeta(t, p, func(m map[string]any) { m["ram_mode"] = "stream" }) },
			wantOpen: "ram_mode is stream but metadata lists a ram file",
			wantIs:   ErrInvalid,
		},
		{
			name: "ram listed but absent",
			mode: RAMStream,
			damage: func(t *testing.T, p string) {
				rewriteMeta(t, p, func(m map[string]any) {
					m["ram_mode"] = "file"
					m["files"].(map[string]any)["ram"] = map[string]any{"size": ChunkSize, "chunks": []uint32{1}}
				})
			},
			wantOpen: "ram is missing",
			wantIs:   ErrCorrupt,
		},
		{
			name: "chunk count does not match size",
			damage: func(t *testing.T, p string) {
				rewriteMeta(t, p, func(m map[string]any) {
					ram := m["files"].(map[string]any)["ram"].(map[string]any)
					ram["chunks"] = ram["chunks"].([]any)[:10]
				})
			},
			wantOpen: "metadata has 10 ram chunk checksums for 67108864 bytes, want 64",
			wantIs:   ErrInvalid,
		},
		{
			name: "empty section",
			damage: func(t *testing.T, p string) {
				rewriteMeta(t, p, func(m map[string]any) { m["sections"].(map[string]any)["channel"] = map[string]any{"version": 1} })
			},
			wantOpen: `section "channel" is empty`,
			wantIs:   ErrInvalid,
		},
		{
			name:     "extra file",
			damage:   func(t *testing.T, p string) { writeFile(t, filepath.Join(p, "notes.txt"), []byte("hi")) },
			wantOpen: `unexpected file "notes.txt"`,
			wantIs:   ErrCorrupt,
		},
		{
			name:     "directory removed",
			damage:   func(t *testing.T, p string) { os.RemoveAll(p) },
			wantOpen: "no such snapshot",
			wantIs:   ErrNotExist,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mode := tt.mode
			if mode == "" {
				mode = RAMFile
			}
			path := makeArtifact(t, t.TempDir(), "base", KindBase, mode)
			tt.damage(t, path)
			a, err := Open(path)
			if tt.wantOpen != "" {
				wantErr(t, "Open", err, "snapshot "+path+": ", tt.wantOpen, tt.wantIs)
				return
			}
			if err != nil {
				t.Fatalf("Open: %v (contents are only checked by Verify)", err)
			}
			err = a.Verify(context.Background())
			wantErr(t, "Verify", err, "snapshot "+path+": ", tt.wantVerify, tt.wantIs)
		})
	}
}

func wantErr(t *testing.T, op string, err error, prefix, want string, is error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want error containing %q", op, want)
	}
	if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s error:\n got %q\nwant %q...%q", op, err, prefix, want)
	}
	if is != nil && !errors.Is(err, is) {
		t.Errorf("%s error %q is not %v", op, err, is)
	}
}

func TestOpenPartialNeverValidates(t *testing.T) {
	w, err := Create(openDir(t, t.TempDir()), "base")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	f, _ := w.CreateFile("state")
	f.Close()
	if !strings.HasPrefix(filepath.Base(w.Dir()), ".base.partial-") {
		t.Errorf("partial directory %s is not a hidden .base.partial-*", w.Dir())
	}
	_, err = Open(w.Dir())
	wantErr(t, "Open", err, "snapshot "+w.Dir(), "not committed", ErrNotCommitted)
}

// TestOpenKilledBeforeRename: a capture killed after it wrote its marker
// but before the rename published it leaves a partial directory holding
// a whole artifact and its marker; it still never validates.
func TestOpenKilledBeforeRename(t *testing.T) {
	dir := t.TempDir()
	art := makeArtifact(t, dir, "big", KindPark, RAMFile)
	if _, err := Open(art); err != nil {
		t.Fatalf("the artifact itself: %v", err)
	}
	partial := filepath.Join(dir, ".big.partial-0123456789abcdef")
	if err := os.Rename(art, partial); err != nil {
		t.Fatal(err)
	}
	_, err := Open(partial)
	wantErr(t, "Open", err, "snapshot "+partial, "renamed into place", ErrNotCommitted)
	_, err = Open(partial + "/")
	wantErr(t, "Open", err, "", "renamed into place", ErrNotCommitted)
}

func TestAbort(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(openDir(t, dir), "base")
	if err != nil {
		t.Fatal(err)
	}
	ram, err := w.CreateFile("ram")
	if err != nil {
		t.Fatal(err)
	}
	writeSparseRAM(t, ram)
	ram.Close()
	for i := range 2 { // idempotent
		if err := w.Abort(); err != nil {
			t.Fatalf("Abort #%d: %v", i+1, err)
		}
	}
	if got := entries(t, dir); len(got) != 0 {
		t.Fatalf("after Abort the parent holds %v", got)
	}
	if _, err := w.CreateFile("state"); err == nil {
		t.Error("CreateFile after Abort succeeded")
	}
	if err := w.Commit(testMeta(KindBase, RAMFile)); err == nil {
		t.Error("Commit after Abort succeeded")
	}

	// Abort after a successful Commit leaves the artifact alone.
	path := makeArtifact(t, dir, "kept", KindBase, RAMStream)
	w2, err := Create(openDir(t, dir), "other")
	if err != nil {
		t.Fatal(err)
	}
	f, _ := w2.CreateFile("state")
	f.Close()
	if err := w2.Commit(testMeta(KindBase, RAMStream)); err != nil {
		t.Fatal(err)
	}
	if err := w2.Abort(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, filepath.Join(dir, "other")} {
		if _, err := Open(p); err != nil {
			t.Errorf("after Abort of a committed writer: %v", err)
		}
	}
}

func TestCommitFailureLeavesNothing(t *testing.T) {
	tests := []struct {
		name    string
		files   []string
		byPath  []string // files a tool creates by path under Dir()
		edit    func(m *Meta)
		prepare func(t *testing.T, dir string) // runs after Create
		want    string
		wantIs  error
	}{
		{name: "invalid section", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Sections["channel"] = Section{Version: 1, Data: json.RawMessage(`{"x":`)} }, want: `section "channel" is not valid JSON`, wantIs: ErrInvalid},
		{name: "empty section", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Sections["channel"] = Section{Version: 1} }, want: `section "channel" is empty`},
		{name: "section version zero", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Sections["net"] = Section{Data: json.RawMessage(`{}`)} }, want: `section "net" has version 0`},
		{name: "bad section name", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Sections["Net/1"] = Section{Version: 1, Data: json.RawMessage(`{}`)} }, want: `section name "Net/1"`},
		{name: "no engine section", files: []string{"ram", "state"}, edit: func(m *Meta) { delete(m.Sections, SectionEngine) }, want: "no engine section"},
		{name: "file mode without ram", files: []string{"state"}, want: "ram_mode is file but no ram file was written"},
		{name: "stream mode with ram", files: []string{"ram", "state"}, edit: func(m *Meta) { m.RAMMode = RAMStream }, want: "ram_mode is stream but a ram file was written"},
		{name: "no state", files: []string{"ram"}, want: "no state file was written"},
		{name: "unknown kind", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Kind = "weird" }, want: `unknown kind "weird"`},
		{name: "wrong format", files: []string{"ram", "state"}, edit: func(m *Meta) { m.Format = 1 }, want: "format version 1, this nether reads 2", wantIs: ErrIncompatible},
		{name: "stray file", files: []string{"ram", "state"}, byPath: []string{"core"}, want: `unexpected file "core"`},
		{name: "nil meta", files: []string{"state"}, edit: nil, want: "no metadata"},
		{
			name:  "name taken during capture",
			files: []string{"ram", "state"},
			prepare: func(t *testing.T, dir string) {
				os.Mkdir(filepath.Join(dir, "base"), 0o700)
				writeFile(t, filepath.Join(dir, "base", "x"), nil)
			},
			want:   `snapshot "base" already exists; remove it or choose another path`,
			wantIs: ErrExists,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := Create(openDir(t, dir), "base")
			if err != nil {
				t.Fatal(err)
			}
			if tt.prepare != nil {
				tt.prepare(t, dir)
			}
			for _, name := range tt.files {
				f, err := w.CreateFile(name)
				if err != nil {
					t.Fatal(err)
				}
				if name == "ram" {
					writeSparseRAM(t, f)
				} else {
					f.Write([]byte("state bytes"))
				}
				f.Close()
			}
			for _, name := range tt.byPath {
				writeFile(t, filepath.Join(w.Dir(), name), []byte("x"))
			}
			m := testMeta(KindBase, RAMFile)
			if tt.edit != nil {
				tt.edit(m)
			}
			if tt.name == "nil meta" {
				m = nil
			}
			err = w.Commit(m)
			wantErr(t, "Commit", err, `committing snapshot "base": `, tt.want, tt.wantIs)
			for _, name := range entries(t, dir) {
				if name != "base" || tt.prepare == nil {
					t.Errorf("after a failed Commit the parent holds %q", name)
				}
			}
			if err := w.Abort(); err != nil {
				t.Errorf("Abort after failed Commit: %v", err)
			}
		})
	}
}

func TestCreateRefuses(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "adir"), 0o700)
	writeFile(t, filepath.Join(dir, "afile"), nil)
	os.Symlink("/nonexistent", filepath.Join(dir, "dangling"))
	tests := []struct{ name, want string }{
		{"adir", `snapshot "adir" already exists; remove it or choose another path`},
		{"afile", `snapshot "afile" already exists; remove it or choose another path`},
		{"dangling", `snapshot "dangling" already exists; remove it or choose another path`},
		{"", "snapshot name is empty"},
		{".", `snapshot name "." is not a usable name`},
		{"..", `snapshot name ".." is not a usable name`},
		{"a/b", `snapshot name "a/b" contains '/'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := Create(openDir(t, dir), tt.name)
			if err == nil {
				w.Abort()
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %q, want %q", err, tt.want)
			}
		})
	}
	if got := entries(t, dir); len(got) != 3 {
		t.Errorf("refused Creates left %v", got)
	}
}

func TestCreateFileRestrictions(t *testing.T) {
	w, err := Create(openDir(t, t.TempDir()), "base")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	for _, name := range []string{"meta.json", "COMMITTED", "../x", "other"} {
		if f, err := w.CreateFile(name); err == nil {
			f.Close()
			t.Errorf("CreateFile(%q) succeeded", name)
		}
	}
	f, err := w.CreateFile("state")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := w.CreateFile("state"); err == nil {
		t.Error("second CreateFile(state) succeeded (must be O_EXCL)")
	}
}

func TestMatch(t *testing.T) {
	a := &Artifact{Dir: "/x/base", Meta: Meta{Fingerprint: testFingerprint}}
	tests := []struct {
		field string
		edit  func(fp *Fingerprint)
		want  string
	}{
		{"engine", func(fp *Fingerprint) { fp.Engine = "fc" }, "engine=qemu; this nether has engine=fc"},
		{"engine_version", func(fp *Fingerprint) { fp.EngineVersion = "8.0.0" }, "engine_version=7.2.22; this nether has engine_version=8.0.0"},
		{"machine", func(fp *Fingerprint) { fp.Machine = "q35" }, "machine=pc-i440fx-7.2; this nether has machine=q35"},
		{"accel", func(fp *Fingerprint) { fp.Accel = "kvm" }, "accel=tcg; this nether has accel=kvm"},
		{"kernel_sha256", func(fp *Fingerprint) { fp.KernelSHA256 = "00" }, "kernel_sha256=" + testFingerprint.KernelSHA256 + "; this nether has kernel_sha256=00"},
		{"image_sha256", func(fp *Fingerprint) { fp.ImageSHA256 = "11" }, "image_sha256=" + testFingerprint.ImageSHA256 + "; this nether has image_sha256=11"},
		{"cpus", func(fp *Fingerprint) { fp.CPUs = 2 }, "cpus=1; this nether has cpus=2"},
		{"ram_mb", func(fp *Fingerprint) { fp.RAMMB = 512 }, "ram_mb=64; this nether has ram_mb=512"},
		{"gpu", func(fp *Fingerprint) { fp.GPU = true }, "gpu=0; this nether has gpu=1"},
		// gpu = 1 boots another kernel image: the setting, which the user
		// can change, is named rather than the kernel's digest.
		{"net", func(fp *Fingerprint) { fp.Net = true }, "net=0; this nether has net=1"},
		{"gpu before kernel", func(fp *Fingerprint) { fp.GPU, fp.KernelSHA256 = true, "00" }, "gpu=0; this nether has gpu=1"},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			fp := testFingerprint
			tt.edit(&fp)
			err := a.Match(fp)
			if want := "snapshot /x/base was taken with " + tt.want; err == nil || err.Error() != want {
				t.Fatalf("got %v\nwant %s", err, want)
			}
			if !errors.Is(err, ErrIncompatible) {
				t.Errorf("%v is not ErrIncompatible", err)
			}
		})
	}
}

func TestClaim(t *testing.T) {
	dir := t.TempDir()

	t.Run("base cannot be claimed", func(t *testing.T) {
		a, err := Open(makeArtifact(t, dir, "base", KindBase, RAMStream))
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Claim()
		wantErr(t, "Claim", err, "snapshot "+a.Dir, "kind=base cannot be claimed", ErrNotPark)
		if _, err := Open(a.Dir); err != nil {
			t.Errorf("a refused claim damaged the base: %v", err)
		}
	})

	t.Run("concurrent goroutines", func(t *testing.T) {
		path := makeArtifact(t, dir, "park1", KindPark, RAMFile)
		const n = 16
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			mu     sync.Mutex
			claims []*Claim
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := Open(path)
				<-start
				if err != nil {
					return // opened after the winner claimed: also a loss
				}
				c, err := a.Claim()
				if err != nil {
					if !errors.Is(err, ErrWoken) {
						t.Errorf("losing claim: %v (want ErrWoken)", err)
					}
					return
				}
				mu.Lock()
				claims = append(claims, c)
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		if len(claims) != 1 {
			t.Fatalf("%d claimers won, want exactly 1", len(claims))
		}
		_, err := Open(path)
		wantErr(t, "Open", err, "snapshot "+path, "already woken", ErrWoken)

		// A failed wake releases; the park can be claimed again.
		if err := claims[0].Release(); err != nil {
			t.Fatal(err)
		}
		if err := claims[0].Release(); err == nil {
			t.Error("second Release succeeded")
		}
		a, err := Open(path)
		if err != nil {
			t.Fatalf("Open after Release: %v", err)
		}
		if err := a.Verify(context.Background()); err != nil {
			t.Fatal(err)
		}
		c, err := a.Claim()
		if err != nil {
			t.Fatalf("Claim after Release: %v", err)
		}
		if _, err := a.Claim(); !errors.Is(err, ErrWoken) {
			t.Errorf("second Claim: %v, want ErrWoken", err)
		}
		if err := c.Consume(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Consume %s still exists (%v)", path, err)
		}
		_, err = Open(path)
		wantErr(t, "Open", err, "snapshot "+path, "no such snapshot (missing, or a park already consumed by its wake)", ErrNotExist)
		if err := c.Consume(); err == nil {
			t.Error("second Consume succeeded")
		}
		if _, err := a.Claim(); !errors.Is(err, ErrWoken) {
			t.Errorf("Claim after Consume: %v, want ErrWoken", err)
		}
	})

	t.Run("consume keeps a mapped ram alive", func(t *testing.T) {
		path := makeArtifact(t, dir, "park2", KindPark, RAMFile)
		a, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := a.Claim()
		if err != nil {
			t.Fatal(err)
		}
		ram, err := os.Open(filepath.Join(path, "ram")) // stands in for the restore's mapping
		if err != nil {
			t.Fatal(err)
		}
		defer ram.Close()
		if err := c.Consume(); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 16)
		if _, err := ram.ReadAt(b, 5<<20); err != nil || bytes.Equal(b, make([]byte, 16)) {
			t.Errorf("ram unreadable after Consume: %v %x", err, b)
		}
	})
}

const claimEnv = "NETHER_SNAPSHOT_TEST_CLAIM"

// TestClaimHelperProcess is a child of TestClaimProcesses, not a test.
func TestClaimHelperProcess(t *testing.T) {
	spec := os.Getenv(claimEnv)
	if spec == "" {
		t.Skip("helper process for TestClaimProcesses")
	}
	path, gate, _ := strings.Cut(spec, "|")
	a, err := Open(path)
	if err != nil {
		fmt.Printf("RESULT open-failed %v\n", err)
		os.Exit(0)
	}
	writeFile(t, gate+"."+fmt.Sprint(os.Getpid()), nil)
	for {
		if _, err := os.Stat(gate); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := a.Claim(); err != nil {
		fmt.Printf("RESULT lost %v\n", err)
	} else {
		fmt.Printf("RESULT won\n")
	}
	os.Exit(0)
}

// TestClaimProcesses races separate processes (plus goroutines here) for
// one park: the filesystem, not in-process locking, must pick one winner.
func TestClaimProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	path := makeArtifact(t, dir, "park", KindPark, RAMStream)
	gate := filepath.Join(t.TempDir(), "go")
	const procs = 4
	var outs [procs]bytes.Buffer
	var cmds []*exec.Cmd
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestClaimHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), claimEnv+"="+path+"|"+gate)
		cmd.Stdout = &outs[i]
		cmd.Stderr = &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	// Wait until every child has opened the park and is spinning on the
	// gate, so the claims really overlap.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, _ := filepath.Glob(gate + ".*")
		if len(ready) == procs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d helpers became ready", len(ready), procs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, gate, nil)
	wins := 0
	if c, err := a.Claim(); err == nil {
		wins++
		defer c.Release()
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", i, err, outs[i].String())
		}
		out := outs[i].String()
		switch {
		case strings.Contains(out, "RESULT won"):
			wins++
		case strings.Contains(out, "RESULT lost") && strings.Contains(out, "already claimed or woken"):
		default:
			t.Errorf("helper %d said:\n%s", i, out)
		}
	}
	if wins != 1 {
		t.Fatalf("%d claimers won across %d processes, want exactly 1", wins, procs+1)
	}
}

// BenchmarkVerifyRAM verifies a 512 MiB sparse RAM file holding 100 MiB of
// data; SetBytes counts the logical size, and data-MB/s reports the rate
// over the bytes actually read.
func BenchmarkVerifyRAM(b *testing.B) {
	const size, dataMiB = 512 << 20, 100
	dir := b.TempDir()
	w, err := Create(openDir(b, dir), "base")
	if err != nil {
		b.Fatal(err)
	}
	ram, err := w.CreateFile("ram")
	if err != nil {
		b.Fatal(err)
	}
	if err := ram.Truncate(size); err != nil {
		b.Fatal(err)
	}
	// 25 runs of 4 MiB spread over the file, like touched guest regions.
	chunk := randBytes(b, 4<<20)
	for i := range dataMiB / 4 {
		if _, err := ram.WriteAt(chunk, int64(i)*(size/(dataMiB/4))); err != nil {
			b.Fatal(err)
		}
	}
	ram.Close()
	st, _ := w.CreateFile("state")
	st.Write([]byte("state"))
	st.Close()
	if err := w.Commit(testMeta(KindBase, RAMFile)); err != nil {
		b.Fatal(err)
	}
	a, err := Open(filepath.Join(dir, "base"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		if err := a.Verify(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(dataMiB<<20)*float64(b.N)/b.Elapsed().Seconds()/1e6, "data-MB/s")
}

// TestCreateWithPathFD covers the transfer jail's O_PATH directory fds:
// they cannot be fsynced, so Create must reopen the directory.
func TestCreateWithPathFD(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent := os.NewFile(uintptr(fd), dir)
	w, err := Create(parent, "base")
	parent.Close() // the writer must not depend on the caller's fd
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.CreateFile("state")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := w.Commit(testMeta(KindPark, RAMStream)); err != nil {
		t.Fatal(err)
	}
	a, err := Open(filepath.Join(dir, "base"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(a.Summary(), "kind=park (one-shot)") {
		t.Errorf("summary %q does not say the park is one-shot", a.Summary())
	}
}
