package kernels

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// kernelChoice is one case of a kernel-choice table: the gate_up kernel
// opt.kernel names for weights w, reduction k, numel slots and exp experts.
type kernelChoice struct {
	name          string
	opt           GEMMOptions
	w             MatDType
	k, numel, exp int
	hopper        bool
	want          string // "" = an error
}

// checkKernelChoice runs a table; every wgmma kernel it names must come
// with the block size its family needs (wgThreads: WG_THREADS or WF_THREADS).
func checkKernelChoice(t *testing.T, cases []kernelChoice, wgThreads int) {
	t.Helper()
	for _, c := range cases {
		k, err := c.opt.kernel("gate_up", c.w, c.k, c.numel, c.exp, c.hopper)
		fn := ""
		if k != nil {
			fn = k.name
		}
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: got %s, want an error", c.name, fn)
		case c.want != "" && (err != nil || fn != c.want):
			t.Errorf("%s: got %q (%v), want %s", c.name, fn, err, c.want)
		case k != nil && k.wgmma && k.threads != wgThreads:
			t.Errorf("%s: %d threads, want %d", c.name, k.threads, wgThreads)
		}
	}
}

// TestGEMMKernelChoice checks which kernel PathAuto and the explicit paths
// name, on Hopper and elsewhere (no GPU needed).
func TestGEMMKernelChoice(t *testing.T) {
	bf16 := GEMMOptions{Act: MatBF16}
	cases := []kernelChoice{
		{"auto hopper many rows", bf16, MatBF16, 7168, 36864, 264, true, "moe_gate_up_wg_bf16_bf16"},
		{"auto ampere many rows", bf16, MatBF16, 7168, 36864, 264, false, "moe_gate_up_tall_bf16_bf16"},
		{"auto hopper few rows", bf16, MatBF16, 7168, 9 * 128, 264, true, "moe_gate_up_mma3_bf16_bf16"},
		{"auto ampere few rows", bf16, MatBF16, 7168, 9 * 128, 264, false, "moe_gate_up_mma2_bf16_bf16"},
		{"auto hopper few rows fp8", bf16, MatFP8, 7168, 9 * 128, 264, true, "moe_gate_up_mma2_bf16_fp8"},
		{"auto hopper fp8", bf16, MatFP8, 7168, 36864, 264, true, "moe_gate_up_tall_bf16_fp8"},
		{"auto hopper odd K", bf16, MatBF16, 7164, 36864, 264, true, "moe_gate_up_mma_bf16_bf16"},
		{"auto hopper many experts", bf16, MatBF16, 7168, 64 * 2000, 2000, true, "moe_gate_up_tall_bf16_bf16"},
		{"wgmma hopper", GEMMOptions{Act: MatBF16, Path: PathWGMMA}, MatBF16, 2048, 8, 264, true, "moe_gate_up_wg_bf16_bf16"},
		{"wgmma ampere", GEMMOptions{Act: MatBF16, Path: PathWGMMA}, MatBF16, 2048, 36864, 264, false, ""},
		{"wgmma fp8", GEMMOptions{Act: MatBF16, Path: PathWGMMA}, MatFP8, 2048, 36864, 264, true, ""},
		{"wgmma f32 act", GEMMOptions{Act: MatF32, Path: PathWGMMA}, MatBF16, 2048, 36864, 264, true, ""},
		{"wgmma K", GEMMOptions{Act: MatBF16, Path: PathWGMMA}, MatBF16, 2044, 36864, 264, true, ""},
		{"mma3", GEMMOptions{Act: MatBF16, Path: PathMMA3}, MatBF16, 7168, 9 * 128, 264, false, "moe_gate_up_mma3_bf16_bf16"},
		{"mma3 fp8", GEMMOptions{Act: MatBF16, Path: PathMMA3}, MatFP8, 7168, 9 * 128, 264, true, ""},
		{"mma3 K", GEMMOptions{Act: MatBF16, Path: PathMMA3}, MatBF16, 7164, 9 * 128, 264, true, ""},
		{"mma3 f32 act", GEMMOptions{Act: MatF32, Path: PathMMA3}, MatBF16, 7168, 9 * 128, 264, true, ""},
	}
	checkKernelChoice(t, cases, 512) // WG_THREADS: a producer and 3 consumer warpgroups
	if g, _ := gemmGrid(&Sorted{}, 2048, "moe_down_wg_bf16_bf16", 132); g != [3]uint32{132, 1, 1} {
		t.Errorf("wgmma grid %v, want one CTA per SM", g)
	}
	if wgSmemBytes != 215744 {
		t.Errorf("wgSmemBytes %d, want 215744 (WG_SMEM_BYTES)", wgSmemBytes)
	}
	if mma3SmemBytes(true) != 92160 || mma3SmemBytes(false) != 81920 {
		t.Errorf("mma3 shared memory %d / %d, want 92160 / 81920 (5 stages of 18 KiB, 8 of 10 KiB)", mma3SmemBytes(true), mma3SmemBytes(false))
	}
	// T = 128 at DeepSeek-V3 shapes: 5112 sorted rows (1152 slots + 264 x 15).
	for _, c := range []struct {
		fn   string
		n    int
		want [3]uint32
	}{
		{"moe_gate_up_mma3_bf16_bf16", 2048, [3]uint32{32, 320, 1}},
		{"moe_down_mma3_bf16_bf16", 7168, [3]uint32{7168 / mma3DownBN, 320, 1}},
		{"moe_down_tall_bf16_bf16", 7168, [3]uint32{56, 320, 1}},
		{"moe_down_mma2_bf16_bf16", 7168, [3]uint32{320, 112, 1}},
	} {
		if g, err := gemmKernels[c.fn].grid(5112, c.n, 132); err != nil || g != c.want {
			t.Errorf("%s grid %v (%v), want %v", c.fn, g, err, c.want)
		}
	}
	if wgBM != 192 || wgBN != 192 {
		t.Errorf("wgmma tile %d x %d, want 192 x 192 (WG_BM x WG_BNB)", wgBM, wgBN)
	}
}

