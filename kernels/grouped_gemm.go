package kernels

import (
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/layout"
)

// FP8ScaleBlock is the edge of the square FP8 quantisation blocks the
// grouped GEMM dequantises (DeepSeek's weight_block_size [128,128]).
const FP8ScaleBlock = 128

// ExpertBank is a layer's stacked expert weights on the device, as convert
// writes them: either separate Gate and Up [E,I,H] or one GateUp [E,2I,H]
// (gate rows first, or up rows first when UpFirst), and Down [E,H,I]. All
// weights have DType (f32, bf16 or fp8). FP8 banks carry f32 block scales:
// GateScale/UpScale [E,ceil(I/128),ceil(H/128)] or GateUpScale
// [E,2*ceil(I/128),ceil(H/128)] (two stacked grids), DownScale
// [E,ceil(H/128),ceil(I/128)].
type ExpertBank struct {
	NumExperts, H, I int
	DType            MatDType

	Gate, Up Mat // separate layout
	GateUp   Mat // fused layout
	UpFirst  bool
	Down     Mat

	GateScale, UpScale, GateUpScale, DownScale *cuda.Buffer[float32]

	// Act is the experts' gated activation (zero: SwiGLU). GateBias,
	// UpBias [E,I] and DownBias [E,H] are f32 per-expert biases, nil when
	// the experts have none. A bank with either runs stage 1 unfused
	// (act.go): the fused epilogue is silu(g) * u alone.
	Act                        layout.Activation
	GateBias, UpBias, DownBias *cuda.Buffer[float32]
}

// Fused reports whether the bank holds one gate_up tensor. An ungated bank
// (Act.Ungated) holds Up and Down alone.
func (b *ExpertBank) Fused() bool { return b.GateUp.Ptr != 0 }

// gateUpPtrs returns the gate and up weight and scale pointers of expert 0
// and the per-expert strides (elements) of weights and scales.
func (b *ExpertBank) gateUpPtrs() (wg, wu cuda.DevicePtr, wStride int64, sg, su cuda.DevicePtr, sStride int64, err error) {
	e, h, in := b.NumExperts, b.H, b.I
	sr, sc := CeilDiv(in, FP8ScaleBlock), CeilDiv(h, FP8ScaleBlock)
	fp8 := b.DType == MatFP8
	if b.Fused() {
		if err = b.GateUp.need("expert bank: gate_up", e*2*in*h, b.DType); err != nil {
			return
		}
		wg, wu, wStride = b.GateUp.Ptr, b.GateUp.at(in*h), int64(2*in*h)
		if fp8 {
			if b.GateUpScale == nil || b.GateUpScale.Len() < e*2*sr*sc {
				err = fmt.Errorf("expert bank: gate_up scale needs %d x %d x %d values", e, 2*sr, sc)
				return
			}
			sg, su, sStride = b.GateUpScale.Ptr(), b.GateUpScale.Ptr().Add(4*sr*sc), int64(2*sr*sc)
		}
		if b.UpFirst {
			wg, wu, sg, su = wu, wg, su, sg
		}
		return
	}
	if b.Act.Ungated() {
		// No gate projection (Nemotron-H): stage 1 is the up GEMM alone
		// (moeGateUpAct); a bank holding gate weights anyway is a loader bug.
		if err = b.Up.need("expert bank: up", e*in*h, b.DType); err == nil && (b.Gate.Ptr != 0 || b.DType == MatFP8) {
			err = fmt.Errorf("expert bank: ungated experts (activation %s) with gate weights or FP8 blocks", b.Act.Describe())
		}
		wu, wStride = b.Up.Ptr, int64(in*h)
		return
	}
	if err = b.Gate.need("expert bank: gate", e*in*h, b.DType); err != nil {
		return
	}
	if err = b.Up.need("expert bank: up", e*in*h, b.DType); err != nil {
		return
	}
	wg, wu, wStride = b.Gate.Ptr, b.Up.Ptr, int64(in*h)
	if fp8 {
		for _, s := range []*cuda.Buffer[float32]{b.GateScale, b.UpScale} {
			if s == nil || s.Len() < e*sr*sc {
				err = fmt.Errorf("expert bank: gate and up scales need %d x %d x %d values each", e, sr, sc)
				return
			}
		}
		sg, su, sStride = b.GateScale.Ptr(), b.UpScale.Ptr(), int64(sr*sc)
	}
	return
}

