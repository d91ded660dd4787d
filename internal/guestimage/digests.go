package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/nethersandbox/nether/internal/rootimage"
)

// Digests finds the sha256 of the guest's files, cheaply when setup's
// manifest already recorded it for an unchanged file (the kernel is 66
// MB; hashing it on every fork would cost more than the fork). nether
// fingerprints what it boots with it, and nexus checks a plan's image
// against the same figures.
type Digests struct {
	guestDir string
	once     sync.Once
	stamps   []FileStamp
	mu       sync.Mutex
	cache    map[string]string
}

// NewDigests finds digests with the manifest in guestDir.
func NewDigests(guestDir string) *Digests {
	return &Digests{guestDir: guestDir, cache: map[string]string{}}
}

// Of is the hex sha256 of the file at path.
func (d *Digests) Of(path string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.cache[path]; ok {
		return v, nil
	}
	d.once.Do(func() {
		if m, err := ReadManifest(d.guestDir); err == nil {
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
	if filepath.Base(path) != rootimage.ImageFile {
		return ""
	}
	side := filepath.Join(filepath.Dir(path), rootimage.ManifestFile)
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
