package cuda

import (
	"syscall"
	"testing"

	"github.com/ebitengine/purego"
)

// fakeDriver maps driver entry points onto libc's pipe(int fd[2]), which
// ignores its other arguments, writes 8 bytes (two descriptors) through its
// first one and returns 0: a stand-in for a driver call that returns a
// handle through an out-parameter.
func fakeDriver(t *testing.T, names ...string) *Ctx {
	t.Helper()
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("no libc.so.6: %v", err)
	}
	pipe, err := purego.Dlsym(libc, "pipe")
	if err != nil {
		t.Skipf("no pipe in libc: %v", err)
	}
	d := &driver{fn: map[string]uintptr{}}
	for _, n := range names {
		d.fn[n] = pipe
	}
	return &Ctx{d: &Device{drv: d}, valid: true}
}

// closePipe closes the two descriptors pipe wrote into v.
func closePipe(v uint64) {
	syscall.Close(int(int32(v)))
	syscall.Close(int(int32(v >> 32)))
}

// atDepth runs fn in a fresh goroutine (a small stack) under n frames of
// 128 bytes, so over a range of n the stack has to grow inside fn's driver
// call chain, between the out-parameter's address being taken and the C
// call writing through it.
func atDepth(n int, fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		deep(n, fn)
	}()
	<-done
}

//go:noinline
func deep(n int, fn func()) byte {
	var pad [128]byte
	if n == 0 {
		fn()
		return pad[0]
	}
	pad[n%128] = byte(n)
	return deep(n-1, fn) + pad[(n+1)%128]
}

// TestOutParamsSurviveStackGrowth: every handle a driver call returns
// through a pointer must be read back from the memory the driver wrote. A
// stack-allocated out-parameter whose address travelled as a uintptr was
// left behind when the goroutine's stack was copied (the driver wrote the
// old copy, Go read the new one: a module handle of 0, then
// CUDA_ERROR_INVALID_HANDLE from cuModuleGetFunction).
func TestOutParamsSurviveStackGrowth(t *testing.T) {
	c := fakeDriver(t, "cuModuleLoadData", "cuModuleGetFunction", "cuMemAlloc_v2", "cuStreamCreate", "cuEventCreate")
	calls := []struct {
		name string
		fn   func() (uint64, error)
	}{
		{"LoadModule", func() (uint64, error) { m, err := c.LoadModule([]byte{0x50, 0xed}); return uint64(m), err }},
		{"Function", func() (uint64, error) { f, err := c.Function(1, "k"); return uint64(f), err }},
		{"Alloc", func() (uint64, error) { p, err := c.Alloc(8); return uint64(p), err }},
		{"NewStream", func() (uint64, error) { s, err := c.NewStream(); return uint64(s), err }},
		{"NewEvent", func() (uint64, error) { e, err := c.NewEvent(); return uint64(e), err }},
	}
	for _, call := range calls {
		lost := 0
		for n := range 200 {
			var v uint64
			var err error
			atDepth(n, func() { v, err = call.fn() })
			if err != nil {
				t.Fatalf("%s: %v", call.name, err)
			}
			if v == 0 {
				lost++
				continue
			}
			closePipe(v)
		}
		if lost > 0 {
			t.Errorf("%s: the handle written by the driver was lost at %d of 200 stack depths", call.name, lost)
		}
	}
}