func (b *ExpertBank) check() error {
	if b == nil || !dimsOK(b.NumExperts, b.H, b.I) {
		return fmt.Errorf("expert bank: bad dimensions")
	}
	if b.DType != MatF32 && b.DType != MatBF16 && b.DType != MatFP8 {
		return fmt.Errorf("expert bank: weight dtype %v", b.DType)
	}
	if int64(b.NumExperts)*2*int64(b.I)*int64(b.H) > 1<<50 {
		return fmt.Errorf("expert bank: %d experts of %dx%d overflow", b.NumExperts, b.I, b.H)
	}
	if err := b.Down.need("expert bank: down", b.NumExperts*b.H*b.I, b.DType); err != nil {
		return err
	}
	if b.DType == MatFP8 {
		sr, sc := CeilDiv(b.H, FP8ScaleBlock), CeilDiv(b.I, FP8ScaleBlock)
		if b.DownScale == nil || b.DownScale.Len() < b.NumExperts*sr*sc {
			return fmt.Errorf("expert bank: down scale needs %d x %d x %d values", b.NumExperts, sr, sc)
		}
	}
	return nil
}

// Sorted is the output of moe_align_block_size on the device: SortedIDs
// [maxPadded] slot indices grouped by expert and padded with the sentinel
// Numel = T*TopK, ExpertIDs [maxPadded/BlockSize], Total [1] the padded count.
type Sorted struct {
	SortedIDs, ExpertIDs, Total *cuda.Buffer[int32]
	BlockSize                   int
	Numel                       int // T * TopK
}

// NewSorted uploads an alignment computed on the host (moe.AlignBlockSize,
// or a hand-built one for the unfused path's one-expert calls: that expert's
// slots, padded with numel to a multiple of blockSize, all expert ids 0).
// sortedIDs may be longer than total (a worst-case-sized buffer); expertIDs
// must cover it in blocks of blockSize. The caller frees the three buffers.
func NewSorted(dev *cuda.Device, sortedIDs, expertIDs []int32, total, blockSize, numel int) (*Sorted, error) {
	switch {
	case blockSize <= 0 || blockSize%gemmRowTile != 0:
		return nil, fmt.Errorf("sorted blocks: block size %d is not a multiple of %d", blockSize, gemmRowTile)
	case !dimsOK(numel, len(sortedIDs)) || total < 0 || total > len(sortedIDs) || total%blockSize != 0:
		return nil, fmt.Errorf("sorted blocks: total %d of %d sorted ids (block %d, %d slots)", total, len(sortedIDs), blockSize, numel)
	case len(expertIDs) < CeilDiv(len(sortedIDs), blockSize):
		return nil, fmt.Errorf("sorted blocks: %d expert ids for %d sorted ids in blocks of %d", len(expertIDs), len(sortedIDs), blockSize)
	}
	s := &Sorted{BlockSize: blockSize, Numel: numel}
	var err error
	if s.SortedIDs, err = cuda.FromHost(dev, sortedIDs); err != nil {
		return nil, err
	}
	if s.ExpertIDs, err = cuda.FromHost(dev, expertIDs); err != nil {
		s.Free()
		return nil, err
	}
	if s.Total, err = cuda.FromHost(dev, []int32{int32(total)}); err != nil {
		s.Free()
		return nil, err
	}
	return s, nil
}

// Free releases the three device buffers.
func (s *Sorted) Free() {
	for _, b := range []*cuda.Buffer[int32]{s.SortedIDs, s.ExpertIDs, s.Total} {
		if b != nil {
			b.Free()
		}
	}
}

// gemmRowTile is the row tile of the grouped GEMM kernels (GG_BM); block
// sizes must be multiples of it so a tile never spans two experts.
const gemmRowTile = 16

