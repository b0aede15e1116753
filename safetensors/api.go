package safetensors

// The package's shared types. Reading is in reader.go and header.go, writing
// in writer.go, sharded checkpoints in index.go.

import "io"

// TensorInfo is one header entry. Begin and End are the data_offsets,
// relative to the start of the data section.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// NumBytes is End-Begin, which the reader has checked equals
// product(Shape)*DType.Size().
func (t TensorInfo) NumBytes() int64 { return t.End - t.Begin }

// Entry is one tensor to write. Open must yield exactly NumBytes bytes.
type Entry struct {
	Name  string
	DType DType
	Shape []int64
	Open  func() (io.Reader, error)
}

// WriteResult describes a finished file.
type WriteResult struct {
	Path   string
	Size   int64
	SHA256 string // hex of the whole file
}

// IndexFileName is the index of a sharded safetensors checkpoint.
const IndexFileName = "model.safetensors.index.json"

// Index is model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// Sharded is an opened sharded checkpoint whose index and shards agree both ways.
type Sharded struct {
	Dir    string
	Index  *Index
	Shards []*File // in sorted file-name order
}
