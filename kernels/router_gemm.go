package kernels

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/internal/cuda"
)

// MatDType is the element type of a device matrix handed to the GEMM kernels.
type MatDType uint8

const (
	MatF32  MatDType = iota + 1 // float32
	MatBF16                     // bfloat16, carried as its raw 16 bits (uint16)
	MatFP8                      // float8_e4m3fn, one byte (uint8), with f32 128x128 block scales
)

func (d MatDType) String() string {
	switch d {
	case MatF32:
		return "f32"
	case MatBF16:
		return "bf16"
	case MatFP8:
		return "fp8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Mat is a device array with its element type. Make one with F32Mat,
// BF16Mat or FP8Mat so the type always matches the buffer.
type Mat struct {
	DType MatDType
	Ptr   cuda.DevicePtr
	Len   int // elements
}

// F32Mat, BF16Mat and FP8Mat wrap typed device buffers.
func F32Mat(b *cuda.Buffer[float32]) Mat { return Mat{MatF32, b.Ptr(), b.Len()} }
func BF16Mat(b *cuda.Buffer[uint16]) Mat { return Mat{MatBF16, b.Ptr(), b.Len()} }
func FP8Mat(b *cuda.Buffer[uint8]) Mat   { return Mat{MatFP8, b.Ptr(), b.Len()} }

// elemSize is the byte size of one element.
func (d MatDType) elemSize() int {
	switch d {
	case MatF32:
		return 4
	case MatBF16:
		return 2
	}
	return 1
}

// at returns the pointer to element i.
func (m Mat) at(i int) cuda.DevicePtr { return m.Ptr.Add(i * m.DType.elemSize()) }

// need checks that m holds at least n elements of one of the allowed types.
func (m Mat) need(what string, n int, allowed ...MatDType) error {
	ok := false
	for _, d := range allowed {
		ok = ok || m.DType == d
	}
	switch {
	case !ok:
		return fmt.Errorf("%s is %v, want one of %v", what, m.DType, allowed)
	case m.Ptr == 0:
		return fmt.Errorf("%s is a null device pointer", what)
	case m.Len < n:
		return fmt.Errorf("%s holds %d elements, needs %d", what, m.Len, n)
	}
	return nil
}

// dimsOK reports whether every dimension is positive and fits the kernels'
// int32 parameters.
func dimsOK(dims ...int) bool {
	for _, d := range dims {
		if d <= 0 || d > math.MaxInt32 {
			return false
		}
	}
	return true
}

const (
	routerWarps  = 8 // experts per CTA (router_gemm.cu RT_WARPS)
	routerTokens = 4 // tokens per CTA (RT_TOKENS)
)

// routerMMA is one tensor-core router kernel: its CTA tile (m tokens x n
// experts), thread count, the CTAs of a thread block cluster that split K
// (grid z; 1: no cluster) and its dynamic shared memory
// (router_gemm.cu RT_MMA_KERNEL, RC_KERNEL).
type routerMMA struct {
	fn            string
	m, n, threads int
	split         int
	smem          uint32
}

// routerClusterSmem is a cluster kernel's dynamic shared memory:
// RC_STAGES (4) stages of (m + n) rows of 128 bytes.
func routerClusterSmem(m, n int) uint32 { return uint32(4 * (m + n) * 128) }

// grid is the kernel's launch grid for t tokens and e experts: expert
// tiles, token tiles, and the cluster's CTAs that split K.
func (c routerMMA) grid(t, e int) [3]uint32 {
	return [3]uint32{uint32(CeilDiv(e, c.n)), uint32(CeilDiv(t, c.m)), uint32(c.split)}
}

func routerCluster(fn string, m, n, split int) routerMMA {
	return routerMMA{fn, m, n, 256, split, routerClusterSmem(m, n)}
}

// routerClusters are the cluster kernels (router_gemm.cu RC_KERNEL):
// router_mma_c{m}n{n}s{split}.
var routerClusters = []routerMMA{
	routerCluster("router_mma_c64n256s8", 64, 256, 8),
	routerCluster("router_mma_c64n256s2", 64, 256, 2),
	routerCluster("router_mma_c64n128s2", 64, 128, 2),
	routerCluster("router_mma_c128n256s3", 128, 256, 3),
	routerCluster("router_mma_c128n256s4", 128, 256, 4),
	routerCluster("router_mma_c128n256s6", 128, 256, 6),
	routerCluster("router_mma_c128n256s8", 128, 256, 8),
	routerCluster("router_mma_c128n128s2", 128, 128, 2),
	routerCluster("router_mma_c160n256s4", 160, 256, 4),
}

// routerClusterPick is Hopper's choice by rows, tokens times 256-expert
// column tiles: the first entry whose maxRows covers them. Fitted to the
// H100's MOEPREP_ROUTER_BENCH table (kernels/GEMM_NOTES.md, router GEMM
// section), DeepSeek-V3 shape: each CTA takes one SM, and fewer than 128
// CTAs in clusters of 4 to 8 are resident at once (112 were, 128 ran as two
// waves), so each entry stays at <= 112 CTAs; clusters of 2 fit 128.
var routerClusterPick = []struct {
	maxRows int
	fn      string
}{
	{896, "router_mma_c64n256s8"},      // 14 x 8 CTAs; T=512: 17.6 us
	{1792, "router_mma_c128n256s8"},    // 14 x 8; T=1024: 24.9 us
	{2048, "router_mma_c128n256s6"},    // 16 x 6; T=2048: 33.8 us
	{3584, "router_mma_c128n256s4"},    // 28 x 4; T=3072: 44.7 us
	{1 << 62, "router_mma_c128n128s2"}, // 32 x 2 x 2 at T=4096: 49.8 us
}

// routerClusterMinRows is the fewest rows for which Hopper takes a cluster
// kernel: below it router_mma_m's small tiles keep more SMs busy.
const routerClusterMinRows = 512

// routerMMAConfig picks the kernel for t tokens and e experts: small tiles
// with K split over the CTA's warps while the weight read dominates (few
// tokens), then 64 x 64 tiles once the arithmetic does; on Hopper from
// routerClusterMinRows rows on, the cluster kernels (routerClusterPick).
func routerMMAConfig(t, e int, hopper bool) routerMMA {
	if rows := t * CeilDiv(e, 256); hopper && rows >= routerClusterMinRows {
		for _, p := range routerClusterPick {
			if rows <= p.maxRows {
				for _, c := range routerClusters {
					if c.fn == p.fn {
						return c
					}
				}
			}
		}
	}
	switch {
	case t <= 16:
		return routerMMA{"router_mma_s", 16, 8, 256, 1, 0}
	case t <= 1024:
		return routerMMA{"router_mma_m", 32, 16, 256, 1, 0}
	}
	return routerMMA{"router_mma_l", 64, 64, 128, 1, 0}
}

// RouterGEMM queues logits [T,E] = x [T,H] times w [E,H] transposed on
// stream s, f32 accumulation. x and w are each f32 or bf16; logits is f32.
// bf16 x bf16 with H a multiple of 8 runs on the tensor cores (mma.sync;
// on Hopper from routerClusterMinRows rows in thread block clusters that
// split K, reduced in a fixed order); other combinations on the SIMT kernel.
// The CPU twin is moe.RouterLogits.
func RouterGEMM(dev *cuda.Device, s cuda.Stream, x, w Mat, logits *cuda.Buffer[float32], t, h, e int) error {
	if !dimsOK(t, h, e) {
		return fmt.Errorf("router gemm: %d tokens x %d hidden, %d experts", t, h, e)
	}
	if err := x.need("router gemm: x", t*h, MatF32, MatBF16); err != nil {
		return err
	}
	if err := w.need("router gemm: router weight", e*h, MatF32, MatBF16); err != nil {
		return err
	}
	if logits == nil || logits.Len() < t*e {
		return fmt.Errorf("router gemm: logits buffer smaller than %d x %d", t, e)
	}
	m, err := Load(dev, "router_gemm")
	if err != nil {
		return err
	}
	if x.DType == MatBF16 && w.DType == MatBF16 && h%8 == 0 && x.Ptr%16 == 0 && w.Ptr%16 == 0 {
		c := routerMMAConfig(t, e, isHopper(dev))
		grid := c.grid(t, e)
		if grid[1] > 65535 {
			return fmt.Errorf("router gemm: %d tokens exceed the launch grid (at most %d)", t, 65535*c.m)
		}
		return m.Launch(c.fn, grid, Block(c.threads), c.smem, s, x.Ptr, w.Ptr, logits, int32(t), int32(e), int32(h))
	}
	fn := fmt.Sprintf("router_gemm_%v_%v", x.DType, w.DType)
	grid := [3]uint32{uint32(CeilDiv(e, routerWarps)), uint32(CeilDiv(t, routerTokens)), 1}
	if grid[1] > 65535 {
		return fmt.Errorf("router gemm: %d tokens exceed the launch grid (at most %d)", t, 65535*routerTokens)
	}
	return m.Launch(fn, grid, Block(routerWarps*32), 0, s, x.Ptr, w.Ptr, logits, int32(t), int32(e), int32(h))
}