// gemmColTile is the column tile (GG_BN).
const gemmColTile = 64

func (s *Sorted) check() error {
	switch {
	case s == nil || s.SortedIDs == nil || s.ExpertIDs == nil || s.Total == nil:
		return fmt.Errorf("sorted blocks: missing buffers")
	case s.BlockSize <= 0 || s.BlockSize%gemmRowTile != 0:
		return fmt.Errorf("sorted blocks: block size %d is not a multiple of %d", s.BlockSize, gemmRowTile)
	case !dimsOK(s.Numel, s.SortedIDs.Len()):
		return fmt.Errorf("sorted blocks: %d slots, %d sorted ids", s.Numel, s.SortedIDs.Len())
	case s.ExpertIDs.Len() < CeilDiv(s.SortedIDs.Len(), s.BlockSize):
		return fmt.Errorf("sorted blocks: %d expert ids for %d sorted ids in blocks of %d", s.ExpertIDs.Len(), s.SortedIDs.Len(), s.BlockSize)
	case s.Total.Len() < 1:
		return fmt.Errorf("sorted blocks: empty total buffer")
	}
	return nil
}

// GEMMPath selects the kernel variant of the grouped GEMM.
type GEMMPath uint8

const (
	// PathAuto: tensor cores for bf16 activations with bf16 or fp8 weights
	// (the 16-byte-load variant where the shapes allow it, in 64-row tiles
	// when the experts average tallMinRows rows or more; on compute
	// capability 9.0 wgmma there for bf16 weights, and mma3 below it),
	// SIMT otherwise.
	PathAuto GEMMPath = iota
	// PathSIMT: the f32 SIMT kernels (any shape, any dtype).
	PathSIMT
	// PathMMA: mma.sync with scalar loads (any shape; bf16 activations,
	// bf16/fp8 weights).
	PathMMA
	// PathMMAVec: mma.sync with 16-byte loads and a register prefetch of
	// the next K step; needs K % 8 == 0 (bf16) or K % 16 == 0 (fp8) for
	// K = H (stage 1) and K = I (stage 2).
	PathMMAVec
	// PathMMATall: as PathMMAVec (same shape rules) with tiles of up to 64
	// rows of one expert, so each staged weight tile serves four times as
	// many rows; PathAuto takes it when the experts average at least
	// tallMinRows rows.
	PathMMATall
	// PathWGMMA: the Hopper kernels of grouped_gemm_wg.cu (compute
	// capability 9.0 only): wgmma from shared memory fed by a 4-stage
	// pipeline (gathered activation rows by cp.async, weight tiles by the
	// bulk tensor copy engine through a tensor map per weight matrix that
	// the launch encodes), tiles of up to wgBM rows of one expert x wgBN
	// weight rows (192 x 192: a routed expert of ~140 rows at T = 4096 is
	// one row tile, so its weights cross HBM once), a persistent grid of one
	// CTA per SM. bf16 activations and bf16 weights, K % 8 == 0, at most
	// wgMaxExperts experts. PathAuto takes it on 9.0 where it would take
	// PathMMATall.
	PathWGMMA
	// PathMMA3: PathMMAVec's arithmetic (bit-identical outputs) with the
	// operands copied by cp.async into a ring of shared-memory stages
	// (mma3StagesGateUp, mma3StagesDown), so each SM keeps more weight
	// bytes in flight, and the column tiles fastest in the grid; bf16
	// activations and bf16 weights, K % 8 == 0.
	PathMMA3
)

// gemmPathNames are the command-line names of the paths, in GEMMPath order.
var gemmPathNames = [...]string{"auto", "simt", "mma", "mma2", "tall", "wgmma", "mma3"}

func (p GEMMPath) String() string {
	if int(p) < len(gemmPathNames) {
		return gemmPathNames[p]
	}
	return fmt.Sprintf("GEMMPath(%d)", p)
}

