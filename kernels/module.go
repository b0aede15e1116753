package kernels

import (
	"fmt"
	"sync"

	"github.com/moeprep/moeprep/internal/cuda"
)

// Module is one kernel family's fatbin loaded on a device. Load caches one
// Module per (device, family); modules live as long as the device.
//
// Typical use by a kernel family's Go API:
//
//	m, err := kernels.Load(dev, "gate")
//	err = m.Launch("moe_gate_f32", kernels.Grid(t), kernels.Block(256), 0, stream,
//		logits, bias, ids, weights, int32(t), float32(x))
//
// Arguments follow cuda.PackArgs: *cuda.Buffer[T] or cuda.DevicePtr for
// pointers, int32/uint32/float32/int64/uint64/float64 for values (plain int
// is refused). Launch is asynchronous on stream (0 = legacy default stream);
// Buffer.Download or Device.Synchronize waits for it.
type Module struct {
	dev    *cuda.Device
	family string
	mod    cuda.Module
	fns    map[string]cuda.Function // touched only on the device's owner thread
	shmem  map[string]uint32        // dynamic shared memory limit raised per kernel (owner thread)
}

type moduleKey struct {
	dev    *cuda.Device
	family string
}

var (
	modulesMu sync.Mutex
	modules   = map[moduleKey]*Module{}
)

// Load returns family's module on dev, loading its fatbin on first use.
// Inside a Do closure use LoadCtx.
func Load(dev *cuda.Device, family string) (*Module, error) {
	var m *Module
	err := dev.Do(func(c *cuda.Ctx) error {
		var e error
		m, e = LoadCtx(c, family)
		return e
	})
	return m, err
}

// LoadCtx is Load from inside a Do closure of the module's device.
func LoadCtx(c *cuda.Ctx, family string) (*Module, error) {
	dev := c.Device()
	modulesMu.Lock()
	defer modulesMu.Unlock()
	key := moduleKey{dev, family}
	if m, ok := modules[key]; ok {
		return m, nil
	}
	img, err := Image(family)
	if err != nil {
		return nil, err
	}
	m := &Module{dev: dev, family: family, fns: map[string]cuda.Function{}, shmem: map[string]uint32{}}
	if m.mod, err = c.LoadModule(img); err != nil {
		return nil, fmt.Errorf("kernels: loading %s.fatbin on %s: %w", family, dev, err)
	}
	modules[key] = m
	return m, nil
}

// Device is the module's device.
func (m *Module) Device() *cuda.Device { return m.dev }

// Function returns kernel fn; call it only inside a Do closure of m's device.
func (m *Module) Function(c *cuda.Ctx, fn string) (cuda.Function, error) {
	if f, ok := m.fns[fn]; ok {
		return f, nil
	}
	f, err := c.Function(m.mod, fn)
	if err != nil {
		return 0, fmt.Errorf("kernels: %s.fatbin: %w", m.family, err)
	}
	m.fns[fn] = f
	return f, nil
}

// LaunchCtx queues kernel fn from inside a Do closure of m's device.
func (m *Module) LaunchCtx(c *cuda.Ctx, fn string, grid, block [3]uint32, shmem uint32, stream cuda.Stream, args ...any) error {
	f, err := m.Function(c, fn)
	if err != nil {
		return err
	}
	// Above 48 KiB of dynamic shared memory a kernel must opt in first
	// (once per kernel and size; the attribute is not a stream operation,
	// so this is also safe during graph capture).
	if shmem > 48<<10 && m.shmem[fn] < shmem {
		if err := c.SetMaxDynamicShared(f, int(shmem)); err != nil {
			return fmt.Errorf("kernels: %s: raising dynamic shared memory to %d B: %w", fn, shmem, err)
		}
		m.shmem[fn] = shmem
	}
	if err := c.Launch(f, grid, block, shmem, stream, args...); err != nil {
		return fmt.Errorf("kernels: launching %s (grid %v, block %v, %d B shared): %w", fn, grid, block, shmem, err)
	}
	return nil
}

// Launch queues kernel fn on stream from any goroutine.
func (m *Module) Launch(fn string, grid, block [3]uint32, shmem uint32, stream cuda.Stream, args ...any) error {
	return m.dev.Do(func(c *cuda.Ctx) error {
		return m.LaunchCtx(c, fn, grid, block, shmem, stream, args...)
	})
}

// Grid is a 1-D grid of n blocks; Block a 1-D block of n threads.
func Grid(n int) [3]uint32  { return [3]uint32{uint32(n), 1, 1} }
func Block(n int) [3]uint32 { return [3]uint32{uint32(n), 1, 1} }

// CeilDiv is the number of size-b pieces covering n.
func CeilDiv(n, b int) int { return (n + b - 1) / b }
