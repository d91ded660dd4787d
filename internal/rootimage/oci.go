package rootimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// guestPlatform is the only platform a guest runs: QEMU's x86-64 machine.
var guestPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// image is an OCI or docker image found in its source, for the guest's
// platform: its manifest and config read and verified, its layers not
// yet read.
type image struct {
	where    string
	digest   v1.Hash // the manifest's; found after the layers for a docker save archive without one
	manifest *v1.Manifest
	config   *v1.ConfigFile
	layers   []blob
	store    io.Closer // nil: nothing to close

	// A docker save archive's manifest.json describes no manifest: the
	// digest recorded is the one of the manifest that describes the
	// blobs as they were read.
	synthetic  bool
	configDesc v1.Descriptor
	stored     []v1.Descriptor // each layer's blob, once read
}

func (img *image) Close() error {
	if img.store == nil {
		return nil
	}
	return img.store.Close()
}

// Digest is the manifest's digest, for the image's manifest: after the
// layers are read for a docker save archive without an OCI index.
func (img *image) Digest() (v1.Hash, error) {
	if !img.synthetic {
		return img.digest, nil
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.DockerManifestSchema2, Config: img.configDesc}
	for i, d := range img.stored {
		if d.Digest.Hex == "" {
			return v1.Hash{}, fmt.Errorf("layer %d was not read", i+1)
		}
		m.Layers = append(m.Layers, d)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	h, _, err := v1.SHA256(bytes.NewReader(b))
	return h, err
}

// blobsOf makes the blob a descriptor names, in one source.
type blobsOf func(what string, d v1.Descriptor) blob

// findImage finds the image a source names, for the guest's platform,
// reading and verifying its index, manifest and config but no layer.
func findImage(ctx context.Context, src Source) (*image, error) {
	switch src.Kind {
	case SourceOCILayout:
		if fi, err := os.Stat(src.Path); err != nil {
			return nil, err
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not an OCI image layout: it is a file, not a directory (a docker save archive is imported with --docker-archive)", src.Path)
		}
		st, err := openDirStore(src.Path)
		if err != nil {
			return nil, err
		}
		if !st.has("index.json") {
			st.Close()
			return nil, fmt.Errorf("%s is not an OCI image layout (it has no index.json): %w", src.Path, os.ErrNotExist)
		}
		return closeOnError(layoutImage(ctx, st, src.Path))
	case SourceDockerArchive:
		if err := notDir(src.Path); err != nil {
			return nil, err
		}
		st, err := openArchiveStore(ctx, src.Path)
		if err != nil {
			return nil, fmt.Errorf("%s is not a docker save archive of one image: %w", src.Path, err)
		}
		// docker save since Docker 25 writes an OCI layout too, whose
		// index names every blob by digest: it is read rather than the
		// manifest.json beside it, which names them by path.
		if st.has("oci-layout") && st.has("index.json") {
			return closeOnError(layoutImage(ctx, st, src.Path))
		}
		return closeOnError(dockerSaveImage(ctx, st, src.Path))
	case SourceImage:
		return registryImage(ctx, src.Ref)
	}
	return nil, fmt.Errorf("source kind %q is no OCI image", src.Kind)
}

func closeOnError(img *image, err error) (*image, error) {
	if err != nil && img != nil {
		img.Close()
		return nil, err
	}
	return img, err
}

// layoutImage reads an OCI layout's index.json and picks its image.
func layoutImage(ctx context.Context, st fileStore, where string) (*image, error) {
	idx := blob{what: "index.json", unsized: true, open: func(ctx context.Context) (io.ReadCloser, int64, error) {
		return st.file(ctx, "index.json")
	}}
	raw, _, err := readMetadata(ctx, idx)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("reading the layout's index.json: %w", err)
	}
	im, err := parseIndex(raw, "the layout's index.json")
	if err != nil {
		st.Close()
		return nil, err
	}
	blobs := func(what string, d v1.Descriptor) blob { return storeBlob(st, what, d) }
	img, err := pickImage(ctx, blobs, im, where, 0)
	if err != nil {
		st.Close()
		return nil, err
	}
	img.where, img.store = where, st
	return img, nil
}

