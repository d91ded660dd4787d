package qemu

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCopySparse: data survives byte for byte, holes and zero pages stay
// holes.
func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	src.Truncate(size)
	blob := make([]byte, 3<<20+123)
	rand.Read(blob)
	for _, off := range []int64{0, 5 << 20, 17<<20 + 4096, size - int64(len(blob))} {
		src.WriteAt(blob, off)
	}
	// An explicit run of zero pages inside data: must not be written.
	src.WriteAt(make([]byte, 1<<20), 30<<20)
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := CopySparse(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from the source")
	}
	if n > int64(4*len(blob)+4*4096) {
		t.Fatalf("copied %d bytes: zero pages or holes were written", n)
	}
	fi, _ := dst.Stat()
	if fi.Size() != size {
		t.Fatalf("size %d", fi.Size())
	}
}

// BenchmarkCopySparse: a 512 MiB tmpfs file with 150 MiB of data, copied
// to the test's temporary directory, as __snapshot__ does while paused.
func BenchmarkCopySparse(b *testing.B) {
	shm, err := os.MkdirTemp("/dev/shm", "copy-bench-")
	if err != nil {
		b.Skip("no /dev/shm")
	}
	defer os.RemoveAll(shm)
	src, _ := os.Create(filepath.Join(shm, "ram"))
	src.Truncate(512 << 20)
	blob := make([]byte, 1<<20)
	rand.Read(blob)
	for i := int64(0); i < 150; i++ {
		src.WriteAt(blob, i*3<<20)
	}
	dir := b.TempDir()
	b.SetBytes(150 << 20)
	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		dst, _ := os.Create(filepath.Join(dir, "ram"))
		t0 := time.Now()
		if _, err := CopySparse(dst, src); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		// As a capture does after resuming: flush, so the next copy does
		// not queue behind this one's writeback.
		b.StopTimer()
		dst.Sync()
		dst.Close()
		os.Remove(dst.Name())
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/copy")
}