// ParseGEMMPath reads a path by its name (auto, simt, mma, mma2, tall, wgmma, mma3).
func ParseGEMMPath(s string) (GEMMPath, error) {
	for i, n := range gemmPathNames {
		if s == n {
			return GEMMPath(i), nil
		}
	}
	return 0, fmt.Errorf("grouped GEMM path %q: want one of %s", s, strings.Join(gemmPathNames[:], ", "))
}

// wgMaxExperts bounds the expert count of PathWGMMA: each CTA keeps the runs
// of equal expert ids (at most 2 x experts + 1) in a table of 2047 entries.
const wgMaxExperts = 1023

// The wgmma tile (WG_BM, WG_BNB and WG_THREADS in grouped_gemm_wg.cu):
// wgBM rows of one expert x wgBN weight rows (gate_up: wgBN/2 gate and
// wgBN/2 up rows of the same output columns; down: wgBN output columns),
// one producer and wgBM/64 consumer warpgroups, each consumer one
// m64n192k16 wgmma per k16 over its 64 rows. 192 rows because a routed
// DeepSeek-V3 expert has ~128-160 rows at T = 4096: in one 192-row tile
// its weights cross HBM once, where 128-row tiles read them twice
// (GEMM_NOTES.md: -31% at T = 4096 on the H100).
const (
	wgBM      = 192
	wgBN      = 192
	wgThreads = 128 * (1 + wgBM/64)
)

// wgSmemBytes is the wgmma kernels' dynamic shared memory (WG_SMEM_BYTES in
// grouped_gemm_wg.cu, 215744 bytes): 4 stages of (wgBM + wgBN) x 64 bf16
// (48 KiB), the run and tile tables, the mbarriers, the producer's row
// table (wgBM pointers) and 1 KiB to align the ring.
const wgSmemBytes = 4*(wgBM+wgBN)*64*2 + (2*2048+32)*4 + 2*4*8 + wgBM*8 + 1024

// The w8a8 wgmma tile (WF_BM, WF_BNB, WF_NCW, WF_STAGES and WF_THREADS in
// grouped_gemm_wg_fp8.cu): wfBM rows of one expert x wfBN weight rows,
// one producer and two consumer warpgroups (setmaxnreg 40 / 232: each
// consumer holds a 64 x 192 f32 accumulator and a partial of the same
// size, promoted every 128 K with the activation and weight scales).
const (
	wfBM      = 128
	wfBN      = 192
	wfStages  = 5
	wfThreads = 128 * (1 + wfBM/64)
)

// wfSmemBytes is the w8a8 kernels' dynamic shared memory (WF_SMEM_BYTES,
// 225648 bytes): 5 stages of (wfBM + wfBN) x 128 e4m3, a scale ring of
// wfBM + 8 floats a stage, the run and tile tables, the mbarriers, the
// producer's row table (wfBM ints) and 1 KiB to align the ring.
const wfSmemBytes = wfStages*(wfBM+wfBN)*128 + wfStages*(wfBM+8)*4 + (2*2048+32)*4 + 2*wfStages*8 + wfBM*4 + 1024

// The mma3 kernels' launch constants (M3_STAGES_GATE_UP, M3_STAGES_DOWN,
// M3_BK and M3_BN_DOWN in grouped_gemm.cu): ring depths in K steps of
// mma3BK, all but one step in flight while the warps multiply the oldest;
// output columns of a down CTA (a gate_up CTA takes gemmColTile of gate and
// of up).
const (
	mma3StagesGateUp = 5
	mma3StagesDown   = 8
	mma3BK           = 64
	mma3DownBN       = 64
)

// mma3SmemBytes is an mma3 kernel's dynamic shared memory: per stage a
// 16 x mma3BK bf16 tile of gathered rows and a tile of mma3BK bf16 of each
// weight row of the CTA (gemmColTile rows of gate and of up, or mma3DownBN
// rows of down).
func mma3SmemBytes(gated bool) uint32 {
	if gated {
		return mma3StagesGateUp * (gemmRowTile + 2*gemmColTile) * mma3BK * 2
	}
	return mma3StagesDown * (gemmRowTile + mma3DownBN) * mma3BK * 2
}