// dockerManifest is a docker save archive's manifest.json: one entry
// per image, naming files of the archive.
type dockerManifest []struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// dockerSaveImage reads a docker save archive's manifest.json. Its files
// are named by path; where a path is a digest (blobs/sha256/HEX, or the
// config's HEX.json, which is the image ID), the file is verified
// against it; every layer is verified against its config's diff ID.
func dockerSaveImage(ctx context.Context, st *archiveStore, where string) (*image, error) {
	fileBlob := func(what, p string) blob {
		return blob{what: what, desc: v1.Descriptor{Digest: digestFromPath(p)}, unsized: true,
			open: func(ctx context.Context) (io.ReadCloser, int64, error) { return st.file(ctx, p) }}
	}
	raw, _, err := readMetadata(ctx, fileBlob("manifest.json", "manifest.json"))
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("%s is not a docker save archive of one image: %w", where, err)
	}
	var dm dockerManifest
	if err := json.Unmarshal(raw, &dm); err != nil {
		st.Close()
		return nil, fmt.Errorf("%s: its manifest.json is not a docker save manifest: %w", where, err)
	}
	if len(dm) != 1 {
		st.Close()
		return nil, fmt.Errorf("%s is not a docker save archive of one image: its manifest.json lists %d images", where, len(dm))
	}
	cb := fileBlob("the image config "+dm[0].Config, dm[0].Config)
	rawCfg, sum, err := readMetadata(ctx, cb)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	cf, err := parseConfig(rawCfg, cb.what)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	img := &image{where: where, config: cf, store: st, synthetic: true,
		configDesc: v1.Descriptor{MediaType: types.DockerConfigJSON, Size: int64(len(rawCfg)), Digest: sum},
		stored:     make([]v1.Descriptor, len(dm[0].Layers))}
	for _, p := range dm[0].Layers {
		img.layers = append(img.layers, fileBlob(p, p))
	}
	return img, nil
}

// digestFromPath is the digest a docker save archive's path names, if
// it is one: blobs/sha256/HEX, HEX.json or sha256:HEX (a config).
func digestFromPath(p string) v1.Hash {
	hex := ""
	switch {
	case strings.HasPrefix(p, "blobs/sha256/"):
		hex = strings.TrimPrefix(p, "blobs/sha256/")
	case strings.HasPrefix(p, "sha256:"):
		hex = strings.TrimPrefix(p, "sha256:")
	case strings.HasSuffix(p, ".json") && !strings.Contains(p, "/"):
		hex = strings.TrimSuffix(p, ".json")
	}
	if h := (v1.Hash{Algorithm: "sha256", Hex: hex}); validHash(h) {
		return h
	}
	return v1.Hash{}
}

// registryImage fetches an image's manifest and config from a registry;
// go-containerregistry picks the platform from an index and verifies
// each blob it is asked for by digest, and the manifest when the
// reference is a digest.
func registryImage(ctx context.Context, refStr string) (*image, error) {
	ref, err := name.ParseReference(refStr)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w", refStr, err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(guestPlatform),
		remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithUserAgent("nether-guest")}
	rimg, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("fetching %s (is the registry reachable?): %w", ref, err)
	}
	raw, err := rimg.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("fetching %s's manifest: %w", ref, err)
	}
	if int64(len(raw)) > MaxMetadata {
		return nil, metadataTooBig(fmt.Sprintf("%s's manifest", ref), formatSize(int64(len(raw))))
	}
	mt, err := rimg.MediaType()
	if err != nil {
		return nil, err
	}
	d := v1.Descriptor{MediaType: mt, Size: int64(len(raw))}
	if d.Digest, _, err = v1.SHA256(bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	blobs := func(what string, d v1.Descriptor) blob {
		return blob{what: what, desc: d, open: func(ctx context.Context) (io.ReadCloser, int64, error) {
			l, err := remote.Layer(ref.Context().Digest(d.Digest.String()), opts...)
			if err != nil {
				return nil, 0, err
			}
			rc, err := l.Compressed()
			return rc, -1, err
		}}
	}
	img, err := manifestImage(ctx, blobs, d, raw, refStr)
	if err != nil {
		return nil, err
	}
	img.where = refStr
	return img, nil
}

