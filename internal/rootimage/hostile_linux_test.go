package rootimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The red team's hostile images: each is built here, small (sparse
// where it declares gigabytes), and refused naming the cause, before
// mkfs and leaving nothing beside --out.

// motdImage is an amd64 image whose /etc/motd says motd.
func motdImage(t *testing.T, motd string) v1.Image {
	t.Helper()
	return imageOf(t, "amd64", layerOf(t, append(shell(), dir("etc/"), file("etc/motd", motd))...))
}

// writeLayout writes an OCI layout of img into dir/layout.
func writeLayout(t *testing.T, dir string, img v1.Image) string {
	t.Helper()
	p := filepath.Join(dir, "layout")
	lp, err := layout.Write(p, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return p
}

func blobFile(layoutDir string, h v1.Hash) string {
	return filepath.Join(layoutDir, "blobs", h.Algorithm, h.Hex)
}

func mustDigest(t *testing.T, f func() (v1.Hash, error)) v1.Hash {
	t.Helper()
	h, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func mustBytes(t *testing.T, f func() ([]byte, error)) []byte {
	t.Helper()
	b, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func layerBytes(t *testing.T, img v1.Image, i int) (v1.Hash, []byte) {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := ls[i].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return mustDigest(t, ls[i].Digest), b
}

// importWith runs Import of src into dir/out with treeTools and a bound.
func importWith(t *testing.T, ctx context.Context, dir string, src Source, maxSize int64, tools *treeTools) (*ImportResult, error) {
	t.Helper()
	if tools == nil {
		tools = &treeTools{}
	}
	return Import(ctx, ImportOptions{Source: src, Out: filepath.Join(dir, "out"), Tools: tools, MaxSize: maxSize})
}

// wantRefused checks a refusal: its message, what it wraps, no mkfs and
// nothing left beside the inputs.
func wantRefused(t *testing.T, err error, tools *treeTools, dir string, is error, want []string, inputs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("imported; want a refusal wrapping %v", is)
	}
	t.Logf("refused: %v", err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("err = %v, want one containing %q", err, w)
		}
	}
	if is != nil && !errors.Is(err, is) {
		t.Errorf("err = %v, does not wrap %v", err, is)
	}
	if tools != nil && tools.calls != 0 {
		t.Errorf("mkfs ran %d times", tools.calls)
	}
	checkNothingWritten(t, dir, inputs...)
}

// TestImportVerifiesLayoutBlobs: blobs of an OCI layout replaced under
// their names are refused: a config and layer of another image (red
// team: imported /etc/motd 'EVIL', recording the genuine digest), a
// swapped manifest, a layer recompressed (same diff ID, other bytes).
func TestImportVerifiesLayoutBlobs(t *testing.T) {
	good, evil := motdImage(t, "good"), motdImage(t, "EVIL")
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, lay string)
		is     error
		want   []string
	}{
		{"config and layer replaced", func(t *testing.T, lay string) {
			os.WriteFile(blobFile(lay, mustDigest(t, good.ConfigName)), mustBytes(t, evil.RawConfigFile), 0o644)
			gd, _ := layerBytes(t, good, 0)
			_, eb := layerBytes(t, evil, 0)
			os.WriteFile(blobFile(lay, gd), eb, 0o644)
		}, errDigest, []string{"the config sha256:", "has digest sha256:"}},
		{"layer replaced", func(t *testing.T, lay string) {
			gd, _ := layerBytes(t, good, 0)
			_, eb := layerBytes(t, evil, 0)
			os.WriteFile(blobFile(lay, gd), eb, 0o644)
		}, errCorrupt, []string{"layer 1 of 1 (sha256:"}},
		{"manifest swapped", func(t *testing.T, lay string) {
			lp, _ := layout.FromPath(lay)
			for _, b := range []func() (v1.Hash, []byte){
				func() (v1.Hash, []byte) { return mustDigest(t, evil.ConfigName), mustBytes(t, evil.RawConfigFile) },
				func() (v1.Hash, []byte) { return layerBytes(t, evil, 0) },
			} {
				h, data := b()
				if err := lp.WriteBlob(h, io.NopCloser(bytes.NewReader(data))); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(blobFile(lay, mustDigest(t, good.Digest)), mustBytes(t, evil.RawManifest), 0o644)
		}, errDigest, []string{"the manifest sha256:", "has digest"}},
		{"layer recompressed", func(t *testing.T, lay string) {
			gd, gb := layerBytes(t, good, 0)
			zr, err := gzip.NewReader(bytes.NewReader(gb))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&out, gzip.NoCompression)
			io.Copy(zw, zr)
			zw.Close()
			os.WriteFile(blobFile(lay, gd), out.Bytes(), 0o644)
		}, errCorrupt, []string{"layer 1 of 1 (sha256:", "not the", "its descriptor says"}},
		{"layer recompressed to its own length", func(t *testing.T, lay string) {
			// The same tar, gzipped again with another header: the
			// length and the diff ID hold, only the digest tells.
			gd, gb := layerBytes(t, good, 0)
			b := bytes.Clone(gb)
			b[4] ^= 0xff // gzip's MTIME, which its CRC does not cover
			os.WriteFile(blobFile(lay, gd), b, 0o644)
		}, errCorrupt, []string{"layer 1 of 1 (sha256:", "has digest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lay := writeLayout(t, dir, good)
			tc.damage(t, lay)
			var motd string
			tools := &treeTools{check: func(tree string) error {
				b, _ := os.ReadFile(filepath.Join(tree, "etc/motd"))
				motd = string(b)
				return nil
			}}
			_, err := importInto(t, dir, Source{Kind: SourceOCILayout, Path: lay}, tools)
			if motd != "" {
				t.Errorf("imported with /etc/motd %q", motd)
			}
			wantRefused(t, err, tools, dir, tc.is, tc.want, "layout")
		})
	}
}

