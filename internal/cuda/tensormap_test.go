package cuda

import (
	"strings"
	"testing"
	"unsafe"
)

func TestPackArgsTensorMap(t *testing.T) {
	var m TensorMap
	for i := range m {
		m[i] = uint64(i)*0x0101010101010101 + 7
	}
	p, err := PackArgs(int32(5), m, uint64(9))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if got := *(*TensorMap)(p.ptrs[1]); got != m {
		t.Fatalf("tensor map slot holds %x, want %x", got, m)
	}
	if p.Value(0) != 5 || p.Value(2) != 9 {
		t.Fatalf("slots around the tensor map: %d %d", p.Value(0), p.Value(2))
	}
	if unsafe.Sizeof(m) != 128 {
		t.Fatalf("TensorMap is %d bytes, want 128 (CUtensorMap)", unsafe.Sizeof(m))
	}
}

func TestEncodeTensorMapTiled(t *testing.T) {
	d := testDevice(t)
	if d.Major < 9 {
		t.Skipf("tensor maps need compute capability 9.0, device has %d.%d", d.Major, d.Minor)
	}
	b, err := Alloc[uint16](d, 4*64*256)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	spec := TensorMapTiled{DataType: TensorMapBF16, Base: b.Ptr(), Dims: []uint64{256, 64, 4}, Strides: []uint64{512, 512 * 64},
		Box: []uint32{64, 64, 1}, Swizzle: TensorMapSwizzle128B, L2Promotion: TensorMapL2256B}
	var m TensorMap
	if err := d.Do(func(c *Ctx) (err error) { m, err = c.EncodeTensorMapTiled(spec); return err }); err != nil {
		t.Fatal(err)
	}
	if m == (TensorMap{}) {
		t.Fatal("encoded tensor map is all zeros")
	}
	bad := spec
	bad.Strides = []uint64{500, 512 * 64} // not a multiple of 16
	if err := d.Do(func(c *Ctx) error { _, err := c.EncodeTensorMapTiled(bad); return err }); err == nil || !strings.Contains(err.Error(), "cuTensorMapEncodeTiled") {
		t.Fatalf("stride 500 accepted: %v", err)
	}
	bad = spec
	bad.Box = []uint32{64, 64}
	if err := d.Do(func(c *Ctx) error { _, err := c.EncodeTensorMapTiled(bad); return err }); err == nil {
		t.Fatal("rank-2 box for a rank-3 map accepted")
	}
}
