// Package cuda is a cgo-free binding of the CUDA driver API (libcuda.so.1)
// through purego. Nothing here needs CUDA at build time: the library is
// opened at run time, and a machine without it gets ErrNoDriver so callers
// can fall back to the CPU.
//
// All driver calls run on one goroutine locked to its OS thread, which owns
// the device's primary context (see Device). Device memory is addressed by
// DevicePtr; typed device arrays are Buffer[T].
package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDriver means libcuda.so.1 could not be opened: no NVIDIA driver here.
var ErrNoDriver = errors.New("cuda: no NVIDIA driver (libcuda.so.1 not found)")

// ErrNoDevice means the driver is present but reports no usable GPU.
var ErrNoDevice = errors.New("cuda: the driver reports no CUDA device")

// LibraryName is the file dlopen'd for the driver API.
const LibraryName = "libcuda.so.1"

// Error is a failed driver call: the call's name and CUDA's result code.
type Error struct {
	Call   string
	Code   int
	Name   string // e.g. CUDA_ERROR_OUT_OF_MEMORY
	Detail string // cuGetErrorString's text
}

func (e *Error) Error() string {
	if e.Detail != "" && e.Detail != e.Name {
		return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Detail)
	}
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code)
}

// Is makes errors.Is(err, ErrNoDevice) true for CUDA_ERROR_NO_DEVICE.
func (e *Error) Is(target error) bool {
	return target == ErrNoDevice && e.Code == errNoDevice
}

const (
	errNoDevice = 100 // CUDA_ERROR_NO_DEVICE
)

// symbols lists every entry point this package calls. Each is resolved with
// Dlsym when the library is opened, so a driver too old for one is an error
// at Open, never a panic at the call. alternatives name fallbacks.
var symbols = []struct {
	name string
	alts []string
}{
	{name: "cuInit"},
	{name: "cuDriverGetVersion"},
	{name: "cuGetErrorName"},
	{name: "cuGetErrorString"},
	{name: "cuDeviceGetCount"},
	{name: "cuDeviceGet"},
	{name: "cuDeviceGetName"},
	{name: "cuDeviceGetAttribute"},
	{name: "cuDeviceTotalMem_v2"},
	{name: "cuDevicePrimaryCtxRetain"},
	{name: "cuDevicePrimaryCtxRelease_v2"},
	{name: "cuCtxSetCurrent"},
	{name: "cuCtxSynchronize"},
	{name: "cuMemGetInfo_v2"},
	{name: "cuMemAlloc_v2"},
	{name: "cuMemFree_v2"},
	{name: "cuMemAllocHost_v2"},
	{name: "cuMemFreeHost"},
	{name: "cuMemcpyHtoD_v2"},
	{name: "cuMemcpyDtoH_v2"},
	{name: "cuMemcpyDtoD_v2"},
	{name: "cuMemcpyHtoDAsync_v2"},
	{name: "cuMemcpyDtoHAsync_v2"},
	{name: "cuMemsetD8_v2"},
	{name: "cuMemsetD32_v2"},
	{name: "cuMemsetD32Async"},
	{name: "cuModuleLoadData"},
	{name: "cuModuleUnload"},
	{name: "cuModuleGetFunction"},
	{name: "cuFuncSetAttribute"},
	{name: "cuLaunchKernel"},
	{name: "cuTensorMapEncodeTiled"},
	{name: "cuStreamCreate"},
	{name: "cuStreamDestroy_v2"},
	{name: "cuStreamSynchronize"},
	{name: "cuEventCreate"},
	{name: "cuEventDestroy_v2"},
	{name: "cuEventRecord"},
	{name: "cuEventSynchronize"},
	{name: "cuEventElapsedTime", alts: []string{"cuEventElapsedTime_v2"}},
}

// driver is the opened library and its resolved entry points.
type driver struct {
	handle uintptr
	fn     map[string]uintptr
}

var (
	loadOnce  sync.Once
	loaded    *driver
	loadError error
)

// load opens libcuda once per process.
func load() (*driver, error) {
	loadOnce.Do(func() { loaded, loadError = openLibrary(LibraryName) })
	return loaded, loadError
}

// openLibrary dlopens path and resolves every symbol; a missing library is
// ErrNoDriver, a missing symbol an error naming it.
func openLibrary(path string) (*driver, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		// dlopen's own "cannot open shared object file" only repeats
		// ErrNoDriver's words; anything else (a broken install) it adds.
		if strings.Contains(err.Error(), "cannot open shared object file") {
			return nil, ErrNoDriver
		}
		return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	d := &driver{handle: h, fn: make(map[string]uintptr, len(symbols))}
	for _, s := range symbols {
		addr, err := lookup(h, s.name, s.alts)
		if err != nil {
			return nil, fmt.Errorf("cuda: %s in %s: %w (driver too old?)", s.name, path, err)
		}
		d.fn[s.name] = addr
	}
	return d, nil
}

func lookup(h uintptr, name string, alts []string) (uintptr, error) {
	addr, err := purego.Dlsym(h, name)
	if err == nil && addr != 0 {
		return addr, nil
	}
	for _, a := range alts {
		if addr, err2 := purego.Dlsym(h, a); err2 == nil && addr != 0 {
			return addr, nil
		}
	}
	if err == nil {
		err = errors.New("symbol not found")
	}
	return 0, err
}

// call invokes a driver function and turns its CUresult into an error.
// uintptrescapes: see Ctx.call.
//
//go:uintptrescapes
func (d *driver) call(name string, args ...uintptr) error {
	fn, ok := d.fn[name]
	if !ok || fn == 0 {
		return fmt.Errorf("cuda: %s was not resolved", name)
	}
	r, _, _ := purego.SyscallN(fn, args...)
	if code := int(int32(r)); code != 0 {
		return d.errorFor(name, code)
	}
	return nil
}

// errorFor names a CUresult through cuGetErrorName/String.
func (d *driver) errorFor(call string, code int) *Error {
	e := &Error{Call: call, Code: code, Name: fmt.Sprintf("CUresult %d", code)}
	var p uintptr
	if fn := d.fn["cuGetErrorName"]; fn != 0 {
		if r, _, _ := purego.SyscallN(fn, uintptr(code), uintptr(unsafe.Pointer(&p))); r == 0 && p != 0 {
			e.Name = cString(p, 128)
		}
	}
	p = 0
	if fn := d.fn["cuGetErrorString"]; fn != 0 {
		if r, _, _ := purego.SyscallN(fn, uintptr(code), uintptr(unsafe.Pointer(&p))); r == 0 && p != 0 {
			e.Detail = cString(p, 512)
		}
	}
	return e
}

// cString copies a NUL-terminated C string (static driver memory) of at most
// limit bytes.
func cString(p uintptr, limit int) string {
	// Reinterpret the address's bits as a pointer without a uintptr ->
	// unsafe.Pointer conversion: the memory is C's, never moved by Go.
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	var b []byte
	for i := range limit {
		c := *(*byte)(unsafe.Add(base, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// Available reports whether a CUDA device can be used: nil, or an error that
// is ErrNoDriver or ErrNoDevice (errors.Is) when the CPU should be used.
func Available() error {
	d, err := load()
	if err != nil {
		return err
	}
	if err := d.call("cuInit", 0); err != nil {
		return err
	}
	var n int32
	if err := d.call("cuDeviceGetCount", uintptr(unsafe.Pointer(&n))); err != nil {
		return err
	}
	if n == 0 {
		return ErrNoDevice
	}
	return nil
}