// isHopper reports whether dev runs the sm_90a code of the fatbins.
func isHopper(dev *cuda.Device) bool { return dev != nil && dev.Major == 9 && dev.Minor == 0 }

// tallMinRows is the mean number of rows per expert (slots / experts) from
// which PathAuto uses the 64-row tiles: below it most experts fill one
// 16-row tile and the tall CTA would leave most of its warps idle.
const tallMinRows = 32

// GEMMOptions picks the grouped GEMM's precision and kernel.
type GEMMOptions struct {
	// Act is the activation type: MatF32 (x and the intermediate f32: the
	// high-precision mode, same function as the CPU twin) or MatBF16 (x and
	// the intermediate bf16, as serving engines run).
	Act  MatDType
	Path GEMMPath
	// Scratch is f32 room for 2 x Numel x I values: the raw gate and up
	// projections of a bank whose experts run stage 1 unfused (biases or a
	// non-SwiGLU activation); unused otherwise.
	Scratch *cuda.Buffer[float32]
	// W8A8 is the activation precision of the block-FP8 serving mode
	// (moe.GEMMOptions{W8A8: true}; false, the default, keeps the
	// activations in Act): each stage first quantises its input, x [T, H]
	// and the bf16 intermediate [Numel, I], to e4m3 per row per 128
	// channels (ActQuantE4M3 into Quant), and the grouped GEMM multiplies
	// e4m3 x e4m3 on the tensor cores (grouped_gemm_wg_fp8.cu). It needs
	// bf16 activations, fp8 weights, compute capability 9.0 (the kernels
	// use wgmma), H and I divisible by 16, at most wgMaxExperts experts,
	// SwiGLU experts without gate/up biases, and Path auto or wgmma; there
	// is no fallback, since any other kernel would compute other numerics.
	W8A8 bool
	// Quant is the w8a8 mode's quantisation scratch (NewQuantScratch).
	Quant *QuantScratch
}

// kernel returns a stage's kernel for reduction length k, numel slots and
// the given number of experts; hopper: the device has compute capability
// 9.0.
func (o GEMMOptions) kernel(stage string, w MatDType, k, numel, experts int, hopper bool) (*gemmKernel, error) {
	if o.W8A8 {
		switch {
		case o.Path != PathAuto && o.Path != PathWGMMA:
			return nil, fmt.Errorf("grouped gemm: w8a8 runs on the wgmma path only, not %v", o.Path)
		case o.Act != MatBF16 || w != MatFP8:
			return nil, fmt.Errorf("grouped gemm: w8a8 needs bf16 activations and fp8 weights, not %v and %v", o.Act, w)
		case !hopper:
			return nil, fmt.Errorf("grouped gemm: w8a8 needs compute capability 9.0 (wgmma e4m3)")
		case k%16 != 0 || experts > wgMaxExperts:
			return nil, fmt.Errorf("grouped gemm: w8a8 needs a reduction length divisible by 16 (not %d) and at most %d experts (not %d)", k, wgMaxExperts, experts)
		}
		return gemmKernelNamed(fmt.Sprintf("moe_%s_wg_fp8_fp8", stage))
	}
	mmaOK := o.Act == MatBF16 && (w == MatBF16 || w == MatFP8)
	vec := 8
	if w == MatFP8 {
		vec = 16
	}
	path := o.Path
	if path == PathAuto {
		switch {
		case mmaOK && w == MatBF16 && k%8 == 0 && numel >= tallMinRows*experts && hopper && experts <= wgMaxExperts:
			path = PathWGMMA
		case mmaOK && k%vec == 0 && numel >= tallMinRows*experts:
			path = PathMMATall
		case mmaOK && w == MatBF16 && k%8 == 0 && hopper:
			// Few rows per expert: the pipelined mma2 tile (GEMM_NOTES.md;
			// measured on the H100 only).
			path = PathMMA3
		case mmaOK && k%vec == 0:
			path = PathMMAVec
		case mmaOK:
			path = PathMMA
		default:
			path = PathSIMT
		}
	}
	switch {
	case path == PathSIMT:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_%v_%v", stage, o.Act, w))
	case !mmaOK:
		return nil, fmt.Errorf("grouped gemm: the tensor-core path needs bf16 activations and bf16 or fp8 weights, not %v and %v", o.Act, w)
	case path == PathMMA:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_mma_bf16_%v", stage, w))
	case path == PathMMAVec && k%vec == 0:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_mma2_bf16_%v", stage, w))
	case path == PathMMA3 && (w != MatBF16 || k%8 != 0):
		return nil, fmt.Errorf("grouped gemm: the mma3 path needs bf16 weights (not %v) and a reduction length divisible by 8 (not %d)", w, k)
	case path == PathMMA3:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_mma3_bf16_bf16", stage))
	case path == PathMMATall && k%vec == 0:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_tall_bf16_%v", stage, w))
	case path == PathWGMMA && !hopper:
		return nil, fmt.Errorf("grouped gemm: the wgmma path needs compute capability 9.0")
	case path == PathWGMMA && (w != MatBF16 || k%8 != 0 || experts > wgMaxExperts):
		return nil, fmt.Errorf("grouped gemm: the wgmma path needs bf16 weights (not %v), a reduction length divisible by 8 (not %d) and at most %d experts (not %d)", w, k, wgMaxExperts, experts)
	case path == PathWGMMA:
		return gemmKernelNamed(fmt.Sprintf("moe_%s_wg_bf16_bf16", stage))
	case path == PathMMAVec || path == PathMMATall:
		return nil, fmt.Errorf("grouped gemm: the 16-byte-load path needs a reduction length divisible by %d, not %d", vec, k)
	}
	return nil, fmt.Errorf("grouped gemm: unknown kernel path %d", path)
}

