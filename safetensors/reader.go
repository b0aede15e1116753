package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/moeprep/moeprep/internal/safeio"
)

// File is an open safetensors file. Only the header is held in memory; tensor
// bytes are read on demand with pread through Section or ReaderAt.
type File struct {
	Path      string
	Metadata  map[string]string
	Tensors   []TensorInfo // in data-offset order
	DataStart int64        // absolute file offset of the data section

	fh *os.File
	// byName indexes Tensors by name, built on the first Lookup: a
	// checkpoint of 200,000 tensors that reads them in order never needs
	// it, and a map kept per open file would cost about 40 bytes a tensor.
	byNameOnce sync.Once
	byName     map[string]int
}

// Open reads and checks the header of path. Every error names path. Anything
// but a regular file is refused without blocking (a named pipe would block
// a read forever, a device can be endless).
func Open(path string) (*File, error) {
	fh, err := safeio.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
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
	// A header that does not open as a JSON object is refused from its
	// first bytes, before the rest is read: a sparse file that claims a
	// 100 MB header of zeros then costs nothing.
	var head [headPeek]byte
	if _, err := r.ReadAt(head[:min(n, headPeek)], 8); err != nil {
		return nil, fmt.Errorf("reading %d-byte header: %w", n, err)
	}
	if err := checkOpening(head[:min(n, headPeek)]); err != nil {
		return nil, err
	}
	header := make([]byte, n)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("reading %d-byte header: %w", n, err)
	}
	dataStart := 8 + int64(n)
	meta, tensors, err := parseHeader(header, size-dataStart)
	if err != nil {
		return nil, err
	}
	return &File{Metadata: meta, Tensors: tensors, DataStart: dataStart}, nil
}

// headPeek is how much of a header is looked at before the rest is read.
const headPeek = 4096

// checkOpening refuses the first bytes of a header that cannot open a
// JSON object; leading whitespace alone says nothing yet.
func checkOpening(head []byte) error {
	s := scanner{b: head, what: "header"}
	switch c := s.next(); {
	case s.atEnd() || c == '{':
		return nil
	case kindOf(c) != "":
		return fmt.Errorf("header is %s, not a JSON object", kindOf(c))
	}
	return s.bad()
}

// Lookup finds a tensor by name.
func (f *File) Lookup(name string) (TensorInfo, bool) {
	f.byNameOnce.Do(func() {
		f.byName = make(map[string]int, len(f.Tensors))
		for i, t := range f.Tensors {
			f.byName[t.Name] = i // the header's names are unique (parseHeader)
		}
	})
	i, ok := f.byName[name]
	if !ok || i >= len(f.Tensors) {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// ForgetTensors drops the header's tensor list (and its lookup) for a
// caller that has taken what it needs from it (checkpoint.Open keeps each
// tensor's name, shape and section itself): the list costs about 90 bytes a
// tensor on top of the caller's own. Reads through ReaderAt and Close still
// work; Lookup and Section find nothing after it. Call it before anything
// else can use f.
func (f *File) ForgetTensors() {
	f.Tensors = nil
	f.byNameOnce.Do(func() {})
	f.byName = nil
}

// Section returns a reader over exactly the named tensor's bytes.
func (f *File) Section(name string) (*io.SectionReader, error) {
	t, ok := f.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.Path, name)
	}
	return f.SectionOf(t)
}

// SectionOf returns a reader over exactly the bytes of t, one of
// f.Tensors, without looking its name up.
func (f *File) SectionOf(t TensorInfo) (*io.SectionReader, error) {
	if f.fh == nil {
		return nil, fmt.Errorf("%s: tensor %q: file is closed", f.Path, t.Name)
	}
	return io.NewSectionReader(f.fh, f.DataStart+t.Begin, t.NumBytes()), nil
}

// ReadTensor reads the named tensor's bytes whole.
func (f *File) ReadTensor(name string) ([]byte, error) {
	sec, err := f.Section(name)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(sec)
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
