package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/moe"
)

// TestGroupedGEMMTiming times the grouped GEMM at DeepSeek-V3 shapes (H 7168,
// I 2048, 256 routed + 1 shared expert, top-8 + the shared slot) when
// MOEPREP_GEMM_BENCH=1, next to the device-to-device copy bandwidth, and
// prints microseconds and the fraction of the HBM floor (each touched
// expert's weights read once). Weights are a constant non-zero bit pattern
// (filling 22 GB with random values on the host would take minutes); the
// arithmetic is the same work. A measurement, not a check.
func TestGroupedGEMMTiming(t *testing.T) {
	dev := benchDevice(t, "MOEPREP_GEMM_BENCH", "the grouped GEMM")
	const h, in, e, k, block = 7168, 2048, 257, 9, 16
	bw := copyBandwidth(t, dev)
	t.Logf("device-to-device copy: %.0f GB/s", bw/1e9)
	for _, wd := range []kernels.MatDType{kernels.MatBF16, kernels.MatFP8} {
		bank := constBank(t, dev, wd, e, h, in)
		for _, tok := range []int{1, 128, 4096} {
			r := rand.New(rand.NewPCG(uint64(tok), 9))
			ids := make([]int32, tok*k)
			for i := range tok {
				for j, p := range r.Perm(e - 1)[:k-1] {
					ids[i*k+j] = int32(p)
				}
				ids[i*k+k-1] = e - 1
			}
			al, err := moe.AlignBlockSize(ids, e, block)
			if err != nil {
				t.Fatal(err)
			}
			sorted := uploadSorted(t, dev, al, e)
			touched := 0
			for _, c := range al.Counts {
				if c > 0 {
					touched++
				}
			}
			floor := float64(touched) * 3 * h * in * float64(wdBytes(wd)) / bw
			x := toDevice(t, dev, toBF16(randn(r, tok*h, 1)))
			xf := toDevice(t, dev, randn(r, tok*h, 1))
			interB, err := cuda.Alloc[uint16](dev, tok*k*in)
			if err != nil {
				t.Fatal(err)
			}
			interF, err := cuda.Alloc[float32](dev, tok*k*in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := cuda.Alloc[float32](dev, tok*k*h)
			if err != nil {
				t.Fatal(err)
			}
			for _, mode := range []struct {
				name string
				opt  kernels.GEMMOptions
			}{
				{"bf16 mma2", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMAVec}},
				{"bf16 mma", kernels.GEMMOptions{Act: kernels.MatBF16, Path: kernels.PathMMA}},
				{"f32 simt", kernels.GEMMOptions{Act: kernels.MatF32}},
			} {
				xm, im := kernels.BF16Mat(x), kernels.BF16Mat(interB)
				if mode.opt.Act == kernels.MatF32 {
					xm, im = kernels.F32Mat(xf), kernels.F32Mat(interF)
				}
				reps := 5
				if tok == 4096 && mode.opt.Act == kernels.MatF32 {
					reps = 2
				}
				ms := timeMedian(t, dev, reps, func() error {
					return kernels.GroupedGEMM(dev, 0, bank, sorted, xm, tok, k, im, out, mode.opt)
				})
				fmt.Printf("GEMMTIME w=%v T=%d mode=%s experts=%d time_us=%.0f floor_us=%.0f frac=%.3f\n",
					wd, tok, mode.name, touched, ms*1000, floor*1e6, floor*1e3/ms)
			}
			interB.Free()
			interF.Free()
			out.Free()
		}
	}
}

func wdBytes(d kernels.MatDType) int {
	if d == kernels.MatFP8 {
		return 1
	}
	return 2
}

// constBank allocates a gate/up/down bank filled with a constant pattern
// (bf16 0x3c00 = 2^-7; fp8 0x30 = 2^-1 with scales 2^-6).
func constBank(t *testing.T, dev *cuda.Device, wd kernels.MatDType, e, h, in int) *kernels.ExpertBank {
	b := &kernels.ExpertBank{NumExperts: e, H: h, I: in, DType: wd}
	mat := func(n int) kernels.Mat {
		if wd == kernels.MatFP8 {
			buf, err := cuda.Alloc[uint8](dev, n)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { buf.Free() })
			if err := buf.Fill(0x30); err != nil {
				t.Fatal(err)
			}
			return kernels.FP8Mat(buf)
		}
		buf, err := cuda.Alloc[uint32](dev, n/2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		if err := buf.Fill(0x3c003c00); err != nil {
			t.Fatal(err)
		}
		return kernels.Mat{DType: kernels.MatBF16, Ptr: buf.Ptr(), Len: n}
	}
	scales := func(rows, cols int) *cuda.Buffer[float32] {
		sr, sc := scaleDims(rows, cols, 128, 128)
		v := slices.Repeat([]float32{1.0 / 64}, e*sr*sc)
		return toDevice(t, dev, v)
	}
	b.GateUp = mat(e * 2 * in * h)
	b.Down = mat(e * h * in)
	if wd == kernels.MatFP8 {
		g := scales(in, h)
		gu := slices.Repeat([]float32{1.0 / 64}, 2*g.Len())
		b.GateUpScale = toDevice(t, dev, gu)
		b.DownScale = scales(h, in)
	}
	return b
}

