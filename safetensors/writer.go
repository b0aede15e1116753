package safetensors

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"unicode/utf8"
)

// copyBufSize bounds the memory WriteFile uses per file, whatever the tensor size.
const copyBufSize = 1 << 20

// NumBytes is the byte size the entry's Open must yield:
// product(Shape)*DType.Size(), overflow-checked.
func (e Entry) NumBytes() (int64, error) {
	n, err := byteSize(e.DType, e.Shape)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", e.Name, err)
	}
	return n, nil
}

// PlanHeader returns the complete header block (8-byte length + JSON padded
// with spaces to a multiple of 8) for entries written in the given order.
// Keys keep entry order, with __metadata__ first when not empty, so the same
// input always gives the same bytes.
func PlanHeader(metadata map[string]string, entries []Entry) ([]byte, error) {
	block, _, err := planHeader(metadata, entries, 0, 0)
	return block, err
}

// PlanHeaderAt is PlanHeader with the JSON padded further, with spaces as the
// format allows, so that the data section starts at byte phase of a page of
// page bytes (file offset % page == phase). A writer that copies tensors
// between files page cache to page cache uses it to put each tensor at the
// same offset within a page as its source (a copy whose source and
// destination sit at different offsets within their pages touches every
// destination page twice). phase and page must be multiples of 8 (the data
// section stays 8-byte aligned), 0 <= phase < page. When the padding would
// take the header over MaxHeaderSize the header is returned unpadded: the
// alignment only saves time.
func PlanHeaderAt(metadata map[string]string, entries []Entry, phase, page int64) ([]byte, error) {
	if page <= 0 || page%8 != 0 || phase < 0 || phase >= page || phase%8 != 0 {
		return nil, fmt.Errorf("header alignment: phase %d of a %d-byte page: want multiples of 8, 0 <= phase < page", phase, page)
	}
	block, _, err := planHeader(metadata, entries, phase, page)
	return block, err
}

