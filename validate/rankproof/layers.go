package rankproof

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/gpurun"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/weightfmt"
)

// LayerCheck is one MoE layer's routed experts recomposed from the ranks
// against SRC's (RecomposeRouted), each expert through its Replica-th
// replica (its last where it has fewer): the runs 0..most-1 serve every
// physical slot. Device is where both sides ran: "cpu" (the CPU
// reference, both sides) or "cuda" (the GPU's unfused path, both sides).
type LayerCheck struct {
	Layer     int     `json:"layer"`
	Replica   int     `json:"replica"`
	Device    string  `json:"device"`
	RelL2     float64 `json:"rel_l2"`
	Tolerance float64 `json:"tolerance"`
	Pass      bool    `json:"pass"`
	// Note says why a layer of a GPU run ran on the CPU instead.
	Note string `json:"note,omitempty"`
}

// Tolerances of the CPU recomposition. The parts sum in another order
// than the whole expert's dot products: float32 rounding, a few ulps
// (measured: below 1e-7 on the fixtures). A routed_scaling_factor folded
// into BF16 or F16 weights rounds each weight once more, by up to half a
// unit in the last place (2^-9 relative for bf16; measured 1.8e-3 of
// relative L2 on the DeepSeek-V3 fixture's layers): 2^-8 bounds it. The
// GPU's are judge's for two GPU paths on the same weights (gpuTolerance).
const (
	tolSum        = 1e-5
	tolFoldedBF16 = 1.0 / 256
)

// Options say which layers CheckRecomposed recomposes, on what and where.
type Options struct {
	Tokens int    // seeded tokens a layer, besides the forced ones
	Seed   uint64 // draws the tokens and the forced ones
	// Layers are the MoE layers to recompose, by index as the contract
	// (and --layers) names them; nil: every one.
	Layers []int
	// GPU recomposes on the GPU at Precision (gpurun's PrecisionBF16,
	// PrecisionF32 or PrecisionFP8), the CPU recomposition, its twin,
	// also on the layers CPUTwin names.
	GPU       bool
	Precision string
	CPUTwin   map[int]bool
}

// CheckRecomposed recomposes the MoE layers o names of a per-rank output
// on o.Tokens seeded tokens and the forced ones that reach every expert,
// once per replica choice (so every physical slot serves), and judges it:
// on the CPU, or on the GPU with the CPU as its twin on o.CPUTwin's layers.
func CheckRecomposed(ctx context.Context, src, dst string, o Options) ([]LayerCheck, error) {
	rc, err := openRecomposer(src, dst)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	rng := rand.New(rand.NewPCG(o.Seed, 0x6d6f65707265))
	x := make([]float32, o.Tokens*rc.plan.HiddenSize)
	for k := range x {
		x[k] = float32(rng.NormFloat64())
	}
	var g *gpurun.Runner
	if o.GPU {
		if g, err = gpurun.Open(o.Precision); err != nil {
			return nil, err
		}
		defer g.Close()
	}
	var out []LayerCheck
	for i, li := range rc.c.Layers {
		if o.Layers != nil && !slices.Contains(o.Layers, li.Index) {
			continue
		}
		if i < len(rc.plan.Layers) && rc.plan.Layers[i].HashTable != "" {
			continue // hash-routed (token ids, not x): proven by its bytes alone
		}
		l, err := rc.layer(i, o.Seed)
		if err != nil {
			return nil, err
		}
		onGPU, note := g != nil, ""
		if onGPU && rc.plan.ZeroExperts > 0 && rc.x.MoETP > 1 {
			// The GPU's unfused path adds the identity experts' rows in
			// every part, which the sum must hold once.
			onGPU, note = false, "on the CPU: zero-compute experts under --moe-tp are recomposed on the CPU only"
		}
		if onGPU {
			lcs, err := rc.checkGPU(ctx, g, l, x, o)
			if err != nil {
				return nil, err
			}
			out = append(out, lcs...)
		}
		if !onGPU || o.CPUTwin[li.Index] {
			lcs, err := rc.checkCPU(ctx, l, x, o.Tokens)
			if err != nil {
				return nil, err
			}
			for k := range lcs {
				lcs[k].Note = note
			}
			out = append(out, lcs...)
		}
	}
	return out, nil
}