// TestGEMMKernelChoiceW8A8 checks the w8a8 mode's kernel choice: the e4m3 x
// e4m3 wgmma kernels on Hopper with fp8 weights and K % 16 == 0, an error
// everywhere else (no kernel computes its numerics but those).
func TestGEMMKernelChoiceW8A8(t *testing.T) {
	w8 := GEMMOptions{Act: MatBF16, W8A8: true}
	cases := []kernelChoice{
		{"auto hopper", w8, MatFP8, 7168, 36864, 264, true, "moe_gate_up_wg_fp8_fp8"},
		{"auto hopper few rows", w8, MatFP8, 7168, 9, 264, true, "moe_gate_up_wg_fp8_fp8"},
		{"wgmma hopper", GEMMOptions{Act: MatBF16, W8A8: true, Path: PathWGMMA}, MatFP8, 2048, 8, 264, true, "moe_gate_up_wg_fp8_fp8"},
		{"ampere", w8, MatFP8, 7168, 36864, 264, false, ""},
		{"bf16 weights", w8, MatBF16, 7168, 36864, 264, true, ""},
		{"f32 act", GEMMOptions{Act: MatF32, W8A8: true}, MatFP8, 7168, 36864, 264, true, ""},
		{"K 8 mod 16", w8, MatFP8, 7160, 36864, 264, true, ""},
		{"many experts", w8, MatFP8, 7168, 36864, 2000, true, ""},
		{"tall path", GEMMOptions{Act: MatBF16, W8A8: true, Path: PathMMATall}, MatFP8, 7168, 36864, 264, true, ""},
	}
	checkKernelChoice(t, cases, 384) // WF_THREADS: a producer and 2 consumer warpgroups
	if g, _ := gemmGrid(&Sorted{}, 2048, "moe_down_wg_fp8_fp8", 132); g != [3]uint32{132, 1, 1} {
		t.Errorf("w8a8 grid %v, want one CTA per SM", g)
	}
	if wfSmemBytes != 225648 {
		t.Errorf("wfSmemBytes %d, want 225648 (WF_SMEM_BYTES, printed by scripts/wg/harness_fp8.cu)", wfSmemBytes)
	}
	var q *QuantScratch
	if err := q.fits(1, 128); err == nil {
		t.Error("nil quantisation scratch accepted")
	}
}

// TestParseGEMMPath checks that every path's name reads back as that path
// and that an unknown name is refused with the list of names.
func TestParseGEMMPath(t *testing.T) {
	for p := PathAuto; p <= PathMMA3; p++ {
		got, err := ParseGEMMPath(p.String())
		if err != nil || got != p {
			t.Errorf("%d: name %q reads back as %v, %v", p, p.String(), got, err)
		}
	}
	_, err := ParseGEMMPath("cutlass")
	testkit.ErrorContains(t, err, "auto, simt, mma, mma2, tall, wgmma, mma3", "unknown path")
}

// TestGEMMKernelTable holds gemmKernels to the CUDA sources: every entry
// names a kernel of its module's source, and every grouped GEMM kernel
// (moe_gate_up_*, moe_down_*, moe_proj_*) of those sources has an entry.
func TestGEMMKernelTable(t *testing.T) {
	kernelName := regexp.MustCompile(`\bmoe_(?:gate_up|down|proj)_\w+`)
	inSource := map[string]map[string]bool{}
	for _, k := range gemmKernels {
		if inSource[k.module] != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("cuda", k.module+".cu"))
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, n := range kernelName.FindAllString(cComment.ReplaceAllString(string(b), ""), -1) {
			names[n] = true
		}
		inSource[k.module] = names
	}
	for name, k := range gemmKernels {
		if name != k.name || !inSource[k.module][name] {
			t.Errorf("gemmKernels has %s, which kernels/cuda/%s.cu does not define", name, k.module)
		}
	}
	for module, names := range inSource {
		for n := range names {
			if k, ok := gemmKernels[n]; !ok || k.module != module {
				t.Errorf("kernels/cuda/%s.cu defines %s, which gemmKernels does not list under %s", module, n, module)
			}
		}
	}
}
