package cuda

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

func TestMissingLibraryIsErrNoDriver(t *testing.T) {
	_, err := openLibrary("libmoeprep-no-such-driver.so.1")
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("got %v, want ErrNoDriver", err)
	}
}

func TestPackArgs(t *testing.T) {
	var nilBuf *Buffer[float32]
	p, err := PackArgs(DevicePtr(0xdeadbeef00), int32(-2), uint32(7), float32(1.5), int64(-3), uint64(9), 2.25, nilBuf, &Buffer[int32]{ptr: 0x1234})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	want := []uint64{0xdeadbeef00, 0xfffffffe, 7, uint64(math.Float32bits(1.5)), uint64(1<<64 - 3), 9, math.Float64bits(2.25), 0, 0x1234}
	for i, w := range want {
		if got := p.Value(i); got != w {
			t.Errorf("arg %d: slot %#x, want %#x", i, got, w)
		}
		if *(*uint64)(p.ptrs[i]) != w {
			t.Errorf("arg %d: pointer does not reach its slot", i)
		}
	}
	if _, err := PackArgs(int32(1), 3); err == nil || !strings.Contains(err.Error(), "argument 1") {
		t.Errorf("plain int accepted: %v", err)
	}
	q, err := PackArgs()
	if err != nil || q.Pointer() == 0 {
		t.Fatalf("no arguments: %v", err)
	}
	q.Release()
}

func TestErrorText(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Detail: "out of memory"}
	if s := e.Error(); !strings.Contains(s, "cuMemAlloc_v2") || !strings.Contains(s, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("error text %q", s)
	}
	if !errors.Is(&Error{Code: errNoDevice}, ErrNoDevice) || errors.Is(e, ErrNoDevice) {
		t.Error("errors.Is(ErrNoDevice) wrong")
	}
}

func TestCtxOutsideDo(t *testing.T) {
	c := &Ctx{}
	if _, err := c.Alloc(16); err == nil {
		t.Fatal("a Ctx outside Do was usable")
	}
}

// The GPU tests below share one device and skip without a driver or GPU.
var (
	devOnce sync.Once
	dev     *Device
	devErr  error
)

func testDevice(t *testing.T) *Device {
	t.Helper()
	devOnce.Do(func() { dev, devErr = Open(0) })
	if errors.Is(devErr, ErrNoDriver) || errors.Is(devErr, ErrNoDevice) {
		t.Skipf("no GPU: %v", devErr)
	}
	if devErr != nil {
		t.Fatalf("Open(0): %v", devErr)
	}
	return dev
}

func TestDeviceInfo(t *testing.T) {
	d := testDevice(t)
	t.Logf("%s", d)
	if d.Major < 7 || d.SMs <= 0 || d.Memory == 0 || d.Name == "" {
		t.Fatalf("implausible device: %+v", d)
	}
	free, total, err := d.MemInfo()
	if err != nil || free == 0 || free > total {
		t.Fatalf("MemInfo: %d/%d %v", free, total, err)
	}
	if err := Available(); err != nil {
		t.Fatal(err)
	}
}

func roundTrip[T Elem](t *testing.T, d *Device, src []T) {
	t.Helper()
	b, err := FromHost(d, src)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	got, err := b.ToHost(-1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if got[i] != src[i] {
			t.Fatalf("%T element %d: %v, uploaded %v", src, i, got[i], src[i])
		}
	}
}

