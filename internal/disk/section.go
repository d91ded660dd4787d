package disk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The persistent disk across captures. A base carries the disk as it was
// at the instant of the capture, as its own file (the engine copies it
// while the guest runs on), so a fork's page cache and its disk agree; a
// fork writes into a copy-on-write layer of its own over it. A park keeps
// its disk where it is: the file the parked sandbox was writing is the one
// its wake continues, and the park records its size and checksums so a
// wake can tell nothing touched it in between.

// SectionName and SectionVersion name the disk's section in an artifact's
// metadata; both are part of the artifact format.
const (
	SectionName    = "disk"
	SectionVersion = 1
)

// Section is the disk's part of an artifact.
type Section struct {
	// Layer: the artifact's disk file is the disk at capture (a base).
	Layer bool `json:"layer,omitempty"`
	// Live (a park): the disk file the parked sandbox wrote, continued by
	// its wake, with its size and chunk checksums when the guest stopped.
	Live   string   `json:"live,omitempty"`
	Size   int64    `json:"size,omitempty"`
	Chunks []uint32 `json:"chunks,omitempty"`
	// Stamp (a park) is the live disk's stamp when its checksums were
	// taken: a wake that finds the same stamp knows the disk unchanged
	// without reading it. Absent in parks from before it was recorded.
	Stamp *snapshot.FileStamp `json:"stamp,omitempty"`
}

// maxStampWait is how long a park waits for its disk's stamp to be clear
// of the last write (FileStamp.ClearAt); a disk on a file system of whole
// seconds is not worth two of them, and its wake compares checksums.
const maxStampWait = 50 * time.Millisecond

// Component saves the disk section. It is made with the disk's host file
// ("" without a disk, or for validate_snapshot); the capture says what
// kind of artifact it writes (a base copies the disk, a park refers to
// it); the engine does the copying.
type Component struct {
	path string
}

// NewComponent makes the component of the disk at path ("" = none).
func NewComponent(path string) *Component { return &Component{path: path} }

func (c *Component) Name() string     { return SectionName }
func (c *Component) Version() int     { return SectionVersion }
func (c *Component) Required() bool   { return false }
func (c *Component) Quiescent() error { return nil }
func (c *Component) Freeze()          {}
func (c *Component) Thaw()            {}

// Save runs with the guest paused: the engine has flushed the disk, so a
// park's checksums are of what the guest wrote, all of it.
func (c *Component) Save(kind snapshot.Kind) (json.RawMessage, error) {
	if c.path == "" {
		return json.RawMessage(`{}`), nil
	}
	if kind != snapshot.KindPark {
		return json.Marshal(Section{Layer: true})
	}
	sec, err := Parked(context.Background(), c.path)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sec)
}

// Restore checks the section; the disk itself is attached before the
// engine starts.
func (c *Component) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil
	}
	_, err := DecodeSection(data)
	return err
}

// Parked records a parked sandbox's disk: its size and checksums, and
// its stamp if nothing changed it while they were taken (nothing should:
// the guest is paused and the disk locked).
func Parked(ctx context.Context, path string) (Section, error) {
	before, err := snapshot.StatStamp(path)
	if err != nil {
		return Section{}, fmt.Errorf("the disk: %w", err)
	}
	wait := time.Until(before.ClearAt())
	if wait > 0 && wait <= maxStampWait {
		// The guest wrote within a clock tick: a change right after
		// the stamp could leave the same ctime behind.
		time.Sleep(wait)
	}
	size, chunks, err := fileChunks(ctx, path)
	if err != nil {
		return Section{}, fmt.Errorf("checksumming the disk: %w", err)
	}
	sec := Section{Live: path, Size: size, Chunks: chunks}
	after, err := snapshot.StatStamp(path)
	if err == nil && after == before && !time.Now().Before(before.ClearAt()) {
		sec.Stamp = &before
	}
	return sec, nil
}

// DecodeSection reads a disk section, refusing what it cannot mean.
func DecodeSection(data json.RawMessage) (Section, error) {
	var sec Section
	if err := json.Unmarshal(data, &sec); err != nil {
		return sec, fmt.Errorf("the disk section: %w", err)
	}
	if sec.Layer && sec.Live != "" {
		return sec, errors.New("the disk section names both a layer and a live disk")
	}
	if sec.Live != "" && (!filepath.IsAbs(sec.Live) || int64(len(sec.Chunks)) != (sec.Size+snapshot.ChunkSize-1)/snapshot.ChunkSize) {
		return sec, errors.New("the disk section's live disk is malformed")
	}
	return sec, nil
}

// Captured is the artifact's disk section; ok is false for an artifact
// of a sandbox without a disk.
func Captured(art *snapshot.Artifact) (sec Section, ok bool, err error) {
	raw, ok := art.Meta.Sections[SectionName]
	if !ok {
		return Section{}, false, nil
	}
	sec, err = DecodeSection(raw.Data)
	if err != nil {
		return sec, false, err
	}
	has := sec.Layer || sec.Live != ""
	if sec.Layer {
		if _, listed := art.Meta.Files[snapshot.FileDisk]; !listed {
			return sec, false, errors.New("the disk section names a layer the artifact does not list")
		}
	}
	return sec, has, nil
}

// fileChunks checksums a disk file the way artifacts do.
func fileChunks(ctx context.Context, path string) (int64, []uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, nil, err
	}
	chunks, err := snapshot.ChunkSums(ctx, f, st.Size())
	return st.Size(), chunks, err
}

// CheckLive compares a parked sandbox's disk with what the park
// recorded: its presence, size and checksums. With trustStamp, a disk
// whose stamp is the one the park recorded is known unchanged without
// being read (a wake: a multi-GiB disk took seconds to read);
// validate_snapshot reads it all the same.
func CheckLive(ctx context.Context, sec Section, trustStamp bool) (stamped bool, err error) {
	if trustStamp && sec.Stamp != nil {
		if st, err := snapshot.StatStamp(sec.Live); err == nil && st == *sec.Stamp {
			return true, nil
		}
	}
	size, chunks, err := fileChunks(ctx, sec.Live)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("the parked sandbox's disk %s is missing", sec.Live)
	case err != nil:
		return false, fmt.Errorf("the parked sandbox's disk: %w", err)
	case size != sec.Size:
		return false, fmt.Errorf("the parked sandbox's disk %s is %d bytes, the park recorded %d: it changed since the park", sec.Live, size, sec.Size)
	}
	for i := range chunks {
		if chunks[i] != sec.Chunks[i] {
			return false, fmt.Errorf("the parked sandbox's disk %s changed since the park (chunk %d, offset %d, differs); waking on it would hand the guest a disk its memory does not expect", sec.Live, i, int64(i)*snapshot.ChunkSize)
		}
	}
	return false, nil
}