// gemmGrid is kernel fn's launch grid (gemmKernel.grid): rows x column
// tiles, or column tiles x rows, or for the wgmma kernels one CTA per SM
// (sms), which share out the tiles.
func gemmGrid(s *Sorted, n int, fn string, sms int) ([3]uint32, error) {
	k, err := gemmKernelNamed(fn)
	if err != nil {
		return [3]uint32{}, err
	}
	if k.wgmma {
		return k.grid(0, n, sms)
	}
	return k.grid(s.SortedIDs.Len(), n, sms)
}

// MoEGateUp queues stage 1 of the grouped GEMM on stream st: for every
// sorted row with slot s < Numel in a block of expert e,
// inter[s,:] = silu(x[s/topk] Gate_e^T) * (x[s/topk] Up_e^T), [Numel, I] in
// the activation type. Padding rows are skipped (their rows of inter are
// not written; no slot has one).
func MoEGateUp(dev *cuda.Device, st cuda.Stream, bank *ExpertBank, sorted *Sorted, x Mat, t, topk int, inter Mat, opt GEMMOptions) error {
	if err := checkGEMM(bank, sorted, opt); err != nil {
		return err
	}
	if !dimsOK(t, topk) || t*topk != sorted.Numel {
		return fmt.Errorf("grouped gemm: %d tokens x top-%d, alignment has %d slots", t, topk, sorted.Numel)
	}
	if err := x.need("grouped gemm: x", t*bank.H, opt.Act); err != nil {
		return err
	}
	if err := inter.need("grouped gemm: intermediate", sorted.Numel*bank.I, opt.Act); err != nil {
		return err
	}
	if bank.UnfusedAct() {
		if opt.W8A8 {
			return fmt.Errorf("grouped gemm: w8a8 runs SwiGLU experts without gate/up biases only (activation %+v)", bank.Act)
		}
		return moeGateUpAct(dev, st, bank, sorted, x, topk, inter, opt)
	}
	wg, wu, ws, sg, su, ss, err := bank.gateUpPtrs()
	if err != nil {
		return err
	}
	m, kern, grid, err := opt.stage(dev, "gate_up", bank, sorted, t, bank.H, bank.I)
	if err != nil {
		return err
	}
	a := []any{x.Ptr}
	if opt.W8A8 {
		// x -> e4m3 codes and per-128-channel scales, then the e4m3 x e4m3 GEMM on them.
		if err := ActQuantE4M3(dev, st, x, t, bank.H, opt.Quant); err != nil {
			return err
		}
		a = []any{opt.Quant.Codes, opt.Quant.Scales}
	}
	args := append([]any{sorted.SortedIDs, sorted.ExpertIDs, sorted.Total}, a...)
	args = append(args, wg, wu, ws, sg, su, ss, inter.Ptr,
		int32(sorted.Numel), int32(topk), int32(bank.I), int32(bank.H), int32(sorted.BlockSize), int32(bank.NumExperts))
	return gemmLaunch(m, kern, grid, st, []cuda.DevicePtr{wg, wu}, ws, bank.H, bank.I, bank.NumExperts, args)
}

