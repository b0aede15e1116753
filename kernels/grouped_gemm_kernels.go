package kernels

import "fmt"

// gemmKernel is one grouped GEMM entry point of the fatbins and what a
// launch of it needs; GEMMOptions.kernel picks one from gemmKernels.
type gemmKernel struct {
	name    string // the extern "C" function
	module  string // its kernel family: kernels/cuda/<module>.cu, build/<module>.fatbin
	threads int    // block size
	smem    uint32 // dynamic shared memory (Module.Launch raises the limit above 48 KiB)

	// The tiled kernels' grid: one CTA per gemmRowTile sorted rows and per
	// cols output columns, rows in x and column tiles in y, or the
	// transpose when colsFastest (tall, mma3: the CTAs that run together
	// share their gathered rows and stream a few experts' weights end to
	// end; see grouped_gemm.cu).
	cols        int
	colsFastest bool

	// wgmma: a Hopper warpgroup kernel (grouped_gemm_wg*.cu, compute
	// capability 9.0 only): a persistent grid of one CTA per SM, and after
	// the arguments one tensor map per weight matrix (wgLaunch) of element
	// type tmap in boxes of boxRows weight rows.
	wgmma   bool
	tmap    MatDType
	boxRows int
}

// gemmStages are the kernel name's stage parts: stage 1 (gate and up) and 2.
var gemmStages = [...]string{"gate_up", "down"}

// gemmKernels holds every grouped GEMM kernel by name: the SIMT kernels
// (any activation and weight type; moe_proj_* are act.go's ungated stage 1),
// the mma.sync variants (bf16 activations: mma, mma2 and tall for bf16 and
// fp8 weights, mma3 for bf16), and the wgmma kernels (bf16, and the w8a8
// mode's e4m3 x e4m3).
var gemmKernels = func() map[string]*gemmKernel {
	m := map[string]*gemmKernel{}
	add := func(k gemmKernel) { m[k.name] = &k }
	for _, act := range []MatDType{MatF32, MatBF16} {
		for _, w := range []MatDType{MatF32, MatBF16, MatFP8} {
			for _, stage := range []string{"gate_up", "down", "proj"} {
				add(gemmKernel{name: fmt.Sprintf("moe_%s_%v_%v", stage, act, w), module: "grouped_gemm", threads: 256, cols: gemmColTile})
			}
		}
	}
	for _, stage := range gemmStages {
		// Output columns of a tall and an mma3 CTA, and weight matrices per
		// wgmma tile: gate_up CTAs take gemmColTile columns of gate and of
		// up, and its wgmma tiles boxes of wgBN/2 (96) gate and up rows; down
		// CTAs 128 (tall) or mma3DownBN columns, boxes of wgBN (192) rows.
		// Likewise wfBN for w8a8.
		gated := stage == "gate_up"
		tallCols, mma3Cols, mats := 2*gemmColTile, mma3DownBN, 1
		if gated {
			tallCols, mma3Cols, mats = gemmColTile, gemmColTile, 2
		}
		for _, w := range []MatDType{MatBF16, MatFP8} {
			add(gemmKernel{name: fmt.Sprintf("moe_%s_mma_bf16_%v", stage, w), module: "grouped_gemm", threads: 128, cols: gemmColTile})
			add(gemmKernel{name: fmt.Sprintf("moe_%s_mma2_bf16_%v", stage, w), module: "grouped_gemm", threads: 128, cols: gemmColTile})
			add(gemmKernel{name: fmt.Sprintf("moe_%s_tall_bf16_%v", stage, w), module: "grouped_gemm", threads: 256, cols: tallCols, colsFastest: true})
		}
		add(gemmKernel{name: fmt.Sprintf("moe_%s_mma3_bf16_bf16", stage), module: "grouped_gemm", threads: 128,
			smem: mma3SmemBytes(gated), cols: mma3Cols, colsFastest: true})
		add(gemmKernel{name: fmt.Sprintf("moe_%s_wg_bf16_bf16", stage), module: "grouped_gemm_wg", threads: wgThreads,
			smem: wgSmemBytes, wgmma: true, tmap: MatBF16, boxRows: wgBN / mats})
		add(gemmKernel{name: fmt.Sprintf("moe_%s_wg_fp8_fp8", stage), module: "grouped_gemm_wg_fp8", threads: wfThreads,
			smem: wfSmemBytes, wgmma: true, tmap: MatFP8, boxRows: wfBN / mats})
	}
	return m
}()

// gemmKernelNamed returns the table entry of kernel fn.
func gemmKernelNamed(fn string) (*gemmKernel, error) {
	if k, ok := gemmKernels[fn]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("grouped gemm: no kernel %s", fn)
}

// grid is the kernel's launch grid for a sorted-id array of the given
// length, n output columns and sms multiprocessors.
func (k *gemmKernel) grid(sorted, n, sms int) ([3]uint32, error) {
	if k.wgmma {
		return [3]uint32{uint32(max(sms, 1)), 1, 1}, nil
	}
	rows, cols := CeilDiv(sorted, gemmRowTile), CeilDiv(n, k.cols)
	if k.colsFastest {
		if rows > 65535 {
			return [3]uint32{}, fmt.Errorf("grouped gemm: %d sorted rows exceed the launch grid of %s", sorted, k.name)
		}
		return [3]uint32{uint32(cols), uint32(rows), 1}, nil
	}
	if cols > 65535 {
		return [3]uint32{}, fmt.Errorf("grouped gemm: %d output columns exceed the launch grid", n)
	}
	return [3]uint32{uint32(rows), uint32(cols), 1}, nil
}
