//go:build linux

package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// dataChunks reports which ChunkSize chunks of f (size bytes) touch data,
// using SEEK_DATA/SEEK_HOLE. Guest RAM files are mostly holes (untouched
// pages), and reading a hole costs a page-cache fill of zeros for nothing:
// a chunk that lies entirely in a hole is known to be zeros without
// reading it. A filesystem without hole reporting makes everything data,
// which is correct, just slower.
func dataChunks(f *os.File, size int64) ([]bool, error) {
	n := chunkCount(size)
	data := make([]bool, n)
	mark := func(start, end int64) {
		for c := start / ChunkSize; c < n && c*ChunkSize < end; c++ {
			data[c] = true
		}
	}
	fd := int(f.Fd())
	defer runtime.KeepAlive(f)
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data at or after off
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			mark(off, size)
			break
		}
		if err != nil {
			return nil, fmt.Errorf("seeking to data after offset %d: %w", off, err)
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seeking to a hole after offset %d: %w", d, err)
		}
		if h > size {
			h = size
		}
		if h <= d {
			// Cannot happen on a sane filesystem; treating the rest as
			// data keeps the loop finite and the result correct.
			mark(d, size)
			break
		}
		mark(d, h)
		off = h
	}
	return data, nil
}

// ramChunkCRCs returns the CRC32C of every ChunkSize chunk of f, which
// must be size bytes long. Hole chunks are not read; data chunks are read
// and hashed by GOMAXPROCS workers, since a multi-GiB RAM file is worth
// the cores and pread is safe to share.
func ramChunkCRCs(ctx context.Context, f *os.File, size int64) ([]uint32, error) {
	isData, err := dataChunks(f, size)
	if err != nil {
		return nil, err
	}
	n := int64(len(isData))
	crcs := make([]uint32, n)
	var todo []int64
	for c := int64(0); c < n; c++ {
		if isData[c] {
			todo = append(todo, c)
			continue
		}
		if l := chunkLen(c, size); l == ChunkSize {
			crcs[c] = ZeroChunkCRC()
		} else {
			crcs[c] = crc32.Checksum(make([]byte, l), crc32c) // the short last chunk, at most once
		}
	}
	if len(todo) == 0 {
		return crcs, nil
	}

	workers := min(runtime.GOMAXPROCS(0), len(todo))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, ChunkSize)
			for {
				i := next.Add(1) - 1
				if i >= int64(len(todo)) || ctx.Err() != nil {
					return
				}
				c := todo[i]
				l := chunkLen(c, size)
				if _, err := f.ReadAt(buf[:l], c*ChunkSize); err != nil {
					if errors.Is(err, io.EOF) {
						err = fmt.Errorf("file shrank while being read: %w", err)
					}
					fail(fmt.Errorf("reading chunk %d (offset %d): %w", c, c*ChunkSize, err))
					return
				}
				crcs[c] = crc32.Checksum(buf[:l], crc32c)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return crcs, nil
}

// chunkLen is the length of chunk c of a size-byte file.
func chunkLen(c, size int64) int64 {
	return min(ChunkSize, size-c*ChunkSize)
}

// fileSHA256 hashes all of f from offset 0 (via a SectionReader, so the
// shared file offset is never relied on).
func fileSHA256(ctx context.Context, f *os.File, size int64) (string, error) {
	h := sha256.New()
	r := io.NewSectionReader(f, 0, size)
	buf := make([]byte, 1<<20)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := r.Read(buf)
		h.Write(buf[:n])
		total += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("reading at offset %d: %w", total, err)
		}
	}
	if total != size {
		return "", fmt.Errorf("file shrank while being read (%d of %d bytes)", total, size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ChunkSums returns the chunk checksums of f (size bytes) as an
// artifact's chunked files have them: a ChunkSize CRC32C each, holes
// known to be zeros without being read. A park records its live disk's
// this way, so its wake can tell the disk was not changed in between.
func ChunkSums(ctx context.Context, f *os.File, size int64) ([]uint32, error) {
	return ramChunkCRCs(ctx, f, size)
}
