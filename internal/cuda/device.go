package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Device is one GPU with its primary context, owned by a goroutine locked to
// its OS thread: the driver's current context is per thread, so every
// driver call goes through Do, which runs a closure on that goroutine.
// Device's methods are safe for concurrent use; a Ctx is valid only inside
// the Do closure it was passed to. Calling a Device method (Do included)
// from inside a Do closure deadlocks: use the Ctx there.
type Device struct {
	Ordinal int
	Name    string
	Major   int // compute capability
	Minor   int
	SMs     int
	Memory  uint64 // total device memory, bytes

	drv   *driver
	dev   int32
	ctx   uintptr
	calls chan request
	mu    sync.Mutex // guards closed and sends on calls
	done  chan struct{}
	close bool

	// images keeps each loaded module's image referenced until it is
	// unloaded: with lazy module loading (CUDA's default since 12) the driver
	// may read the image after cuModuleLoadData returns, so the Go memory must
	// not be collected. Touched only on the owner thread.
	images map[Module][]byte
}

type request struct {
	fn    func(*Ctx) error
	reply chan error
}

// Ctx is the handle a Do closure receives; its methods issue driver calls on
// the owning thread.
type Ctx struct {
	d     *Device
	valid bool
}

// Open starts the owner goroutine for device ordinal, initialises the
// driver and makes the primary context current on that thread. Without a
// driver it returns an error wrapping ErrNoDriver; without a GPU, ErrNoDevice.
func Open(ordinal int) (*Device, error) {
	drv, err := load()
	if err != nil {
		return nil, err
	}
	d := &Device{Ordinal: ordinal, drv: drv, calls: make(chan request), done: make(chan struct{})}
	started := make(chan error, 1)
	go d.loop(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return d, nil
}

// loop is the owner goroutine: it never leaves its OS thread.
func (d *Device) loop(started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.done)
	if err := d.init(); err != nil {
		started <- err
		return
	}
	started <- nil
	for req := range d.calls {
		req.reply <- d.run(req.fn)
	}
	d.drv.call("cuCtxSynchronize")
	d.drv.call("cuDevicePrimaryCtxRelease_v2", uintptr(d.dev))
}

func (d *Device) init() error {
	if err := d.drv.call("cuInit", 0); err != nil {
		return err
	}
	var n int32
	if err := d.drv.call("cuDeviceGetCount", uintptr(unsafe.Pointer(&n))); err != nil {
		return err
	}
	if n == 0 {
		return ErrNoDevice
	}
	if d.Ordinal < 0 || d.Ordinal >= int(n) {
		return fmt.Errorf("cuda: device %d requested, %d present", d.Ordinal, n)
	}
	if err := d.drv.call("cuDeviceGet", uintptr(unsafe.Pointer(&d.dev)), uintptr(d.Ordinal)); err != nil {
		return err
	}
	name := make([]byte, 256)
	if err := d.drv.call("cuDeviceGetName", uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(d.dev)); err != nil {
		return err
	}
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	d.Name = string(name)
	for _, a := range []struct {
		attr int
		dst  *int
	}{{attrCCMajor, &d.Major}, {attrCCMinor, &d.Minor}, {attrSMCount, &d.SMs}} {
		var v int32
		if err := d.drv.call("cuDeviceGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(a.attr), uintptr(d.dev)); err != nil {
			return err
		}
		*a.dst = int(v)
	}
	if err := d.drv.call("cuDeviceTotalMem_v2", uintptr(unsafe.Pointer(&d.Memory)), uintptr(d.dev)); err != nil {
		return err
	}
	if err := d.drv.call("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev)); err != nil {
		return err
	}
	return d.drv.call("cuCtxSetCurrent", d.ctx)
}

// CUdevice_attribute values used here.
const (
	attrSMCount = 16
	attrCCMajor = 75
	attrCCMinor = 76
)

// run executes one closure, turning a panic into an error so the owner
// goroutine survives.
func (d *Device) run(fn func(*Ctx) error) (err error) {
	c := &Ctx{d: d, valid: true}
	defer func() {
		c.valid = false
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: panic in device call: %v", r)
		}
	}()
	return fn(c)
}

// ErrClosed is returned by calls on a closed Device.
var ErrClosed = errors.New("cuda: device is closed")

// Do runs fn on the device's owner thread and returns its error.
func (d *Device) Do(fn func(c *Ctx) error) error {
	reply := make(chan error, 1)
	d.mu.Lock()
	if d.close {
		d.mu.Unlock()
		return ErrClosed
	}
	d.calls <- request{fn: fn, reply: reply}
	d.mu.Unlock()
	return <-reply
}

// Close synchronises, releases the primary context and stops the owner
// goroutine. Buffers not freed before are released with the context.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.close {
		d.mu.Unlock()
		return nil
	}
	d.close = true
	close(d.calls)
	d.mu.Unlock()
	<-d.done
	return nil
}

// String describes the device in one line.
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d%d, %d SMs, %.1f GiB)", d.Ordinal, d.Name, d.Major, d.Minor, d.SMs, float64(d.Memory)/(1<<30))
}

// Synchronize waits for all work on the device.
func (d *Device) Synchronize() error {
	return d.Do(func(c *Ctx) error { return c.Synchronize() })
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.Do(func(c *Ctx) error {
		var e error
		free, total, e = c.MemInfo()
		return e
	})
	return free, total, err
}

// call is the Ctx's gate to the driver: it refuses use outside Do.
//
// uintptrescapes: callers pass out-parameters as uintptr(unsafe.Pointer(p)).
// Without the directive such a p may live on the goroutine's stack, which
// can be copied (grown) before the C call: the driver would then write the
// old copy and the caller read the new one (a handle of 0).
//
//go:uintptrescapes
func (c *Ctx) call(name string, args ...uintptr) error {
	if c == nil || !c.valid {
		return fmt.Errorf("cuda: %s called with a Ctx outside its Device.Do", name)
	}
	return c.d.drv.call(name, args...)
}

// Device returns the Ctx's device.
func (c *Ctx) Device() *Device { return c.d }

// Synchronize waits for all work in the context (cuCtxSynchronize).
func (c *Ctx) Synchronize() error { return c.call("cuCtxSynchronize") }

// MemInfo returns free and total device memory (cuMemGetInfo_v2).
func (c *Ctx) MemInfo() (free, total uint64, err error) {
	fr, to := new(uint64), new(uint64)
	err = c.call("cuMemGetInfo_v2", uintptr(unsafe.Pointer(fr)), uintptr(unsafe.Pointer(to)))
	return *fr, *to, err
}