// rewriteTar rewrites the tar archive at p, each entry through f (nil
// drops it).
func rewriteTar(t *testing.T, p string, f func(h *tar.Header, body []byte) []byte) {
	t.Helper()
	in, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(in)), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if body = f(h, body); body == nil && h.Typeflag == tar.TypeReg {
			continue
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeDockerSave writes a docker save archive of img into dir/image.tar.
func writeDockerSave(t *testing.T, dir string, img v1.Image) string {
	t.Helper()
	tag, _ := name.NewTag("test/img:latest")
	p := filepath.Join(dir, "image.tar")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestImportVerifiesDockerSave: a docker save archive whose config and
// layers are another image's, under the names (the digests) of the
// genuine ones, is refused; so is a layer that is not its diff ID's.
func TestImportVerifiesDockerSave(t *testing.T) {
	good, evil := motdImage(t, "good"), motdImage(t, "EVIL")
	gd, _ := layerBytes(t, good, 0)
	_, eb := layerBytes(t, evil, 0)
	for _, tc := range []struct {
		name  string
		subst func(h *tar.Header, body []byte) []byte
		is    error
		want  []string
	}{
		{"config and layer replaced", func(h *tar.Header, body []byte) []byte {
			switch {
			case strings.HasPrefix(h.Name, "sha256:"):
				return mustBytes(t, evil.RawConfigFile)
			case strings.HasPrefix(h.Name, gd.Hex):
				return eb
			}
			return body
		}, errDigest, []string{"the image config sha256:", "has digest"}},
		{"layer replaced", func(h *tar.Header, body []byte) []byte {
			if strings.HasPrefix(h.Name, gd.Hex) {
				return eb
			}
			return body
		}, errCorrupt, []string{"not its diff ID's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := writeDockerSave(t, dir, good)
			rewriteTar(t, p, tc.subst)
			tools := &treeTools{}
			_, err := importInto(t, dir, Source{Kind: SourceDockerArchive, Path: p}, tools)
			wantRefused(t, err, tools, dir, tc.is, tc.want, "image.tar")
		})
	}
}

// tarDir appends the files under root to tw, named relative to it.
func tarDir(t *testing.T, tw *tar.Writer, root string) {
	t.Helper()
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestImportDockerSaveWithLayout: docker save since Docker 25 holds an
// OCI layout; its index is read, so every blob is checked by digest and
// the manifest's own digest is recorded; a layer whose blob is altered
// is refused even though manifest.json names it only by path.
func TestImportDockerSaveWithLayout(t *testing.T) {
	img := motdImage(t, "good")
	for _, tc := range []struct {
		name   string
		damage bool
	}{{"whole", false}, {"config altered", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lay := writeLayout(t, t.TempDir(), img)
			if tc.damage {
				cfg := blobFile(lay, mustDigest(t, img.ConfigName))
				b, _ := os.ReadFile(cfg)
				os.WriteFile(cfg, bytes.Replace(b, []byte(`"amd64"`), []byte(`"AMD64"`), 1), 0o644)
			}
			p := filepath.Join(dir, "image.tar")
			f, _ := os.Create(p)
			tw := tar.NewWriter(f)
			tarDir(t, tw, lay)
			// manifest.json names a config that is not the image's: it
			// must not be what is read.
			mj := `[{"Config":"blobs/sha256/` + strings.Repeat("0", 64) + `","RepoTags":["x:y"],"Layers":[]}]`
			tw.WriteHeader(&tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mj))})
			tw.Write([]byte(mj))
			tw.Close()
			f.Close()
			tools := &treeTools{}
			res, err := importInto(t, dir, Source{Kind: SourceDockerArchive, Path: p}, tools)
			if tc.damage {
				wantRefused(t, err, tools, dir, errDigest, []string{"the config sha256:", "has digest"}, "image.tar")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := mustDigest(t, img.Digest).String(); res.Manifest.Digest != want {
				t.Errorf("digest %s, want %s", res.Manifest.Digest, want)
			}
		})
	}
}

