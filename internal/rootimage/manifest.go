package rootimage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// Manifest describes one image. It sits beside the image, as ManifestFile,
// in the cache entry and in the output directory.
//
// An image Build made has a suite, packages and a key; one Import made
// has a name, a source and a platform instead (and the digest of the OCI
// image it came from). The session reads only sha256 and bytes.
type Manifest struct {
	Format   Format   `json:"format"`
	SHA256   string   `json:"sha256"` // hex digest of the image file
	Bytes    int64    `json:"bytes"`  // length of the image file
	Suite    string   `json:"suite,omitempty"`
	Packages []string `json:"packages,omitempty"` // the recipe's, sorted; their dependencies are not listed
	Key      string   `json:"key,omitempty"`      // Recipe.Key of the recipe that built it

	Name     string `json:"name,omitempty"`     // Import's --name, or the source's
	Source   string `json:"source,omitempty"`   // kind:path or image:reference, as Import read it
	Digest   string `json:"digest,omitempty"`   // the imported OCI image's manifest digest
	Platform string `json:"platform,omitempty"` // linux/amd64
}

// Equal reports whether m and o describe the same image of the same recipe
// or source.
func (m *Manifest) Equal(o *Manifest) bool {
	return m.Format == o.Format && m.SHA256 == o.SHA256 && m.Bytes == o.Bytes &&
		m.Suite == o.Suite && slices.Equal(m.Packages, o.Packages) && m.Key == o.Key &&
		m.Name == o.Name && m.Source == o.Source && m.Digest == o.Digest && m.Platform == o.Platform
}

// ReadManifest reads the manifest at path.
func ReadManifest(path string) (*Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	return &m, nil
}

// WriteManifest writes m to path atomically: a reader sees the old file or
// the new one, never a part.
func WriteManifest(path string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'), 0o644)
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// hashFile returns the hex SHA-256 and the length of the file at path.
// It costs about 0.1 s per 100 MB here (SHA-NI), cheap enough to check an
// image on every run rather than trust a stamp.
func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
