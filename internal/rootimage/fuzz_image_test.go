package rootimage

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// FuzzDockerArchive: whatever bytes a docker save archive holds, finding
// its image (indexing the archive, following its links, reading
// manifest.json or index.json, the manifest and the config) and reading
// its layers ends, quickly, in an image or an error, and reads no
// metadata past MaxMetadata.
func FuzzDockerArchive(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 1024))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "image.tar")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		img, err := findImage(ctx, Source{Kind: SourceDockerArchive, Path: p})
		if err != nil {
			return
		}
		defer img.Close()
		layers, err := ociLayers(img)
		if err != nil {
			return
		}
		for _, l := range layers {
			rc, err := l.open(ctx)
			if err != nil {
				continue
			}
			_, err = io.Copy(io.Discard, io.LimitReader(rc, 64<<20))
			rc.Close()
			if err == nil {
				// A layer read whole is its diff ID's.
				continue
			}
			if !errors.Is(err, errCorrupt) && !errors.Is(err, errTruncated) && !errors.Is(err, errDigest) && ctx.Err() == nil {
				t.Logf("layer %s: %v", l.name, err)
			}
		}
		if _, err := img.Digest(); err != nil && !img.synthetic {
			t.Fatalf("an image of a layout has no digest: %v", err)
		}
	})
}

// FuzzImageMetadata: whatever an index, a manifest and a config say, the
// parsers end in an error or in values the import can trust: an
// accepted manifest's config and layers are of an image's media types.
func FuzzImageMetadata(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"manifests":[]}`), []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,"digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},"layers":[]}`), []byte(`{"os":"linux","architecture":"amd64","rootfs":{"type":"layers","diff_ids":[]}}`))
	f.Fuzz(func(t *testing.T, index, manifest, config []byte) {
		if im, err := parseIndex(index, "index"); err == nil && im.MediaType != "" && !im.MediaType.IsIndex() {
			t.Fatalf("index of media type %s accepted", im.MediaType)
		}
		if m, err := v1.ParseManifest(bytes.NewReader(manifest)); err == nil {
			if checkImageTypes(v1.Descriptor{}, m, "manifest") == nil {
				if !m.Config.MediaType.IsConfig() {
					t.Fatalf("config of media type %s accepted", m.Config.MediaType)
				}
				for _, l := range m.Layers {
					if !l.MediaType.IsLayer() {
						t.Fatalf("layer of media type %s accepted", l.MediaType)
					}
				}
			}
		}
		parseConfig(config, "config")
		if h := digestFromPath(string(config)); h.Hex != "" && !validHash(h) {
			t.Fatalf("digestFromPath(%q) = %v", config, h)
		}
	})
}

// FuzzWhiteout: an accepted whiteout hides a file of its own directory,
// inside the layer's tree, never the directory itself or one above it.
func FuzzWhiteout(f *testing.F) {
	for _, s := range []string{"etc/.wh.passwd", ".wh...", "a/.wh..", ".wh.", ".wh..wh..opq", "a/b/.wh..wh..opq", ".wh..wh.plnk"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		p, err := entryPath(name)
		if err != nil {
			return
		}
		dir, hidden, opaque, ok, err := whiteout(p)
		if err != nil {
			if !errors.Is(err, errUnsafeEntry) {
				t.Fatalf("whiteout(%q): %v does not wrap errUnsafeEntry", p, err)
			}
			return
		}
		if !ok {
			if strings.HasPrefix(path.Base(p), whiteoutPrefix) {
				t.Fatalf("whiteout(%q) is not one", p)
			}
			return
		}
		if opaque {
			if dir != path.Dir(p) {
				t.Fatalf("opaque whiteout %q is for %q", p, dir)
			}
			return
		}
		target := path.Join(dir, hidden)
		if q, err := entryPath(target); err != nil || q != target || q == "." || path.Dir(q) != path.Dir(p) {
			t.Fatalf("whiteout %q hides %q (%v), not a file of its directory", p, target, err)
		}
	})
}