// TestImportRefusesArtifacts: an OCI artifact stored as an image
// manifest (a Helm chart: its config and layer of Helm's media types) is
// refused naming the media type, even one whose chart tarball holds a
// /bin/sh and whose config lists its diff ID.
func TestImportRefusesArtifacts(t *testing.T) {
	chart := tarOf(t, append(shell(), file("Chart.yaml", "name: evil\n"))...)
	layer := static.NewLayer(gzipOf(t, chart), "application/vnd.cncf.helm.chart.content.v1.tar+gzip")
	for _, tc := range []struct {
		name    string
		cfgType types.MediaType
		want    []string
	}{
		{"helm chart", "application/vnd.cncf.helm.config.v1+json",
			[]string{"not a container image", "its config is a application/vnd.cncf.helm.config.v1+json (a Helm chart)"}},
		{"image config with a helm layer", types.OCIConfigJSON,
			[]string{"not a container image", "its layer 1 is a application/vnd.cncf.helm.chart.content.v1.tar+gzip (a Helm chart)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := mutate.AppendLayers(empty.Image, layer)
			if err != nil {
				t.Fatal(err)
			}
			cf, _ := img.ConfigFile()
			cf = cf.DeepCopy()
			cf.OS, cf.Architecture = "linux", "amd64"
			img, _ = mutate.ConfigFile(img, cf)
			img = mutate.MediaType(img, types.OCIManifestSchema1)
			img = mutate.ConfigMediaType(img, tc.cfgType)
			dir := t.TempDir()
			lay := writeLayout(t, dir, img)
			tools := &treeTools{}
			_, err = importInto(t, dir, Source{Kind: SourceOCILayout, Path: lay}, tools)
			wantRefused(t, err, tools, dir, errNotImage, tc.want, "layout")
		})
	}
}

// paxRecord is one PAX extended header record: its length counts itself.
func paxRecord(k, v string) string {
	rec := " " + k + "=" + v + "\n"
	n := len(rec) + 1
	for len(fmt.Sprint(n))+len(rec) != n {
		n++
	}
	return fmt.Sprint(n) + rec
}

// rawPAXHeader is a PAX extended header block and its records, which
// archive/tar's writer will not write for GNU.sparse keys: a regular
// file's header, retyped 'x' and checksummed again.
func rawPAXHeader(t *testing.T, records string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "PaxHeaders/big", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(records)), Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(records))
	tw.Flush()
	blk := b.Bytes()
	blk[156] = tar.TypeXHeader
	copy(blk[148:156], "        ")
	sum := 0
	for _, c := range blk[:512] {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return blk
}