// planHeader is PlanHeaderAt (page 0: no page alignment) that also returns
// each entry's byte count.
func planHeader(metadata map[string]string, entries []Entry, phase, page int64) ([]byte, []int64, error) {
	// What the reader would refuse is not written.
	if len(entries) > MaxTensorsPerFile {
		return nil, nil, fmt.Errorf("%d tensors in one file, over the limit of %d", len(entries), MaxTensorsPerFile)
	}
	if len(metadata) > maxMetadataEntries {
		return nil, nil, fmt.Errorf("%s has %d keys, over the limit of %d", metadataKey, len(metadata), maxMetadataEntries)
	}
	metaBytes := 0
	for k, v := range metadata {
		metaBytes += len(k) + len(v)
	}
	if metaBytes > maxMetadataBytes {
		return nil, nil, fmt.Errorf("%s holds %d bytes, over the limit of %d", metadataKey, metaBytes, maxMetadataBytes)
	}
	var js bytes.Buffer
	js.WriteByte('{')
	if len(metadata) > 0 {
		keys := slices.Sorted(maps.Keys(metadata))
		js.WriteString(`"` + metadataKey + `":{`)
		for i, k := range keys {
			if !utf8.ValidString(k) || !utf8.ValidString(metadata[k]) {
				return nil, nil, fmt.Errorf("%s: key %q or its value is not valid UTF-8", metadataKey, k)
			}
			if i > 0 {
				js.WriteByte(',')
			}
			writeJSONString(&js, k)
			js.WriteByte(':')
			writeJSONString(&js, metadata[k])
		}
		js.WriteByte('}')
	}
	sizes := make([]int64, len(entries))
	seen := make(map[string]bool, len(entries))
	offset := int64(0)
	for i, e := range entries {
		switch {
		case e.Name == metadataKey:
			return nil, nil, fmt.Errorf("tensor %q: name is reserved for metadata", e.Name)
		case seen[e.Name]:
			return nil, nil, fmt.Errorf("tensor %q: written twice", e.Name)
		case !utf8.ValidString(e.Name):
			return nil, nil, fmt.Errorf("tensor %q: name is not valid UTF-8", e.Name)
		case !e.DType.Valid():
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", e.Name, string(e.DType))
		case len(e.Shape) > maxRank:
			return nil, nil, fmt.Errorf("tensor %q: shape has %d dimensions, over the limit of %d", e.Name, len(e.Shape), maxRank)
		}
		seen[e.Name] = true
		n, err := e.NumBytes()
		if err != nil {
			return nil, nil, err
		}
		if offset > maxInt64-n {
			return nil, nil, fmt.Errorf("tensor %q: data section would exceed int64", e.Name)
		}
		sizes[i] = n
		if js.Len() > 1 {
			js.WriteByte(',')
		}
		writeJSONString(&js, e.Name)
		fmt.Fprintf(&js, `:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, e.DType, formatShape(e.Shape), offset, offset+n)
		offset += n
	}
	js.WriteByte('}')
	for js.Len()%8 != 0 {
		js.WriteByte(' ')
	}
	if js.Len() > MaxHeaderSize {
		return nil, nil, fmt.Errorf("header would be %d bytes, over the %d-byte limit", js.Len(), MaxHeaderSize)
	}
	if page > 0 {
		if pad := ((phase-8-int64(js.Len()))%page + page) % page; int64(js.Len())+pad <= MaxHeaderSize {
			js.Write(bytes.Repeat([]byte{' '}, int(pad)))
		}
	}
	block := make([]byte, 8, 8+js.Len())
	binary.LittleEndian.PutUint64(block, uint64(js.Len()))
	return append(block, js.Bytes()...), sizes, nil
}

const maxInt64 = 1<<63 - 1

// writeJSONString writes s as a JSON string literal; s must be valid UTF-8.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)           // cannot fail for a string
	b.Truncate(b.Len() - 1) // drop Encode's newline
}

// WriteFile streams entries, in order, to path+".tmp", syncs, and renames to
// path. progress, if not nil, is called with the number of tensor-data bytes
// written by each chunk (the header is not counted), so the calls add up to
// the sum of the entries' NumBytes. Each entry's Open must yield exactly its
// NumBytes; if it yields fewer or more, or anything fails, or ctx is
// cancelled, nothing is left at path or path+".tmp". If Open's reader is an
// io.Closer it is closed.
func WriteFile(ctx context.Context, path string, metadata map[string]string, entries []Entry, progress func(int64)) (res WriteResult, err error) {
	header, sizes, err := planHeader(metadata, entries, 0, 0)
	if err != nil {
		return WriteResult{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, fmt.Errorf("%s: %w", path, err)
	}
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return WriteResult{}, diskError(err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	w := &hashingWriter{f: out, h: sha256.New(), path: tmp}
	if err := w.write(header); err != nil {
		return WriteResult{}, fmt.Errorf("%s: writing header: %w", tmp, err)
	}
	buf := make([]byte, copyBufSize)
	for i, e := range entries {
		if err := copyEntry(ctx, w, e, sizes[i], buf, progress); err != nil {
			return WriteResult{}, fmt.Errorf("%s: tensor %q: %w", tmp, e.Name, err)
		}
	}
	if err := out.Sync(); err != nil {
		return WriteResult{}, fmt.Errorf("%s: sync: %w", tmp, diskError(err))
	}
	if err := out.Close(); err != nil {
		return WriteResult{}, fmt.Errorf("%s: close: %w", tmp, diskError(err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return WriteResult{}, err
	}
	syncDir(filepath.Dir(path))
	return WriteResult{Path: path, Size: w.n, SHA256: hex.EncodeToString(w.h.Sum(nil))}, nil
}

// copyEntry copies exactly want bytes from e.Open() in buf-sized chunks,
// checking ctx between chunks, and then checks the source is exhausted.
func copyEntry(ctx context.Context, w *hashingWriter, e Entry, want int64, buf []byte, progress func(int64)) (err error) {
	if e.Open == nil {
		return errors.New("entry has no Open function")
	}
	r, err := e.Open()
	if err != nil {
		return fmt.Errorf("opening source: %w", err)
	}
	if c, ok := r.(io.Closer); ok {
		defer func() {
			if cerr := c.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("closing source: %w", cerr)
			}
		}()
	}
	done := int64(0)
	for done < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := buf[:min(int64(len(buf)), want-done)]
		n, rerr := io.ReadFull(r, chunk)
		if n > 0 {
			if err := w.write(chunk[:n]); err != nil {
				return err
			}
			done += int64(n)
			if progress != nil {
				progress(int64(n))
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return fmt.Errorf("source yielded %d bytes, shape %s %s needs %d", done, formatShape(e.Shape), e.DType, want)
		}
		if rerr != nil {
			return fmt.Errorf("reading source: %w", rerr)
		}
	}
	var extra [1]byte
	if n, _ := io.ReadFull(r, extra[:]); n > 0 {
		return fmt.Errorf("source yielded more than the %d bytes shape %s %s needs", want, formatShape(e.Shape), e.DType)
	}
	return nil
}

// hashingWriter writes to the file and the hash, and counts bytes.
type hashingWriter struct {
	f    *os.File
	h    hash.Hash
	n    int64
	path string
}

func (w *hashingWriter) write(p []byte) error {
	if _, err := w.f.Write(p); err != nil {
		return diskError(err)
	}
	w.h.Write(p)
	w.n += int64(len(p))
	return nil
}

// diskError makes a full disk say so plainly.
func diskError(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("disk full: %w", err)
	}
	return err
}

// syncDir makes a rename durable. Some file systems refuse to sync a
// directory; the file itself is already synced, so that is not an error.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}