func TestBufferRoundTrip(t *testing.T) {
	d := testDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	f := make([]float32, 100003)
	i32 := make([]int32, 777)
	u16 := make([]uint16, 1001)
	u8 := make([]uint8, 33)
	for i := range f {
		f[i] = float32(r.NormFloat64())
	}
	for i := range i32 {
		i32[i] = r.Int32() - 1<<30
	}
	for i := range u16 {
		u16[i] = uint16(r.Uint32())
	}
	for i := range u8 {
		u8[i] = uint8(r.Uint32())
	}
	roundTrip(t, d, f)
	roundTrip(t, d, i32)
	roundTrip(t, d, u16)
	roundTrip(t, d, u8)

	b, err := Alloc[int32](d, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Fill(-9); err != nil {
		t.Fatal(err)
	}
	got, _ := b.ToHost(-1)
	for _, v := range got {
		if v != -9 {
			t.Fatalf("Fill: %v", got)
		}
	}
	if err := b.Upload(make([]int32, 11)); err == nil {
		t.Error("oversized upload accepted")
	}
}

func TestDriverErrorIsNamed(t *testing.T) {
	d := testDevice(t)
	err := d.Do(func(c *Ctx) error { return c.Free(DevicePtr(0x10)) })
	var ce *Error
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Name, "CUDA_ERROR_") || !strings.Contains(err.Error(), "cuMemFree_v2") {
		t.Fatalf("freeing a bogus pointer: %v", err)
	}
	if err := d.Do(func(c *Ctx) error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("panic in Do: %v", err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatalf("device unusable after the errors: %v", err)
	}
}

// axpyPTX is y[i] = a*x[i] + y[i] for i < n, hand-written PTX so this
// package's tests need no nvcc.
const axpyPTX = `
.version 7.0
.target sm_52
.address_size 64

.visible .entry axpy(
	.param .u64 axpy_param_0,
	.param .u64 axpy_param_1,
	.param .f32 axpy_param_2,
	.param .u32 axpy_param_3
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<5>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [axpy_param_0];
	ld.param.u64 %rd2, [axpy_param_1];
	ld.param.f32 %f1, [axpy_param_2];
	ld.param.u32 %r2, [axpy_param_3];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r1, %r3, %r4, %r5;
	setp.ge.s32 %p1, %r1, %r2;
	@%p1 bra $L_done;
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mul.wide.s32 %rd5, %r1, 4;
	add.s64 %rd6, %rd4, %rd5;
	ld.global.f32 %f2, [%rd6];
	add.s64 %rd7, %rd3, %rd5;
	ld.global.f32 %f3, [%rd7];
	fma.rn.f32 %f4, %f2, %f1, %f3;
	st.global.f32 [%rd7], %f4;
$L_done:
	ret;
}
`

func TestLaunchPTX(t *testing.T) {
	d := testDevice(t)
	const n = 100000
	r := rand.New(rand.NewPCG(3, 4))
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	bx, err := FromHost(d, x)
	if err != nil {
		t.Fatal(err)
	}
	defer bx.Free()
	by, err := FromHost(d, y)
	if err != nil {
		t.Fatal(err)
	}
	defer by.Free()
	const a = float32(0.75)
	var ms float32
	err = d.Do(func(c *Ctx) error {
		m, err := c.LoadModule([]byte(axpyPTX))
		if err != nil {
			return err
		}
		defer c.UnloadModule(m)
		f, err := c.Function(m, "axpy")
		if err != nil {
			return err
		}
		if _, err := c.Function(m, "no_such_kernel"); err == nil {
			t.Error("a missing kernel was found")
		}
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		ms, err = c.Time(s, func() error {
			return c.Launch(f, Dim3{(n + 255) / 256, 1, 1}, Dim3{256, 1, 1}, 0, s, by, bx, a, uint32(n))
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := by.ToHost(-1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		want := float32(math.FMA(float64(x[i]), float64(a), float64(y[i])))
		if math.Abs(float64(got[i]-want)) > 1e-6*math.Max(1, math.Abs(float64(want))) {
			t.Fatalf("y[%d] = %g, want %g", i, got[i], want)
		}
	}
	t.Logf("axpy over %d floats: %.3f ms", n, ms)
}

func TestPinnedAsyncCopy(t *testing.T) {
	d := testDevice(t)
	const n = 1 << 20
	h, err := d.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	hb := h.Bytes()
	for i := range hb {
		hb[i] = byte(i * 7)
	}
	b, err := Alloc[uint8](d, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	h2, err := d.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Free()
	err = d.Do(func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		if err := c.CopyHtoDAsync(b.Ptr(), h, 0, n, s); err != nil {
			return err
		}
		if err := c.CopyDtoHAsync(h2, 0, b.Ptr(), n, s); err != nil {
			return err
		}
		if err := c.CopyHtoDAsync(b.Ptr(), h, n-1, 2, s); err == nil {
			t.Error("copy past the pinned buffer accepted")
		}
		return c.SyncStream(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range h2.Bytes() {
		if v != byte(i*7) {
			t.Fatalf("byte %d: %d", i, v)
		}
	}
}

// TestConcurrentUse drives one device from many goroutines.
func TestConcurrentUse(t *testing.T) {
	d := testDevice(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := make([]int32, 1000+g)
			for i := range v {
				v[i] = int32(g*100000 + i)
			}
			for range 20 {
				b, err := FromHost(d, v)
				if err != nil {
					errs <- err
					return
				}
				got, err := b.ToHost(-1)
				b.Free()
				if err != nil || got[len(got)-1] != v[len(v)-1] {
					errs <- errors.Join(err, errors.New("round trip mismatch"))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
