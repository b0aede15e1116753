package cuda

import (
	"fmt"
	"runtime"
	"unsafe"
)

// TensorMap is an encoded CUtensorMap: 128 opaque bytes that describe a
// global tensor to the bulk tensor copy engine (sm_90+). A kernel takes it
// by value as a `const __grid_constant__` parameter; PackArgs passes its
// 128 bytes.
type TensorMap [16]uint64

// Tensor map element types, swizzles and L2 promotions (the values of the
// driver's CUtensorMapDataType, CUtensorMapSwizzle and
// CUtensorMapL2promotion enums).
const (
	TensorMapUInt8 = 0 // CU_TENSOR_MAP_DATA_TYPE_UINT8 (e4m3 weights: the copy engine moves bytes)
	TensorMapBF16  = 9 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16

	TensorMapSwizzleNone = 0
	TensorMapSwizzle128B = 3 // CU_TENSOR_MAP_SWIZZLE_128B

	TensorMapL2None = 0
	TensorMapL2256B = 3 // CU_TENSOR_MAP_L2_PROMOTION_L2_256B
)

// TensorMapTiled describes a tiled tensor map (cuTensorMapEncodeTiled):
// Dims in elements, innermost first; Strides in bytes for dimensions 1 and
// up (len(Dims)-1 values, multiples of 16); Box the elements copied per
// dimension; elements outside Dims read as zeros.
type TensorMapTiled struct {
	DataType    uint32
	Base        DevicePtr // 16-byte aligned
	Dims        []uint64
	Strides     []uint64
	Box         []uint32
	Swizzle     uint32
	L2Promotion uint32
}

// EncodeTensorMapTiled encodes t (cuTensorMapEncodeTiled, element strides 1,
// no interleave, zero fill). It is a host-side call: no stream work, so it
// is also safe during graph capture.
func (c *Ctx) EncodeTensorMapTiled(t TensorMapTiled) (TensorMap, error) {
	rank := len(t.Dims)
	if rank < 1 || rank > 5 || len(t.Box) != rank || len(t.Strides) != rank-1 {
		return TensorMap{}, fmt.Errorf("cuda: tensor map of rank %d with %d strides and %d box sizes", rank, len(t.Strides), len(t.Box))
	}
	// The driver wants the map 64-byte aligned: encode into an aligned
	// window of a larger buffer.
	buf := make([]uint64, 16+8)
	off := 0
	for uintptr(unsafe.Pointer(&buf[off]))%64 != 0 {
		off++
	}
	dims := append([]uint64(nil), t.Dims...)
	strides := append([]uint64{0}, t.Strides...) // never empty, for the pointer below
	box := append([]uint32(nil), t.Box...)
	elem := make([]uint32, rank)
	for i := range elem {
		elem[i] = 1
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	for _, p := range []unsafe.Pointer{unsafe.Pointer(&buf[0]), unsafe.Pointer(&dims[0]), unsafe.Pointer(&strides[0]), unsafe.Pointer(&box[0]), unsafe.Pointer(&elem[0])} {
		pin.Pin(p)
	}
	const interleaveNone, oobFillNone = 0, 0
	if err := c.call("cuTensorMapEncodeTiled", uintptr(unsafe.Pointer(&buf[off])), uintptr(t.DataType), uintptr(rank),
		uintptr(t.Base), uintptr(unsafe.Pointer(&dims[0])), uintptr(unsafe.Pointer(&strides[1%len(strides)])),
		uintptr(unsafe.Pointer(&box[0])), uintptr(unsafe.Pointer(&elem[0])), interleaveNone, uintptr(t.Swizzle),
		uintptr(t.L2Promotion), oobFillNone); err != nil {
		return TensorMap{}, err
	}
	var m TensorMap
	copy(m[:], buf[off:off+16])
	return m, nil
}