// sparseTar is a tar archive of shell() and a PAX 1.0 sparse file "big"
// of size bytes: one data byte at its end, the rest a hole (2 KiB).
func sparseTar(t *testing.T, size int64) []byte {
	t.Helper()
	var b bytes.Buffer
	b.Write(tarOf(t, shell()...))
	b.Truncate(b.Len() - 1024) // the end blocks
	b.Write(rawPAXHeader(t, paxRecord("GNU.sparse.major", "1")+paxRecord("GNU.sparse.minor", "0")+
		paxRecord("GNU.sparse.name", "big")+paxRecord("GNU.sparse.realsize", fmt.Sprint(size))))
	tw := tar.NewWriter(&b)
	sparseMap := fmt.Sprintf("1\n%d\n1\n", size-1)
	data := append([]byte(sparseMap), make([]byte, 512-len(sparseMap))...)
	data = append(data, 'x')
	err := tw.WriteHeader(&tar.Header{Name: "GNUSparseFile.0/big", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatUSTAR})
	if err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	tw.Close()
	return b.Bytes()
}

// TestImportBounds: an import writes no more than its bound: a 1.5 KiB
// sparse entry declaring 10 GiB, a gzip of zeros, files that add up past
// the bound and a tar stream of headers alone are refused before the
// disk fills, saying which bound and that it bounds what is written.
func TestImportBounds(t *testing.T) {
	zeros := func(n int) string { return string(make([]byte, n)) }
	for _, tc := range []struct {
		name string
		max  int64
		raw  func(t *testing.T) []byte
		want []string
	}{
		{"sparse entry of 10 GiB", 0, func(t *testing.T) []byte { return sparseTar(t, 10<<30) },
			[]string{`entry "big" declares 10.0 GiB`, "past its bound of 8.0 GiB written (--max-size)"}},
		{"gzip of zeros", 4 << 20, func(t *testing.T) []byte {
			return gzipOf(t, tarOf(t, append(shell(), file("zeros", zeros(16<<20)))...))
		}, []string{`entry "zeros" declares 16.0 MiB`, "past its bound of 4.0 MiB written (--max-size)"}},
		{"files adding up", 1 << 20, func(t *testing.T) []byte {
			return tarOf(t, append(shell(), file("a", zeros(600<<10)), file("b", zeros(600<<10)))...)
		}, []string{`entry "b" declares 600.0 KiB`, "with 600.1 KiB written before it"}},
		{"zeros after the archive's end", 0, func(t *testing.T) []byte {
			return gzipOf(t, append(tarOf(t, shell()...), make([]byte, 8<<20)...))
		}, []string{"more than 1.0 MiB follows the end of its tar archive"}},
		{"a stream of headers", 64 << 10, func(t *testing.T) []byte {
			var ents []ent
			for i := range 300 {
				ents = append(ents, dir(fmt.Sprintf("d%03d/", i)))
			}
			return tarOf(t, append(shell(), ents...)...)
		}, []string{"uncompressed tar streams are over 128.0 KiB, twice the import's bound"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := writeFile(t, dir, "root.tar", tc.raw(t))
			tools := &treeTools{}
			_, err := importWith(t, context.Background(), dir, Source{Kind: SourceTar, Path: src}, tc.max, tools)
			wantRefused(t, err, tools, dir, errTooBig, tc.want, "root.tar")
			if err != nil && strings.Contains(err.Error(), "reading entry") {
				t.Errorf("a bound on writing reported as a read: %v", err)
			}
		})
	}
	t.Run("within the bound", func(t *testing.T) {
		dir := t.TempDir()
		src := writeFile(t, dir, "root.tar", sparseTar(t, 1<<20))
		res, err := importWith(t, context.Background(), dir, Source{Kind: SourceTar, Path: src}, 2<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stats.Bytes < 1<<20 {
			t.Errorf("wrote %d bytes", res.Stats.Bytes)
		}
	})
}

// sparseFile makes p a file of size bytes that holds nothing on disk.
func sparseFile(t *testing.T, p string, size int64) {
	t.Helper()
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
}

// sparseTarEntry writes a tar archive at p of the entries ents and then
// one named name whose header declares size bytes, left a hole: the
// archive takes a few KiB of disk.
func sparseTarEntry(t *testing.T, p string, ents []ent, name string, size int64) {
	t.Helper()
	var b bytes.Buffer
	b.Write(tarOf(t, ents...))
	b.Truncate(b.Len() - 1024)
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sparseFile(t, p, int64(b.Len())+(size+511)/512*512+1024)
}

// TestImportBoundsMetadata: index.json, manifests, configs and a docker
// save archive's manifest.json are read up to MaxMetadata and no
// further (red team: a 1.5 GiB sparse index.json peaked at 1.55 GB, a
// sparse config blob at 3.15 GB).
func TestImportBoundsMetadata(t *testing.T) {
	const huge = 3 << 29 // 1.5 GiB, sparse
	img := motdImage(t, "good")
	for _, tc := range []struct {
		name  string
		input string
		make  func(t *testing.T, dir string) Source
		want  []string
	}{
		{"sparse index.json", "layout", func(t *testing.T, dir string) Source {
			lay := writeLayout(t, dir, img)
			sparseFile(t, filepath.Join(lay, "index.json"), huge)
			return Source{Kind: SourceOCILayout, Path: lay}
		}, []string{"index.json is 1.5 GiB: over the 4.0 MiB bound on an image's metadata files"}},
		{"sparse config blob", "layout", func(t *testing.T, dir string) Source {
			lay := writeLayout(t, dir, img)
			sparseFile(t, blobFile(lay, mustDigest(t, img.ConfigName)), huge)
			return Source{Kind: SourceOCILayout, Path: lay}
		}, []string{"the config sha256:", "is 1.5 GiB: over the 4.0 MiB bound"}},
		{"sparse manifest blob", "layout", func(t *testing.T, dir string) Source {
			lay := writeLayout(t, dir, img)
			sparseFile(t, blobFile(lay, mustDigest(t, img.Digest)), huge)
			return Source{Kind: SourceOCILayout, Path: lay}
		}, []string{"the manifest sha256:", "is 1.5 GiB: over the 4.0 MiB bound"}},
		{"config descriptor of 1.5 GiB", "layout", func(t *testing.T, dir string) Source {
			lay := writeLayout(t, dir, img)
			m, _ := img.Manifest()
			m = m.DeepCopy()
			m.Config.Size = huge
			raw, _ := json.Marshal(m)
			lp, _ := layout.FromPath(lay)
			h, _, _ := v1.SHA256(bytes.NewReader(raw))
			lp.WriteBlob(h, io.NopCloser(bytes.NewReader(raw)))
			idx := fmt.Sprintf(`{"schemaVersion":2,"manifests":[{"mediaType":%q,"size":%d,"digest":%q}]}`, m.MediaType, len(raw), h)
			os.WriteFile(filepath.Join(lay, "index.json"), []byte(idx), 0o644)
			return Source{Kind: SourceOCILayout, Path: lay}
		}, []string{"the config sha256:", "is 1.5 GiB (its descriptor says): over the 4.0 MiB bound"}},
		{"docker save manifest.json of 1.5 GiB", "image.tar", func(t *testing.T, dir string) Source {
			p := filepath.Join(dir, "image.tar")
			sparseTarEntry(t, p, []ent{file("repositories", "{}")}, "manifest.json", huge)
			return Source{Kind: SourceDockerArchive, Path: p}
		}, []string{"manifest.json is 1.5 GiB: over the 4.0 MiB bound"}},
		{"docker save config of 1.5 GiB", "image.tar", func(t *testing.T, dir string) Source {
			p := filepath.Join(dir, "image.tar")
			sparseTarEntry(t, p, []ent{file("manifest.json", `[{"Config":"config.json","Layers":["l.tar"]}]`)}, "config.json", huge)
			return Source{Kind: SourceDockerArchive, Path: p}
		}, []string{"the image config config.json is 1.5 GiB: over the 4.0 MiB bound"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := tc.make(t, dir)
			tools := &treeTools{}
			_, err := importInto(t, dir, src, tools)
			wantRefused(t, err, tools, dir, errTooBig, tc.want, tc.input)
		})
	}
}

// linkChainArchive is a docker save archive of img whose manifest.json
// names its config through a chain of n symlinks.
func linkChainArchive(t *testing.T, dir string, img v1.Image, n int) string {
	t.Helper()
	p := writeDockerSave(t, dir, img)
	cfg := "sha256:" + mustDigest(t, img.ConfigName).Hex
	var links []ent
	for i := range n {
		target := fmt.Sprintf("link%05d", i+1)
		if i == n-1 {
			target = cfg
		}
		links = append(links, symlink(fmt.Sprintf("link%05d", i), target))
	}
	rewriteTar(t, p, func(h *tar.Header, body []byte) []byte {
		if h.Name == "manifest.json" {
			return bytes.Replace(body, []byte(`"`+cfg+`"`), []byte(`"link00000"`), 1)
		}
		return body
	})
	b, _ := os.ReadFile(p)
	b = b[:len(b)-1024]
	b = append(b, tarOf(t, links...)...)
	os.WriteFile(p, b, 0o644)
	return p
}

// TestImportDockerSaveLinks: a docker save archive's symlinks are
// followed through one index of the archive, at most maxLinkHops of
// them: a chain of 4,000 (red team: 8,000 links still ran 20 s after
// SIGINT) is refused at once, a short chain and Docker 25's layer.tar
// links are followed, and a cycle is refused.
func TestImportDockerSaveLinks(t *testing.T) {
	img := motdImage(t, "good")
	t.Run("long chain", func(t *testing.T) {
		dir := t.TempDir()
		p := linkChainArchive(t, dir, img, 4000)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the user's ^C
		defer cancel()
		done := make(chan error, 1)
		tools := &treeTools{}
		start := time.Now()
		go func() {
			_, err := importWith(t, ctx, dir, Source{Kind: SourceDockerArchive, Path: p}, 0, tools)
			done <- err
		}()
		select {
		case err := <-done:
			wantRefused(t, err, tools, dir, nil, []string{"more than 40 links to follow"}, "image.tar")
			t.Logf("refused in %v", time.Since(start))
		case <-time.After(5 * time.Second):
			t.Fatal("still resolving links 4 s after the context was cancelled")
		}
	})
	t.Run("short chain", func(t *testing.T) {
		dir := t.TempDir()
		p := linkChainArchive(t, dir, img, 20)
		if _, err := importInto(t, dir, Source{Kind: SourceDockerArchive, Path: p}, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cycle", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, "image.tar")
		writeFile(t, dir, "image.tar", tarOf(t,
			file("manifest.json", `[{"Config":"a","Layers":[]}]`), symlink("a", "b"), symlink("b", "a")))
		tools := &treeTools{}
		_, err := importInto(t, dir, Source{Kind: SourceDockerArchive, Path: p}, tools)
		wantRefused(t, err, tools, dir, nil, []string{"more than 40 links to follow"}, "image.tar")
	})
}

// TestImportCancelledImage: a cancelled import of an OCI layout or a
// docker save archive stops and leaves nothing.
func TestImportCancelledImage(t *testing.T) {
	img := motdImage(t, "good")
	for _, kind := range []SourceKind{SourceOCILayout, SourceDockerArchive} {
		t.Run(string(kind), func(t *testing.T) {
			dir := t.TempDir()
			src, input := Source{Kind: kind, Path: writeLayout(t, dir, img)}, "layout"
			if kind == SourceDockerArchive {
				os.RemoveAll(src.Path)
				src.Path, input = writeDockerSave(t, dir, img), "image.tar"
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			tools := &treeTools{}
			_, err := importWith(t, ctx, dir, src, 0, tools)
			wantRefused(t, err, tools, dir, context.Canceled, nil, input)
		})
	}
}

// TestImportRefusesBadWhiteouts: a whiteout that names no file (.wh.,
// .wh..) or one outside its directory (.wh..., which removed the
// importer's own work directory) is refused; nothing beside --out goes.
func TestImportRefusesBadWhiteouts(t *testing.T) {
	for _, wh := range []string{".wh...", "etc/.wh...", "etc/sub/.wh...", ".wh..", "etc/.wh.", ".wh."} {
		t.Run(wh, func(t *testing.T) {
			tmp := t.TempDir()
			writeFile(t, tmp, "keep", []byte("the work directory's neighbour"))
			img := imageOf(t, "amd64",
				layerOf(t, append(shell(), dir("etc/"), dir("etc/sub/"), file("etc/sub/f", "x"))...),
				layerOf(t, file(wh, "")))
			lay := writeLayout(t, tmp, img)
			tools := &treeTools{}
			_, err := importInto(t, tmp, Source{Kind: SourceOCILayout, Path: lay}, tools)
			wantRefused(t, err, tools, tmp, errUnsafeEntry, []string{"layer 2 of 2", "whiteout"}, "layout", "keep")
			if _, err := os.Stat(filepath.Join(lay, "index.json")); err != nil {
				t.Errorf("the layout lost its index.json: %v", err)
			}
		})
	}
}