// checkCPU recomposes layer l on the CPU through each replica choice.
func (rc *recomposer) checkCPU(ctx context.Context, l *recomposedLayer, x []float32, T int) ([]LayerCheck, error) {
	want, err := cpuref.ReferenceLayer(ctx, rc.src, rc.plan, &l.routed, x, T, cpuref.RefOptions{Coverage: l.cov})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rc.srcDir, err)
	}
	tol := tolSum
	if rc.roundedFold() {
		tol = tolFoldedBF16
	}
	tol = rc.dequantisedTolerance(tol)
	var out []LayerCheck
	for rep := range l.most {
		got, err := rc.cpuParts(ctx, l, x, T, rep)
		if err != nil {
			return nil, err
		}
		out = append(out, judged(rc.c.Layers[l.i].Index, rep, "cpu", got, want.Y, tol))
	}
	return out, nil
}

// roundedFold says whether DST's routed down weights were rounded by
// folding routed_scaling_factor into them (not into F32 scales).
func (rc *recomposer) roundedFold() bool {
	f, err := rc.c.Format()
	return err == nil && rc.c.RoutedScalingFactorFolded && f.Fold().Into != weightfmt.FoldScales
}

// dequantisedTolerance raises tol for a --dtype output: every expert
// weight was rounded once from SRC's exact dequantisation, so the parts
// are judged as the whole-model validate judges that output (F32 holds it
// exactly: tol stays).
func (rc *recomposer) dequantisedTolerance(tol float64) float64 {
	if rc.c.Dequantized == nil {
		return tol
	}
	switch safetensors.DType(rc.c.Dequantized.DType) {
	case safetensors.BF16:
		return max(tol, judge.TolDequantBF16.MaxRelL2)
	case safetensors.F16:
		return max(tol, judge.TolDequantF16.MaxRelL2)
	}
	return tol
}

// judged is one replica choice's verdict: the relative L2 of got against
// want within tol.
func judged(layer, rep int, device string, got, want []float32, tol float64) LayerCheck {
	var d, n float64
	for k := range want {
		d += math.Pow(float64(got[k])-float64(want[k]), 2)
		n += math.Pow(float64(want[k]), 2)
	}
	if len(got) != len(want) {
		d = math.Inf(1)
	}
	rel := 0.0
	if n > 0 {
		rel = math.Sqrt(d / n)
	} else if d > 0 {
		rel = math.Inf(1)
	}
	return LayerCheck{Layer: layer, Replica: rep, Device: device, RelL2: rel, Tolerance: tol, Pass: rel <= tol}
}

// openPlanned opens the checkpoint in src and plans it; the caller closes
// the checkpoint (on an error there is none to close).
func openPlanned(src string) (*checkpoint.Checkpoint, *family.Plan, error) {
	ck, err := checkpoint.Open(src)
	if err != nil {
		return nil, nil, err
	}
	plan, err := ck.Plan()
	if err != nil {
		ck.Close()
		return nil, nil, err
	}
	return ck, plan, nil
}

// Layers are a per-rank output's MoE layers, by index as its contract
// (and --layers) names them, and those of them the recomposition runs
// on: all but the hash-routed (their experts are chosen by token id, not
// by x; their bytes are proven).
func Layers(src, dst string) (all, recomposable []int, err error) {
	c, err := readContract(dst)
	if err != nil {
		return nil, nil, err
	}
	if c == nil || c.ExpertParallel == nil {
		return nil, nil, fmt.Errorf("%s: not a per-rank output", dst)
	}
	ck, plan, err := openPlanned(src)
	if err != nil {
		return nil, nil, err
	}
	ck.Close()
	for i, li := range c.Layers {
		all = append(all, li.Index)
		if i >= len(plan.Layers) || plan.Layers[i].HashTable == "" {
			recomposable = append(recomposable, li.Index)
		}
	}
	return all, recomposable, nil
}

// GPURefusal says why the GPU cannot run the recomposition of a per-rank
// output at precision ("" when it can): gpurun's policy for SRC's and
// DST's expert weights.
func GPURefusal(src, dst, precision string) (string, error) {
	c, err := readContract(dst)
	if err != nil {
		return "", err
	}
	ck, plan, err := openPlanned(src)
	if err != nil {
		return "", err
	}
	ck.Close()
	if plan.Latent != nil {
		// validate runs a latent MoE on the GPU (gpurun's latent.go); the
		// recomposition of rank slots does not take its layers apart.
		return fmt.Sprintf("a latent MoE (routed experts on routed_expert_down_proj's %d-wide latent, then routed_expert_norm and routed_expert_up_proj back to %d) has no GPU path in the per-rank recomposition", plan.HiddenSize, plan.Latent.Hidden), nil
	}
	return gpurun.Refusal(plan, c, precision), nil
}