// maxIndexDepth bounds nested indexes: a layout's index.json naming a
// multi-platform index is one level; a cycle of them is a hostile layout.
const maxIndexDepth = 4

// pickImage returns the linux/amd64 image of an index, looking into the
// indexes it holds. A manifest without a platform in its descriptor is
// judged by its config. Anything else is refused naming the platforms
// the index has.
func pickImage(ctx context.Context, blobs blobsOf, im *v1.IndexManifest, where string, depth int) (*image, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("%s: image indexes nest more than %d deep", where, maxIndexDepth)
	}
	var have []string
	var errs []error
	var later *image // an amd64 image for a newer CPU level (amd64/v3): only if nothing else
	for _, d := range im.Manifests {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		switch {
		case d.MediaType.IsIndex():
			what := "the index " + shortDigest(d.Digest.String())
			raw, _, err := readMetadata(ctx, blobs(what, d))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			child, err := parseIndex(raw, what)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			img, err := pickImage(ctx, blobs, child, where, depth+1)
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
			img, err := manifestImage(ctx, blobs, d, nil, where)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if d.Platform == nil || d.Platform.OS == "" {
				if !matchesGuest(img.config.OS, img.config.Architecture) {
					have = append(have, platformOf(img.config))
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
		default:
			// Signatures, SBOMs and other artifacts beside the images.
			have = append(have, fmt.Sprintf("a %s", d.MediaType))
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

// parseIndex parses an image index and refuses one that is not.
func parseIndex(raw []byte, what string) (*v1.IndexManifest, error) {
	im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s is not an image index: %w", what, err)
	}
	if im.MediaType != "" && !im.MediaType.IsIndex() {
		return nil, fmt.Errorf("%s is a %s, not an image index", what, im.MediaType)
	}
	return im, nil
}

// manifestImage reads, verifies and checks the manifest d names (raw, if
// already read) and its config.
func manifestImage(ctx context.Context, blobs blobsOf, d v1.Descriptor, raw []byte, where string) (*image, error) {
	what := "the manifest " + shortDigest(d.Digest.String())
	if raw == nil {
		var err error
		if raw, _, err = readMetadata(ctx, blobs(what, d)); err != nil {
			return nil, err
		}
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s is not an image manifest: %w", what, err)
	}
	if err := checkImageTypes(d, m, what); err != nil {
		return nil, err
	}
	cb := blobs("the config "+shortDigest(m.Config.Digest.String()), m.Config)
	rawCfg, _, err := readMetadata(ctx, cb)
	if err != nil {
		return nil, err
	}
	cf, err := parseConfig(rawCfg, cb.what)
	if err != nil {
		return nil, err
	}
	img := &image{where: where, digest: d.Digest, manifest: m, config: cf}
	for _, l := range m.Layers {
		img.layers = append(img.layers, blobs("", l))
	}
	return img, nil
}

// errNotImage is wrapped when a manifest describes something other than
// a container image: a Helm chart, a signature, any OCI artifact.
var errNotImage = errors.New("not a container image")

// checkImageTypes refuses a manifest whose media types are not an
// image's: an OCI artifact (a Helm chart, say) is stored as an image
// manifest whose config and layers are of its own types, and its layers
// are no root file system.
func checkImageTypes(d v1.Descriptor, m *v1.Manifest, what string) error {
	if m.MediaType != "" && !m.MediaType.IsImage() {
		return fmt.Errorf("%s is a %s: %w", what, m.MediaType, errNotImage)
	}
	if m.MediaType != "" && d.MediaType != "" && m.MediaType != d.MediaType {
		return fmt.Errorf("%s is a %s, but its descriptor says %s: %w", what, m.MediaType, d.MediaType, errDigest)
	}
	if !m.Config.MediaType.IsConfig() {
		return fmt.Errorf("%s is %w: its config is a %s%s, not an image config", what, errNotImage, m.Config.MediaType, artifactHint(m.Config.MediaType))
	}
	for i, l := range m.Layers {
		if !l.MediaType.IsLayer() {
			return fmt.Errorf("%s is %w: its layer %d is a %s%s, not an image layer", what, errNotImage, i+1, l.MediaType, artifactHint(l.MediaType))
		}
	}
	return nil
}

func artifactHint(mt types.MediaType) string {
	if strings.HasPrefix(string(mt), "application/vnd.cncf.helm.") {
		return " (a Helm chart)"
	}
	return ""
}

// parseConfig parses an image config.
func parseConfig(raw []byte, what string) (*v1.ConfigFile, error) {
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s is not an image config: %w", what, err)
	}
	return cf, nil
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
func checkPlatform(cf *v1.ConfigFile, where string) (string, error) {
	if cf.OS == "" && cf.Architecture == "" {
		return "", nil // /bin/sh's ELF header will tell
	}
	if !matchesGuest(cf.OS, cf.Architecture) {
		return "", fmt.Errorf("%s is an image for %s: %w", where, platformOf(cf), errWrongArch)
	}
	return platformOf(cf), nil
}

// ociLayers returns the image's layers, bottom first, as extraction
// sources that verify each layer as it is read: its bytes as stored
// against the digest that names them, its tar stream against the
// config's diff ID.
func ociLayers(img *image) ([]layerSource, error) {
	diffs := img.config.RootFS.DiffIDs
	if len(diffs) != len(img.layers) {
		return nil, fmt.Errorf("the image's config lists %d diff IDs for %d layers", len(diffs), len(img.layers))
	}
	out := make([]layerSource, len(img.layers))
	for i, b := range img.layers {
		diff := diffs[i]
		if !validHash(diff) {
			return nil, fmt.Errorf("the image's config names layer %d by %q, not a sha256 diff ID", i+1, diff)
		}
		b.what = fmt.Sprintf("layer %d of %d (%s)", i+1, len(img.layers), shortDigest(diff.String()))
		b.corrupt = errCorrupt
		record := func(d v1.Descriptor) {
			if img.stored != nil {
				img.stored[i] = d
			}
		}
		out[i] = layerSource{name: b.what, oci: true, open: func(ctx context.Context) (io.ReadCloser, error) {
			return openLayer(ctx, b, diff, record)
		}}
	}
	return out, nil
}

// openLayer opens a layer's tar stream: its blob decompressed as its
// first bytes say, both verified as they are read.
func openLayer(ctx context.Context, b blob, diff v1.Hash, record func(v1.Descriptor)) (io.ReadCloser, error) {
	stored, c, err := openBlob(ctx, b, 0)
	if err != nil {
		return nil, err
	}
	stored.deferred = true // the diff ID is checked first: see layerReader.Read
	tr, compressed, err := decompress(ctx, stored, c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", b.what, err)
	}
	return &layerReader{tar: tr, stored: stored, diff: diff, h: sha256.New(), what: b.what, compressed: compressed, record: record}, nil
}

// layerReader fails the read that reaches the end of a layer whose bytes
// are not what its image names: a truncated, altered or swapped layer is
// refused, not half-applied in silence. At the end of the tar stream the
// stored blob is read to its end too, so its digest is checked even
// where the decompressor stopped short of its trailer.
type layerReader struct {
	tar        io.ReadCloser
	stored     *digestReader
	diff       v1.Hash
	h          hash.Hash
	what       string
	compressed bool
	record     func(v1.Descriptor)
	err        error
}

func (l *layerReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.tar.Read(p)
	l.h.Write(p[:n])
	if err == io.EOF {
		if l.err = l.finish(); l.err != nil {
			return n, l.err
		}
	}
	return n, err
}

func (l *layerReader) finish() error {
	if _, err := io.Copy(io.Discard, l.stored); err != nil {
		return err
	}
	if got := hex.EncodeToString(l.h.Sum(nil)); got != l.diff.Hex {
		return fmt.Errorf("%s has sha256 %s, not its diff ID's: %w", l.what, shortDigest("sha256:"+got), errCorrupt)
	}
	if err := l.stored.verdict(); err != nil {
		return err
	}
	mt := types.DockerUncompressedLayer
	if l.compressed {
		mt = types.DockerLayer
	}
	l.record(v1.Descriptor{MediaType: mt, Size: l.stored.n, Digest: l.stored.sum()})
	return nil
}

func (l *layerReader) Close() error { return l.tar.Close() }

func shortDigest(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+13 {
		return d[:i+13]
	}
	return d
}

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
