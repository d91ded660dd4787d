package session

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/nethersandbox/nether/internal/guestimage"
)

// digests finds file digests, cheaply when setup's manifest already
// recorded them for an unchanged file (the kernel is 66 MB; hashing it on
// every fork would cost more than the fork).
type digests struct {
	guestDir string
	once     sync.Once
	stamps   []guestimage.FileStamp
	mu       sync.Mutex
	cache    map[string]string
}

func newDigests(guestDir string) *digests {
	return &digests{guestDir: guestDir, cache: map[string]string{}}
}

func (d *digests) of(path string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.cache[path]; ok {
		return v, nil
	}
	d.once.Do(func() {
		if m, err := guestimage.ReadManifest(d.guestDir); err == nil {
			for _, st := range m.Stamps {
				d.stamps = append(d.stamps, st)
			}
		}
	})
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	for _, st := range d.stamps {
		if sameStamp(st, fi) && st.SHA256 != "" {
			d.cache[path] = st.SHA256
			return st.SHA256, nil
		}
	}
	if v := sidecarDigest(path, fi); v != "" {
		d.cache[path] = v
		return v, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("fingerprinting %s: %w", path, err)
	}
	v := hex.EncodeToString(h.Sum(nil))
	d.cache[path] = v
	return v, nil
}

// sidecarDigest is a root image's digest as its builder recorded it in
// rootfs.json beside it, when that record still describes the file: the
// same size, and the image not modified after the record was written.
// Hashing a root image of a few hundred MB would cost every start and
// every fork a second; anything that does not match is hashed.
func sidecarDigest(path string, fi os.FileInfo) string {
	if filepath.Base(path) != RootImageFile {
		return ""
	}
	side := filepath.Join(filepath.Dir(path), "rootfs.json")
	b, err := os.ReadFile(side)
	if err != nil {
		return ""
	}
	sfi, err := os.Stat(side)
	if err != nil || fi.ModTime().After(sfi.ModTime()) {
		return ""
	}
	var m struct {
		SHA256 string `json:"sha256"`
		Bytes  int64  `json:"bytes"`
	}
	if json.Unmarshal(b, &m) != nil || m.Bytes != fi.Size() || len(m.SHA256) != 64 {
		return ""
	}
	return m.SHA256
}