// copyBandwidth measures a 4 GiB device-to-device copy: bytes read + written per second.
func copyBandwidth(t *testing.T, dev *cuda.Device) float64 {
	const n = 1 << 30
	a, err := cuda.Alloc[uint32](dev, n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	b, err := cuda.Alloc[uint32](dev, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	ms := timeMedian(t, dev, 5, func() error {
		return dev.Do(func(c *cuda.Ctx) error { return c.CopyDtoD(b.Ptr(), a.Ptr(), 4*n) })
	})
	return 2 * 4 * n / (ms / 1e3)
}

// timeMedian runs fn once to warm up, then reps times between events on the
// default stream, and returns the median milliseconds.
func timeMedian(t *testing.T, dev *cuda.Device, reps int, fn func() error) float64 {
	t.Helper()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
	var times []float64
	for range reps {
		var start, end cuda.Event
		err := dev.Do(func(c *cuda.Ctx) error {
			var e error
			if start, e = c.NewEvent(); e != nil {
				return e
			}
			if end, e = c.NewEvent(); e != nil {
				return e
			}
			return c.Record(start, 0)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		err = dev.Do(func(c *cuda.Ctx) error {
			defer c.DestroyEvent(start)
			defer c.DestroyEvent(end)
			if e := c.Record(end, 0); e != nil {
				return e
			}
			if e := c.SyncEvent(end); e != nil {
				return e
			}
			ms, e := c.Elapsed(start, end)
			times = append(times, float64(ms))
			return e
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(times)
	return times[len(times)/2]
}

// TestRouterGEMMTiming times every bf16 router kernel at DeepSeek-V3's shape
// (H 7168, 256 experts) when MOEPREP_ROUTER_BENCH=1, for choosing among
// them: the mean of back-to-back runs after a warm-up (no L2 flush, so
// small T runs from L2), with each kernel's max |d| against router_mma_l
// relative to the largest |logit|. A measurement, not a check (beyond
// the kernels' errors and unwritten logits). MOEPREP_ROUTER_BENCH_FAMILY
// names another build of router_gemm.cu to time (a <name>.fatbin in
// $MOEPREP_KERNELS_DIR, e.g. built with -DRC_STAGES=3).
func TestRouterGEMMTiming(t *testing.T) {
	dev := benchDevice(t, "MOEPREP_ROUTER_BENCH", "the router GEMM kernels")
	family := os.Getenv("MOEPREP_ROUTER_BENCH_FAMILY")
	if family == "" {
		family = "router_gemm"
	}
	const h, e, maxTok = 7168, 256, 4096
	r := rand.New(rand.NewPCG(3, 4))
	x := kernels.BF16Mat(toDevice(t, dev, toBF16(randn(r, maxTok*h, 1))))
	w := kernels.BF16Mat(toDevice(t, dev, toBF16(randn(r, e*h, 1/math.Sqrt(h)))))
	names := kernels.RouterKernels(dev)
	var tab strings.Builder
	fmt.Fprintf(&tab, "%5s %9s", "T", "picked")
	for _, n := range names {
		fmt.Fprintf(&tab, " %9s", strings.TrimPrefix(n, "router_mma_"))
	}
	worst := map[string]float64{}
	for _, tok := range []int{1, 16, 128, 256, 512, 768, 1024, 1536, 1792, 2048, 2560, 3072, 3584, 4096} {
		ref := poisoned(t, dev, tok*e)
		if err := dev.Do(func(c *cuda.Ctx) error {
			return kernels.LaunchRouterKernelCtx(c, family, "router_mma_l", x, w, ref, tok, h, e)
		}); err != nil {
			t.Fatal(err)
		}
		want := fromDevice(t, ref)
		scale := 0.0
		for _, v := range want {
			scale = max(scale, math.Abs(float64(v)))
		}
		fmt.Fprintf(&tab, "\n%5d %9s", tok, strings.TrimPrefix(kernels.RouterKernel(dev, tok, e), "router_mma_"))
		for _, n := range names {
			if n == "router_mma_s" && tok > 16 || n == "router_mma_l" && tok < 128 {
				fmt.Fprintf(&tab, " %9s", "-")
				continue
			}
			out := poisoned(t, dev, tok*e)
			us := rtTimeUs(t, dev, 20, func(c *cuda.Ctx) error {
				return kernels.LaunchRouterKernelCtx(c, family, n, x, w, out, tok, h, e)
			})
			for i, v := range fromDevice(t, out) {
				d := math.Abs(float64(v) - float64(want[i]))
				if !(d <= scale) { // NaN: unwritten
					t.Fatalf("%s T %d: logit %d = %v, router_mma_l %v", n, tok, i, v, want[i])
				}
				worst[n] = max(worst[n], d/scale)
			}
			fmt.Fprintf(&tab, " %9.1f", us)
		}
	}
	fmt.Fprintf(&tab, "\nmax |d| / max |logit| vs router_mma_l:")
	for _, n := range names {
		fmt.Fprintf(&tab, " %s %.1e", strings.TrimPrefix(n, "router_mma_"), worst[n])
	}
	t.Logf("%s: router GEMM us, H %d, E %d, %s:\n%s", family, h, e, dev, tab.String())
}