// checkGEMM checks what both GEMM stages take: the bank, the alignment and
// an f32 or bf16 activation type.
func checkGEMM(bank *ExpertBank, sorted *Sorted, opt GEMMOptions) error {
	if err := bank.check(); err != nil {
		return err
	}
	if err := sorted.check(); err != nil {
		return err
	}
	if opt.Act != MatF32 && opt.Act != MatBF16 {
		return fmt.Errorf("grouped gemm: activation type %v", opt.Act)
	}
	return nil
}

// stage picks the kernel of one GEMM stage (gate_up or down) over bank, with
// reduction length k and n output columns per slot, checks that the w8a8
// scratch fits rows x k activations, and loads its module and grid.
func (o GEMMOptions) stage(dev *cuda.Device, stage string, bank *ExpertBank, sorted *Sorted, rows, k, n int) (m *Module, kern *gemmKernel, grid [3]uint32, err error) {
	kern, err = o.kernel(stage, bank.DType, k, sorted.Numel, bank.NumExperts, isHopper(dev))
	if err != nil {
		return
	}
	if o.W8A8 {
		if err = o.Quant.fits(rows, k); err != nil {
			return
		}
	}
	if m, err = Load(dev, kern.module); err != nil {
		return
	}
	grid, err = kern.grid(sorted.SortedIDs.Len(), n, dev.SMs)
	return
}

// gemmLaunch launches grouped GEMM kernel kern with args: a wgmma kernel
// through wgLaunch (w: its weight matrices, estride their expert stride in
// elements, k x n each, experts of them), any other directly.
func gemmLaunch(m *Module, kern *gemmKernel, grid [3]uint32, st cuda.Stream, w []cuda.DevicePtr, estride int64, k, n, experts int, args []any) error {
	if kern.wgmma {
		return wgLaunch(m, kern, grid, st, w, estride, k, n, experts, args)
	}
	return m.Launch(kern.name, grid, Block(kern.threads), kern.smem, st, args...)
}

// wgLaunch launches wgmma kernel kern with args followed by one tensor map
// per weight matrix of w (a __grid_constant__ CUtensorMap each): the 3D view
// {k, n, experts} of [experts][n][k] weights of type kern.tmap (bf16, or fp8
// as bytes) with an expert stride of estride elements, box {128 bytes of k,
// kern.boxRows, 1} (64 bf16 or 128 e4m3), 128-byte swizzle (the layout of
// the kernel's shared-memory stages), zeros outside. The kernel's producer
// copies the weight tiles with the bulk tensor copy engine through them.
//
// The persistent CTAs take their work items from a counter in the module's
// global memory (one per kernel, reset by the last CTA; wg_common.cuh), so
// two launches of one wgmma kernel on a device must not run at the same
// time: callers queue the layer on one stream (validate's compute stream,
// bench's stream), which orders them.
func wgLaunch(m *Module, kern *gemmKernel, grid [3]uint32, st cuda.Stream, w []cuda.DevicePtr, estride int64, k, n, experts int, args []any) error {
	dt, es := uint32(cuda.TensorMapBF16), uint64(2)
	if kern.tmap == MatFP8 {
		dt, es = cuda.TensorMapUInt8, 1
	}
	return m.dev.Do(func(c *cuda.Ctx) error {
		for _, p := range w {
			tm, err := c.EncodeTensorMapTiled(cuda.TensorMapTiled{
				DataType: dt, Base: p,
				Dims:    []uint64{uint64(k), uint64(n), uint64(experts)},
				Strides: []uint64{es * uint64(k), es * uint64(estride)},
				Box:     []uint32{uint32(128 / es), uint32(kern.boxRows), 1},
				Swizzle: cuda.TensorMapSwizzle128B, L2Promotion: cuda.TensorMapL2256B,
			})
			if err != nil {
				return fmt.Errorf("kernels: %s: weight tensor map (%d x %d x %d, expert stride %d): %w", kern.name, experts, n, k, estride, err)
			}
			args = append(args, tm)
		}
		return m.LaunchCtx(c, kern.name, grid, Block(kern.threads), kern.smem, st, args...)
	})
}

