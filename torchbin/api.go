// Package torchbin reads PyTorch checkpoints written by torch.save >= 1.6 (zip
// archives holding data.pkl and one entry per storage) without executing
// pickle code and without loading storages: each tensor is mapped to its byte
// range inside the uncompressed zip entry.
package torchbin

import (
	"fmt"
	"github.com/moeprep/moeprep/internal/safeio"
	"io"

	"github.com/moeprep/moeprep/safetensors"
)

// Tensor is one entry of a state dict. Data yields the tensor's bytes in
// row-major contiguous order (storage offset and strides already applied).
type Tensor struct {
	Name  string
	DType safetensors.DType
	Shape []int64
	Data  io.ReaderAt
}

// NumBytes is the size of the tensor's row-major bytes.
func (t Tensor) NumBytes() int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= d // checked against overflow when the file was opened
	}
	return n
}

// File is an open torch zip checkpoint.
type File struct {
	Path    string
	Tensors []Tensor // in state-dict order
	// Skipped lists state-dict keys whose values were plain scalars (int,
	// float, str, bool, None) rather than tensors.
	Skipped []string

	closer io.Closer
	byName map[string]int
}

// Open reads path's pickle and maps every tensor; it loads no storage.
func Open(path string) (*File, error) {
	f, err := safeio.Open(path) // a FIFO would block os.Open itself
	if err != nil {
		return nil, err // names the file
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	tf, err := openReader(path, f, st.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	tf.closer = f
	return tf, nil
}

// openReader does Open's work over any ReaderAt of the given size.
func openReader(path string, r io.ReaderAt, size int64) (*File, error) {
	a, err := openArchive(r, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pkl, err := a.readPickle()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sd, err := guard(func() (*stateDict, error) { return unpickle(pkl, a.lookup) })
	if err != nil {
		return nil, fmt.Errorf("%s: data.pkl: %w", path, err)
	}
	f := &File{Path: path, Skipped: sd.skipped, byName: make(map[string]int, len(sd.tensors))}
	layouts := make([]*layout, len(sd.tensors))
	for i, nv := range sd.tensors {
		l, err := checkView(nv.view)
		if err != nil {
			return nil, fmt.Errorf("%s: tensor %q: %w", path, nv.name, err)
		}
		layouts[i] = l
	}
	if err := checkAliasing(sd.tensors, layouts); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, nv := range sd.tensors {
		f.byName[nv.name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, Tensor{
			Name:  nv.name,
			DType: nv.view.dtype,
			Shape: append([]int64{}, nv.view.shape...),
			Data:  layouts[i].reader(r),
		})
	}
	return f, nil
}

// parseGuarded is parseStateDict behind guard.
func parseGuarded(pkl []byte, lookup storageLookup) (*stateDict, error) {
	return guard(func() (*stateDict, error) { return parseStateDict(pkl, lookup) })
}

// guard is a last line of defence: scanPickle rules out every gopickle
// crash we know of, but gopickle is third-party code, and a crash there
// must still become an error naming the file.
func guard(parse func() (*stateDict, error)) (sd *stateDict, err error) {
	defer func() {
		if p := recover(); p != nil {
			sd, err = nil, shortError(fmt.Errorf("malformed pickle (unpickler failed: %v)", p))
		}
	}()
	return parse()
}

// Lookup finds a tensor by name.
func (f *File) Lookup(name string) (Tensor, bool) {
	i, ok := f.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.Tensors[i], true
}

// Close closes the underlying file.
func (f *File) Close() error {
	if f == nil || f.closer == nil {
		return nil
	}
	c := f.closer
	f.closer = nil
	return c.Close()
}

// IndexFileName is the index of a sharded torch checkpoint.
const IndexFileName = "pytorch_model.bin.index.json"
