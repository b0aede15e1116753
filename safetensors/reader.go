package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// File is an open safetensors file. Only the header is held in memory; tensor
// bytes are read on demand with pread through Section or ReaderAt.
type File struct {
	Path      string
	Metadata  map[string]string
	Tensors   []TensorInfo // in data-offset order
	DataStart int64        // absolute file offset of the data section

	fh     *os.File
	byName map[string]int // index into Tensors
}

// Open reads and checks the header of path. Every error names path.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		fh.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	f, err := readFile(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Path, f.fh = path, fh
	return f, nil
}

// readFile reads and checks the header of a size-byte file read through r.
// It is Open without the file system, so the fuzzer can drive it.
func readFile(r io.ReaderAt, size int64) (*File, error) {
	if size < 8 {
		return nil, fmt.Errorf("file is %d bytes, shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("header length %d is over the %d-byte limit (not a safetensors file?)", n, MaxHeaderSize)
	}
	if int64(n) > size-8 {
		return nil, fmt.Errorf("header length %d runs past the end of the %d-byte file", n, size)
	}
	header := make([]byte, n)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("reading %d-byte header: %w", n, err)
	}
	dataStart := 8 + int64(n)
	meta, tensors, err := ParseHeader(header, size-dataStart)
	if err != nil {
		return nil, err
	}
	f := &File{Metadata: meta, Tensors: tensors, DataStart: dataStart, byName: make(map[string]int, len(tensors))}
	for i, t := range tensors {
		f.byName[t.Name] = i
	}
	return f, nil
}

// Lookup finds a tensor by name.
func (f *File) Lookup(name string) (TensorInfo, bool) {
	if f.byName != nil {
		i, ok := f.byName[name]
		if !ok {
			return TensorInfo{}, false
		}
		return f.Tensors[i], true
	}
	for _, t := range f.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// Section returns a reader over exactly the named tensor's bytes.
func (f *File) Section(name string) (*io.SectionReader, error) {
	t, ok := f.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.Path, name)
	}
	if f.fh == nil {
		return nil, fmt.Errorf("%s: tensor %q: file is closed", f.Path, name)
	}
	return io.NewSectionReader(f.fh, f.DataStart+t.Begin, t.NumBytes()), nil
}

// ReaderAt reads the whole file at absolute offsets (data starts at
// DataStart); it is valid until Close.
func (f *File) ReaderAt() io.ReaderAt { return f.fh }

// Close closes the underlying file. Closing twice is harmless.
func (f *File) Close() error {
	if f.fh == nil {
		return nil
	}
	err := f.fh.Close()
	f.fh = nil
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	return nil
}
