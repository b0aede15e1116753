package testkit

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// The safetensors format, read and written here on its own, without
// moeprep's safetensors package: tests of what moeprep writes (and of files
// built to break it) must not trust the code under test.

// STTensor is one tensor's entry in a safetensors header.
type STTensor struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// STHeader is a safetensors file's header.
type STHeader struct {
	Tensors  map[string]STTensor
	Metadata map[string]string
	// DataStart is where the data begins in the file: 8 + the header's
	// length. Tensor offsets count from it.
	DataStart int64
}

// maxSTHeader bounds the headers read here, as safetensors itself does.
const maxSTHeader = 100_000_000

// ParseSTHeader parses the header at the start of b, a whole file or its
// first DataStart bytes.
func ParseSTHeader(b []byte) (*STHeader, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%d bytes, no header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxSTHeader || uint64(len(b)-8) < n {
		return nil, fmt.Errorf("header of %d bytes in %d", n, len(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, err
	}
	h := &STHeader{Tensors: map[string]STTensor{}, DataStart: 8 + int64(n)}
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &h.Metadata); err != nil {
				return nil, fmt.Errorf("__metadata__: %v", err)
			}
			continue
		}
		var e STTensor
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("%s: %v", k, err)
		}
		h.Tensors[k] = e
	}
	return h, nil
}

// ReadSTHeader reads only the header of the safetensors file path.
func ReadSTHeader(path string) (*STHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	size := binary.LittleEndian.Uint64(n[:])
	if size > maxSTHeader {
		return nil, fmt.Errorf("%s: header of %d bytes", path, size)
	}
	b := make([]byte, 8+size)
	copy(b, n[:])
	if _, err := io.ReadFull(f, b[8:]); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	h, err := ParseSTHeader(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return h, nil
}

// STHead is the start of a safetensors file whose header is the JSON h: its
// length, then h padded with spaces to a multiple of 8 bytes, as writers do.
// The data follows.
func STHead[T ~string | ~[]byte](h T) []byte {
	hb := []byte(h)
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(hb))), hb...)
}

// Bytes is the safetensors file of this header (DataStart is not used) and
// data.
func (h *STHeader) Bytes(data []byte) ([]byte, error) {
	m := map[string]any{}
	for k, v := range h.Tensors {
		m[k] = v
	}
	if h.Metadata != nil {
		m["__metadata__"] = h.Metadata
	}
	hb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(STHead(hb), data...), nil
}
