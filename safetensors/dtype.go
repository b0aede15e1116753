// Package safetensors reads and writes the safetensors format as strictly as
// huggingface/safetensors does, without ever holding tensor data in memory:
// readers hand out section readers, the writer streams each tensor from an
// io.Reader.
package safetensors

import "fmt"

// DType is a safetensors dtype name exactly as it appears in a header.
type DType string

// The dtypes the format defines. Anything else in a header is an error.
const (
	BOOL   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	I16    DType = "I16"
	U16    DType = "U16"
	I32    DType = "I32"
	U32    DType = "U32"
	I64    DType = "I64"
	U64    DType = "U64"
	F16    DType = "F16"
	BF16   DType = "BF16"
	F32    DType = "F32"
	F64    DType = "F64"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F8E8M0 DType = "F8_E8M0"
)

var dtypeSizes = map[DType]int{
	BOOL: 1, U8: 1, I8: 1, F8E4M3: 1, F8E5M2: 1, F8E8M0: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	I64: 8, U64: 8, F64: 8,
}

// Size is the number of bytes of one element, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// Valid reports whether d is one of the dtypes the format defines.
func (d DType) Valid() bool { return dtypeSizes[d] != 0 }

// ParseDType checks a dtype string read from a file.
func ParseDType(s string) (DType, error) {
	d := DType(s)
	if !d.Valid() {
		return "", fmt.Errorf("unknown dtype %q", s)
	}
	return d, nil
}
