package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// Module is a loaded CUmodule (cubin, fatbin or PTX image).
type Module uintptr

// Function is a kernel entry point (CUfunction).
type Function uintptr

// LoadModule loads a fatbin/cubin/PTX image (cuModuleLoadData). A PTX image
// must end with a NUL byte; one is added when missing.
func (c *Ctx) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuda: cuModuleLoadData of an empty image")
	}
	// A private copy, so neither the caller nor the GC can change or free it
	// while the module lives (see Device.images).
	img := append(make([]byte, 0, len(image)+1), image...)
	if isText(image) && image[len(image)-1] != 0 {
		img = append(img, 0)
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	m := new(uintptr)
	if err := c.call("cuModuleLoadData", uintptr(unsafe.Pointer(m)), hostPtr(&pin, img)); err != nil {
		return 0, err
	}
	if c.d.images == nil {
		c.d.images = map[Module][]byte{}
	}
	c.d.images[Module(*m)] = img
	return Module(*m), nil
}

// isText guesses a PTX image: fatbin and ELF images start with binary magic.
func isText(b []byte) bool {
	return len(b) > 0 && (b[0] == '/' || b[0] == '.' || b[0] == '\n' || b[0] == ' ' || b[0] == '\t')
}

// UnloadModule unloads a module.
func (c *Ctx) UnloadModule(m Module) error {
	if m == 0 {
		return nil
	}
	err := c.call("cuModuleUnload", uintptr(m))
	delete(c.d.images, m)
	return err
}

// Function looks up a kernel by its (extern "C") name.
func (c *Ctx) Function(m Module, name string) (Function, error) {
	cname := append([]byte(name), 0)
	var pin runtime.Pinner
	defer pin.Unpin()
	f := new(uintptr)
	if err := c.call("cuModuleGetFunction", uintptr(unsafe.Pointer(f)), uintptr(m), hostPtr(&pin, cname)); err != nil {
		return 0, fmt.Errorf("%w (kernel %s)", err, name)
	}
	return Function(*f), nil
}

// SetMaxDynamicShared raises a kernel's dynamic shared memory limit
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), needed above 48 KiB.
func (c *Ctx) SetMaxDynamicShared(f Function, bytes int) error {
	const attrMaxDynamicShared = 8
	return c.call("cuFuncSetAttribute", uintptr(f), attrMaxDynamicShared, uintptr(bytes))
}

// Dim3 is a grid or block shape.
type Dim3 [3]uint32

// Launch queues kernel f on stream s with the given arguments (see PackArgs
// for the accepted types). The driver copies argument values at launch, so
// the packed array is released when Launch returns.
func (c *Ctx) Launch(f Function, grid, block Dim3, sharedBytes uint32, s Stream, args ...any) error {
	for i := range 3 {
		if grid[i] == 0 || block[i] == 0 {
			return fmt.Errorf("cuda: launch with grid %v block %v", grid, block)
		}
	}
	p, err := PackArgs(args...)
	if err != nil {
		return err
	}
	defer p.Release()
	return c.call("cuLaunchKernel", uintptr(f),
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(sharedBytes), uintptr(s), p.Pointer(), 0)
}

// Pointerer is anything with a device address (Buffer[T] is one).
type Pointerer interface{ Ptr() DevicePtr }

// Args is a packed kernel argument array: one 8-byte slot per argument and
// the void** array pointing at the slots, both pinned so the driver can read
// them while the GC runs.
type Args struct {
	vals []uint64
	ptrs []unsafe.Pointer
	pin  runtime.Pinner
}

// PackArgs packs kernel arguments. Accepted: DevicePtr and anything with
// Ptr() DevicePtr (8 bytes), int32, uint32, float32 (4 bytes), int64,
// uint64, float64, uintptr (8 bytes), TensorMap (128 bytes, for a
// __grid_constant__ CUtensorMap parameter). Plain int is refused: its C
// width would be a guess.
func PackArgs(args ...any) (*Args, error) {
	p := &Args{vals: make([]uint64, max(1, len(args))), ptrs: make([]unsafe.Pointer, max(1, len(args)))}
	for i, a := range args {
		var v uint64
		switch x := a.(type) {
		case DevicePtr:
			v = uint64(x)
		case Pointerer:
			v = uint64(x.Ptr())
		case int32:
			v = uint64(uint32(x))
		case uint32:
			v = uint64(x)
		case float32:
			v = uint64(math.Float32bits(x))
		case int64:
			v = uint64(x)
		case uint64:
			v = x
		case float64:
			v = math.Float64bits(x)
		case uintptr:
			v = uint64(x)
		case TensorMap:
			// 128 bytes: the slot points at a pinned copy instead.
			m := new(TensorMap)
			*m = x
			p.pin.Pin(m)
			p.ptrs[i] = unsafe.Pointer(m)
			continue
		default:
			return nil, fmt.Errorf("cuda: kernel argument %d has type %T (use int32, uint32, int64, uint64, float32, float64 or a device pointer)", i, a)
		}
		// Little-endian: a 4-byte argument read from the slot's start sees
		// its low half, which holds the value.
		p.vals[i] = v
		p.ptrs[i] = unsafe.Pointer(&p.vals[i])
	}
	p.pin.Pin(&p.vals[0])
	p.pin.Pin(&p.ptrs[0])
	return p, nil
}

// Pointer is the void** for cuLaunchKernel.
func (p *Args) Pointer() uintptr { return uintptr(unsafe.Pointer(&p.ptrs[0])) }

// Release unpins the arrays.
func (p *Args) Release() { p.pin.Unpin() }

// Value returns argument i's slot (for tests).
func (p *Args) Value(i int) uint64 { return p.vals[i] }
