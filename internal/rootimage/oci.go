package rootimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// guestPlatform is the only platform a guest runs: QEMU's x86-64 machine.
var guestPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// ociImage finds the image a source names, for the guest's platform,
// without reading any layer.
func ociImage(ctx context.Context, src Source) (v1.Image, error) {
	switch src.Kind {
	case SourceOCILayout:
		if fi, err := os.Stat(src.Path); err != nil {
			return nil, err
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not an OCI image layout: it is a file, not a directory (a docker save archive is imported with --docker-archive)", src.Path)
		}
		p, err := layout.FromPath(src.Path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s is not an OCI image layout (it has no index.json): %w", src.Path, err)
			}
			return nil, err
		}
		idx, err := p.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("reading the layout's index.json: %w", err)
		}
		return pickImage(idx, src.Path, 0)
	case SourceDockerArchive:
		if err := notDir(src.Path); err != nil {
			return nil, err
		}
		img, err := tarball.ImageFromPath(src.Path, nil)
		if err != nil {
			return nil, fmt.Errorf("%s is not a docker save archive of one image: %w", src.Path, truncated(err, "the archive "+src.Path))
		}
		return img, nil
	case SourceImage:
		ref, err := name.ParseReference(src.Ref)
		if err != nil {
			return nil, fmt.Errorf("image reference %q: %w", src.Ref, err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(guestPlatform),
			remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithUserAgent("nether-guest"))
		if err != nil {
			return nil, fmt.Errorf("fetching %s (is the registry reachable?): %w", ref, err)
		}
		return img, nil
	}
	return nil, fmt.Errorf("source kind %q is no OCI image", src.Kind)
}

// maxIndexDepth bounds nested indexes: a layout's index.json naming a
// multi-platform index is one level; a cycle of them is a hostile layout.
const maxIndexDepth = 4

// pickImage returns the linux/amd64 image of an index, looking into the
// indexes it holds. A manifest without a platform in its descriptor is
// judged by its config. Anything else is refused naming the platforms
// the index has.
func pickImage(idx v1.ImageIndex, where string, depth int) (v1.Image, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("%s: image indexes nest more than %d deep", where, maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: reading the index: %w", where, err)
	}
	var have []string
	var errs []error
	var later v1.Image // an amd64 image for a newer CPU level (amd64/v3): only if nothing else
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				errs = append(errs, fmt.Errorf("index %s: %w", d.Digest, err))
				continue
			}
			img, err := pickImage(child, where, depth+1)
			if err == nil {
				return img, nil
			}
			var pe *platformError
			if errors.As(err, &pe) {
				have = append(have, pe.have...)
				continue
			}
			errs = append(errs, err)
		case d.MediaType.IsImage():
			if d.Platform != nil && d.Platform.OS != "" {
				if isAttestation(d) {
					continue
				}
				if !matchesGuest(d.Platform.OS, d.Platform.Architecture) {
					have = append(have, d.Platform.String())
					continue
				}
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				errs = append(errs, fmt.Errorf("image %s: %w", d.Digest, err))
				continue
			}
			if d.Platform == nil || d.Platform.OS == "" {
				cf, err := img.ConfigFile()
				if err != nil {
					errs = append(errs, fmt.Errorf("image %s: reading its config: %w", d.Digest, err))
					continue
				}
				if !matchesGuest(cf.OS, cf.Architecture) {
					have = append(have, platformOf(cf))
					continue
				}
			}
			if d.Platform != nil && d.Platform.Variant != "" && d.Platform.Variant != "v1" && d.Platform.Variant != "v2" {
				if later == nil {
					later = img
				}
				continue
			}
			return img, nil
		}
	}
	if later != nil {
		return later, nil
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", where, errors.Join(errs...))
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("%s holds no image", where)
	}
	slices.Sort(have)
	return nil, &platformError{where: where, have: slices.Compact(have)}
}

// isAttestation: buildx stores provenance as an "image" of platform
// unknown/unknown.
func isAttestation(d v1.Descriptor) bool {
	return d.Platform.OS == "unknown" || d.Annotations["vnd.docker.reference.type"] == "attestation-manifest"
}

func matchesGuest(os, arch string) bool {
	return os == guestPlatform.OS && arch == guestPlatform.Architecture
}

func platformOf(cf *v1.ConfigFile) string {
	p := cf.Platform()
	if p == nil || p.OS == "" {
		return "an unknown platform"
	}
	return p.String()
}

// platformError: no image of an index is for the guest's platform.
type platformError struct {
	where string
	have  []string
}

func (e *platformError) Error() string {
	return fmt.Sprintf("%s has no %s image, only %s: %v", e.where, guestPlatform, strings.Join(e.have, ", "), errWrongArch)
}

func (e *platformError) Unwrap() error { return errWrongArch }

// errWrongArch is wrapped by every refusal of an image built for
// another platform.
var errWrongArch = errors.New("the guest runs linux/amd64")

// errNoShell is wrapped when an image cannot run the agent's commands.
var errNoShell = errors.New("commands need /bin/sh")

// checkPlatform refuses an image whose config names another platform.
func checkPlatform(img v1.Image, where string) (string, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return "", fmt.Errorf("%s: reading the image's config: %w", where, err)
	}
	if cf.OS == "" && cf.Architecture == "" {
		return "", nil // /bin/sh's ELF header will tell
	}
	if !matchesGuest(cf.OS, cf.Architecture) {
		return "", fmt.Errorf("%s is an image for %s: %w", where, platformOf(cf), errWrongArch)
	}
	return platformOf(cf), nil
}

// ociLayers returns the image's layers, bottom first, as extraction
// sources that check each layer's bytes against its diff ID.
func ociLayers(img v1.Image) ([]layerSource, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("listing the image's layers: %w", err)
	}
	// The diff IDs from the config: a layer's own DiffID may read and
	// hash the whole layer to find it.
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image's config: %w", err)
	}
	if len(cf.RootFS.DiffIDs) != len(layers) {
		return nil, fmt.Errorf("the image's config lists %d diff IDs for %d layers", len(cf.RootFS.DiffIDs), len(layers))
	}
	out := make([]layerSource, len(layers))
	for i, l := range layers {
		diff := cf.RootFS.DiffIDs[i]
		name := fmt.Sprintf("layer %d of %d (%s)", i+1, len(layers), shortDigest(diff.String()))
		out[i] = layerSource{name: name, oci: true, open: func(context.Context) (io.ReadCloser, error) {
			rc, err := l.Uncompressed()
			if err != nil {
				return nil, err
			}
			if diff.Algorithm != "sha256" {
				return rc, nil
			}
			return &verifyReader{rc: rc, h: sha256.New(), want: diff.Hex, what: name}, nil
		}}
	}
	return out, nil
}

func shortDigest(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+13 {
		return d[:i+13]
	}
	return d
}

// verifyReader fails the read that reaches the end of a layer whose bytes
// do not have its digest: a truncated or altered layer is refused, not
// half-applied in silence.
type verifyReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want string
	what string
}

func (v *verifyReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
			return n, fmt.Errorf("%s has sha256 %s, not its diff ID's: %w", v.what, shortDigest("sha256:"+got), errCorrupt)
		}
	}
	return n, err
}

func (v *verifyReader) Close() error { return v.rc.Close() }

// errCorrupt is wrapped when a layer's bytes are not those its image
// names: truncated or altered.
var errCorrupt = errors.New("the layer is truncated or corrupt")

func notDir(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory; an OCI image layout is imported with --oci-layout", p)
	}
	return nil
}

// absPath is p made absolute for a manifest's record, or p.
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