// MoEDown queues stage 2 on stream st: out[s,:] = inter[s,:] Down_e^T,
// [Numel, H] f32, unweighted (Finalize applies the slot weights).
func MoEDown(dev *cuda.Device, st cuda.Stream, bank *ExpertBank, sorted *Sorted, inter Mat, out *cuda.Buffer[float32], opt GEMMOptions) error {
	if err := checkGEMM(bank, sorted, opt); err != nil {
		return err
	}
	if err := inter.need("grouped gemm: intermediate", sorted.Numel*bank.I, opt.Act); err != nil {
		return err
	}
	if out == nil || out.Len() < sorted.Numel*bank.H {
		return fmt.Errorf("grouped gemm: output buffer smaller than %d x %d", sorted.Numel, bank.H)
	}
	var sd cuda.DevicePtr
	var ss int64
	if bank.DType == MatFP8 {
		sd, ss = bank.DownScale.Ptr(), int64(CeilDiv(bank.H, FP8ScaleBlock)*CeilDiv(bank.I, FP8ScaleBlock))
	}
	m, kern, grid, err := opt.stage(dev, "down", bank, sorted, sorted.Numel, bank.I, bank.H)
	if err != nil {
		return err
	}
	a := []any{inter.Ptr}
	if opt.W8A8 {
		// The bf16 intermediate -> e4m3 codes and per-128-channel scales (rows
		// of slots not on this bank are quantised too and never read), then
		// the e4m3 x e4m3 GEMM.
		if err = ActQuantE4M3(dev, st, inter, sorted.Numel, bank.I, opt.Quant); err != nil {
			return err
		}
		a = []any{opt.Quant.Codes, opt.Quant.Scales}
	}
	args := append([]any{sorted.SortedIDs, sorted.ExpertIDs, sorted.Total}, a...)
	args = append(args, bank.Down.Ptr, int64(bank.I*bank.H), sd, ss, out,
		int32(sorted.Numel), int32(bank.H), int32(bank.I), int32(sorted.BlockSize), int32(bank.NumExperts))
	if err := gemmLaunch(m, kern, grid, st, []cuda.DevicePtr{bank.Down.Ptr}, int64(bank.I*bank.H), bank.I, bank.H, bank.NumExperts, args); err != nil {
		return err
	}
	if bank.DownBias != nil {
		return moeDownBias(dev, st, bank, sorted, out)
	}
	return nil
}

// GroupedGEMM queues both stages: out [Numel,H] f32 from x [T,H] through the
// intermediate buffer inter [Numel,I] (activation type). The CPU twin is
// moe.GroupedGEMM.
func GroupedGEMM(dev *cuda.Device, st cuda.Stream, bank *ExpertBank, sorted *Sorted, x Mat, t, topk int, inter Mat, out *cuda.Buffer[float32], opt GEMMOptions) error {
	if err := MoEGateUp(dev, st, bank, sorted, x, t, topk, inter, opt); err != nil {
		return err
	}
	return MoEDown(dev, st, bank, sorted, inter, out, opt)
}
