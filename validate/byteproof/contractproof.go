package byteproof

import (
	"fmt"
	"math"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// The contract against SRC: every value of the "moeprep" object that is a
// function of SRC and of the contract's own choices (layout, tp, replicas,
// fold mode) is derived again here, the way convert derives it, and must be
// exactly that. The byte proof reads the contract to predict DST's bytes,
// so a forged value the bytes cannot show (shared_slot_weight, a layer's
// prefix, rsf itself) would otherwise pass `validate --bytes`.
//
// This mirrors convert's planner (convert/plan.go: contract, chooseFold,
// checkFusable, blockSize) without importing it: the proof must not trust
// the code it checks.

// Convert's bounds on --tp and --replicas.
const maxTP, maxReplicas = 1024, 1024

// checkContract compares c with what SRC implies; cfgPath is DST's
// config.json, where the contract lives.
func checkContract(cfgPath string, src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) *ByteMismatch {
	bad := func(key string, got, want any, why string) *ByteMismatch {
		return &ByteMismatch{Kind: MismatchContract, File: cfgPath, Layer: -1, Expert: -1,
			Detail: fmt.Sprintf("%s.%s is %s, %s gives %s", layout.ContractKey, key, render(got), why, render(want))}
	}
	refuse := func(key string, got any, why string) *ByteMismatch {
		return &ByteMismatch{Kind: MismatchContract, File: cfgPath, Layer: -1, Expert: -1,
			Detail: fmt.Sprintf("%s.%s is %s, but %s", layout.ContractKey, key, render(got), why)}
	}
	// fc describes SRC's expert format as the contract records it: c
	// itself, or for a dequantised DST its experts group (whose fields
	// fk names), c's own fields then saying plain weights of the dtype.
	fc, fk := c, func(k string) string { return k }
	if c.Dequantized != nil {
		g, ok := c.Dequantized.Group(layout.GroupExperts)
		if !ok {
			return refuse("dequantized.groups", c.Dequantized.Groups, "SRC's experts are what --dtype dequantises, and there is no experts group")
		}
		fc = &layout.Contract{Quantization: g.Quantization, WeightDType: g.WeightDType, WeightBlockSize: g.WeightBlockSize, ScaleDType: g.ScaleDType}
		fk = func(k string) string { return "dequantized.groups[experts]." + k }
	}
	fp8 := plan.Quantization == family.QuantFP8Block
	quant := string(plan.Quantization)
	if quant == "" {
		quant = string(family.QuantNone)
	}
	block, blockErr := srcBlockSize(src.Config)
	scaleDType, scaleErr := "", ""
	perRow := plan.Quantization == family.QuantFP8Channel || plan.Quantization == family.QuantFP8Tensor
	if perRow {
		if q, why := srcScaledQuant(src.Config); why != "" {
			return refuse(fk("quantization"), fc.Quantization, why)
		} else if q != quant {
			return bad(fk("quantization"), fc.Quantization, q, "SRC's quantization_config")
		}
		scaleDType, scaleErr = srcScaleDType(src, plan)
	}
	int4 := plan.Quantization == family.QuantInt4Pack
	var int4Block []int64
	sharedQ, sharedDT := "", ""
	if int4 {
		var why string
		if int4Block, why = srcInt4Block(src.Config); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
		if scaleDType, sharedQ, sharedDT, why = srcInt4Tensors(src, plan); why != "" {
			return refuse(fk("scale_dtype"), fc.ScaleDType, why)
		}
		if c.NumFusedSharedExperts > 0 || c.Dequantized != nil && sharedDT == c.Dequantized.DType {
			// fused shared experts are stored like the routed ones, and
			// so is a plain shared expert of the dtype they are
			// dequantised into
			sharedQ, sharedDT = "", ""
		}
	}
	nv := plan.Quantization == family.QuantNVFP4
	var nvBlock []int64
	nvInput := false
	if nv {
		var why string
		if nvBlock, nvInput, why = srcNVFP4(src, plan); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
	}
	mx := plan.Quantization == family.QuantMXFP4
	var mxBlock []int64
	if mx {
		var why string
		if mxBlock, why = srcMXFP4Block(src, plan); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
	}
	switch {
	case c.SourceFormat != src.Format:
		return bad("source_format", c.SourceFormat, src.Format, "SRC's weight files")
	case c.Family != plan.Family:
		return bad("family", c.Family, plan.Family, "SRC's model_type "+plan.ModelType)
	case c.NumExperts != plan.NumExperts:
		return bad("num_experts", c.NumExperts, plan.NumExperts, "SRC")
	case c.SharedFirstID != plan.NumExperts:
		return bad("shared_first_id", c.SharedFirstID, plan.NumExperts, "SRC's routed expert count")
	case !sameFloat(c.RoutedScalingFactor, plan.RoutedScalingFactor):
		return bad("routed_scaling_factor", c.RoutedScalingFactor, plan.RoutedScalingFactor, "SRC's config")
	case !sameFloat(c.OutputScale, outputScale(plan)):
		return bad("output_scale", orAbsent(c.OutputScale), orAbsent(outputScale(plan)), "SRC's config")
	case c.RoutedInputScaled != plan.RoutedInputScaled:
		return bad("routed_input_scaled", c.RoutedInputScaled, plan.RoutedInputScaled, "SRC's family ("+plan.ModelType+")")
	case !sameActivation(c.Activation, plan.Act):
		return bad("activation", orAbsent(c.Activation), orAbsent(activation(plan.Act)), "SRC's family ("+plan.ModelType+")")
	case c.ExpertBias != plan.ExpertBias:
		return bad("expert_bias", c.ExpertBias, plan.ExpertBias, "SRC's experts")
	case fc.WeightDType != string(plan.WeightDType):
		return bad(fk("weight_dtype"), fc.WeightDType, string(plan.WeightDType), "SRC's experts")
	case fc.Quantization != quant:
		return bad(fk("quantization"), fc.Quantization, quant, "SRC's experts")
	case fp8 && blockErr != "":
		return refuse(fk("weight_block_size"), fc.WeightBlockSize, blockErr)
	case fp8 && !equalInts(fc.WeightBlockSize, block):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, block, "SRC's quantization_config")
	case int4 && !equalInts(fc.WeightBlockSize, int4Block):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, int4Block, "SRC's quantization_config (pack-quantized INT4: [1, group size], [1, 0] per channel)")
	case nv && !equalInts(fc.WeightBlockSize, nvBlock):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, nvBlock, "SRC's NVFP4 description (group_size 16: [1, 16])")
	case c.InputScales != (nvInput && c.Dequantized == nil):
		return bad("input_scales", c.InputScales, nvInput && c.Dequantized == nil, "SRC's NVFP4 expert tensors (input_scale), which a dequantised DST drops")
	case mx && !equalInts(fc.WeightBlockSize, mxBlock):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, mxBlock, "SRC's MXFP4 blocks and scales ([1, elements per E8M0 scale])")
	case c.SharedQuantization != sharedQ:
		return bad("shared_quantization", orAbsent(c.SharedQuantization), orAbsent(sharedQ), "SRC's shared expert tensors")
	case c.SharedWeightDType != sharedDT:
		return bad("shared_weight_dtype", orAbsent(c.SharedWeightDType), orAbsent(sharedDT), "SRC's shared expert tensors")
	case !fp8 && !perRow && !int4 && !nv && !mx && len(fc.WeightBlockSize) != 0:
		return bad(fk("weight_block_size"), fc.WeightBlockSize, shown("absent"), "SRC's unquantized experts")
	case perRow && len(fc.WeightBlockSize) != 0:
		return bad(fk("weight_block_size"), fc.WeightBlockSize, shown("absent"), "SRC's "+quant+" experts (a scale per row or per weight, no blocks)")
	case perRow && scaleErr != "":
		return refuse(fk("scale_dtype"), fc.ScaleDType, scaleErr)
	case fc.ScaleDType != scaleDType:
		return bad(fk("scale_dtype"), orAbsent(fc.ScaleDType), orAbsent(scaleDType), "SRC's expert scale tensors")
	case c.Manifest != layout.ManifestFileName:
		return bad("manifest", c.Manifest, layout.ManifestFileName, "moeprep")
	case c.TP < 1 || c.TP > maxTP:
		return refuse("tp", c.TP, fmt.Sprintf("moeprep prepares for 1..%d", maxTP))
	}
	if mm := checkContractLayers(cfgPath, bad, plan, c); mm != nil {
		return mm
	}
	if c.Dequantized != nil {
		if mm := checkDequantized(src, plan, c, bad, refuse); mm != nil {
			return mm
		}
	}
	if c.SharedReplicas > 0 || c.SharedSlices > 0 || c.NumFusedSharedExperts > 0 {
		if why := unfusable(src, plan, block); why != "" {
			return refuse("num_fused_shared_experts", c.NumFusedSharedExperts, why)
		}
		switch {
		case c.SharedSlices != plan.NumSharedExperts:
			return bad("shared_slices", c.SharedSlices, plan.NumSharedExperts, "SRC's shared expert count")
		case c.SharedReplicas < 1 || c.SharedReplicas > maxReplicas:
			return refuse("shared_replicas", c.SharedReplicas, fmt.Sprintf("fuse-shared writes 1..%d replicas", maxReplicas))
		case c.NumFusedSharedExperts != c.SharedReplicas*c.SharedSlices:
			return bad("num_fused_shared_experts", c.NumFusedSharedExperts, c.SharedReplicas*c.SharedSlices, "shared_replicas x shared_slices")
		}
	}
	switch c.FoldMode {
	case layout.FoldAuto, layout.FoldDown, layout.FoldNone:
	default:
		return refuse("fold_mode", c.FoldMode, "moeprep writes auto, down or none")
	}
	if want := foldsRSF(src, plan, c.FoldMode) && c.Dequantized == nil; c.RoutedScalingFactorFolded != want {
		return bad("routed_scaling_factor_folded", c.RoutedScalingFactorFolded, want,
			fmt.Sprintf("fold_mode %s on SRC's %s experts with routed_scaling_factor %v", c.FoldMode, plan.DTypeName(), plan.RoutedScalingFactor))
	}
	// Folded: the routed sum carries rsf, so the shared slots weigh 1.
	// Not folded: the engine multiplies the whole sum by rsf, so the
	// shared slots weigh 1/rsf, computed as convert computes it.
	slot := 1.0
	if !c.RoutedScalingFactorFolded {
		slot = 1 / plan.RoutedScalingFactor
	}
	if !sameFloat(c.SharedSlotWeight, slot) {
		why := fmt.Sprintf("1 / routed_scaling_factor %v (not folded)", plan.RoutedScalingFactor)
		if c.RoutedScalingFactorFolded {
			why = "routed_scaling_factor folded into the routed experts"
		}
		return bad("shared_slot_weight", c.SharedSlotWeight, slot, why)
	}
	if !c.RoutedScalingFactorFolded && c.FoldMaxRelChange != 0 {
		return bad("fold_max_rel_change", c.FoldMaxRelChange, 0, "nothing folded")
	}
	return nil
}

// checkContractLayers: the contract's layers are SRC's MoE layers, in
// order, with SRC's prefixes.
func checkContractLayers(cfgPath string, bad func(string, any, any, string) *ByteMismatch, plan *family.Plan, c *layout.Contract) *ByteMismatch {
	if len(c.Layers) != len(plan.Layers) {
		return &ByteMismatch{Kind: MismatchContract, File: cfgPath, Layer: -1, Expert: -1,
			Detail: fmt.Sprintf("%s.layers lists %d layers, SRC has %d MoE layers", layout.ContractKey, len(c.Layers), len(plan.Layers))}
	}
	for i, l := range plan.Layers {
		want := layout.LayerInfo{Index: l.Index, MTP: l.MTP, Prefix: l.Prefix}
		if c.Layers[i] != want {
			return bad(fmt.Sprintf("layers[%d]", i), c.Layers[i], want, "SRC's plan")
		}
	}
	return nil
}

// sameFloat is exact equality: the contract's numbers go through JSON,
// which gives back the very float64 convert wrote.
func sameFloat(a, b float64) bool { return a == b }

// orAbsent shows a contract value that JSON omits when zero.
func orAbsent[T comparable](v T) any {
	var zero T
	if v == zero {
		return shown("absent")
	}
	return v
}

// outputScale is the contract's output_scale: absent (0) when it is 1.
func outputScale(plan *family.Plan) float64 {
	if s := plan.Output(); s != 1 {
		return s
	}
	return 0
}

// activation is the contract's activation: absent (nil) for SwiGLU.
func activation(a layout.Activation) *layout.Activation {
	if a.SwiGLU() {
		return nil
	}
	return &a
}

func sameActivation(got *layout.Activation, want layout.Activation) bool {
	w := activation(want)
	if got == nil || w == nil {
		return got == nil && w == nil
	}
	return *got == *w
}

// agreeBlock adds b, the weight_block_size one piece of SRC implies, to
// *out, the one every piece before it agreed on (nil before the first):
// false when b differs from it.
func agreeBlock(out *[]int64, b []int64) bool {
	if *out != nil && !equalInts(*out, b) {
		return false
	}
	*out = b
	return true
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// srcBlockSize is the FP8 block convert reads from SRC's
// quantization_config.weight_block_size, [128, 128] when absent; a
// non-empty problem says why convert would have refused it.
func srcBlockSize(cfg map[string]any) ([]int64, string) {
	qc, _ := cfg["quantization_config"].(map[string]any)
	raw, ok := qc["weight_block_size"].([]any)
	if !ok {
		return []int64{128, 128}, ""
	}
	problem := fmt.Sprintf("SRC's quantization_config.weight_block_size %s is not two positive integers, so moeprep cannot have converted it", render(raw))
	if len(raw) != 2 {
		return nil, problem
	}
	out := make([]int64, 2)
	for i, v := range raw {
		f, ok := v.(float64)
		if !ok || f < 1 || f > 1<<20 || f != math.Trunc(f) {
			return nil, problem
		}
		out[i] = int64(f)
	}
	return out, ""
}

// unfusable says why fuse-shared refuses SRC ("" when it does not): a
// shared expert that is gated or weighted per token, or that cannot be
// split exactly into experts of the bank, has no constant slot weight.
func unfusable(src *checkpoint.Checkpoint, plan *family.Plan, block []int64) string {
	switch {
	case plan.SharedGated:
		return fmt.Sprintf("SRC's family (%s) gates its shared expert per token, so fuse-shared refuses it", plan.ModelType)
	case plan.SharedRouted:
		return fmt.Sprintf("SRC's family (%s) weights each shared expert per token by its router row, so fuse-shared refuses it", plan.ModelType)
	case plan.NumSharedExperts == 0:
		return "SRC has no shared expert to fuse"
	case plan.RoutedInputScaled:
		return fmt.Sprintf("SRC's family (%s) scales the routed experts' input, so fuse-shared refuses it", plan.ModelType)
	}
	for _, l := range plan.Layers {
		switch {
		case l.SharedGate != "":
			return fmt.Sprintf("SRC's layer %d gates its shared expert per token by %s, so fuse-shared refuses it", l.Index, l.SharedGate)
		case l.Shared == nil:
			return fmt.Sprintf("SRC's layer %d has no shared expert to fuse", l.Index)
		case l.Shared.GateBias != "":
			return fmt.Sprintf("SRC's layer %d has a shared expert with biases, so fuse-shared refuses it", l.Index)
		}
	}
	if si, s := plan.SharedIntermediateSize, plan.NumSharedExperts*plan.MoEIntermediateSize; si != 0 && si != s {
		return fmt.Sprintf("SRC's shared expert (intermediate %d) is not %d experts of intermediate %d, so it cannot be split", si, plan.NumSharedExperts, plan.MoEIntermediateSize)
	}
	if plan.Quantization == family.QuantFP8Block && plan.NumSharedExperts > 1 && len(block) == 2 &&
		(int64(plan.MoEIntermediateSize)%block[0] != 0 || int64(plan.MoEIntermediateSize)%block[1] != 0) {
		return fmt.Sprintf("SRC's FP8 blocks %v straddle the %d shared slices, so the shared expert cannot be split", block, plan.NumSharedExperts)
	}
	return ""
}

// foldsRSF is whether convert folds rsf for fold mode mode on SRC: never
// with none, rsf 1 or expert biases; into F32 non-UE8M0 FP8 scales with
// auto or down; into bf16/f16/f32 weights with down. (Where convert
// refuses instead, no genuine output exists and false is as good.)
func foldsRSF(src *checkpoint.Checkpoint, plan *family.Plan, mode string) bool {
	if mode == layout.FoldNone || plan.RoutedScalingFactor == 1 || plan.ExpertBias {
		return false
	}
	if plan.Quantization == family.QuantFP8Channel || plan.Quantization == family.QuantFP8Tensor {
		// Into the scales: by default where they are F32, only when asked
		// (down) where they are BF16 or F16.
		dt, why := srcScaleDType(src, plan)
		return why == "" && (dt == string(safetensors.F32) || mode == layout.FoldDown)
	}
	if plan.Quantization == family.QuantFP8Block {
		if plan.ScaleFmt == "ue8m0" {
			return false
		}
		for _, l := range plan.Layers {
			for _, e := range l.Experts {
				if t, ok := src.Tensor(e.DownScale); ok && t.DType != safetensors.F32 {
					return false
				}
			}
		}
		return true
	}
	switch plan.WeightDType {
	case safetensors.F32, safetensors.BF16, safetensors.F16:
		return mode == layout.FoldDown
	}
	return false
}

// srcScaledQuant is the quantization convert records for SRC's FP8 per
// channel or per tensor weights, read from SRC's quantization_config
// itself: quant_method fp8 without weight_block_size is per tensor; a
// compressed-tensors config is what its config groups' weights strategy
// says, all alike. A non-empty problem says why convert would have
// refused it.
func srcScaledQuant(cfg map[string]any) (string, string) {
	qc, _ := cfg["quantization_config"].(map[string]any)
	method, _ := qc["quant_method"].(string)
	switch method {
	case "fp8":
		if _, blocked := qc["weight_block_size"]; blocked {
			return "", "SRC's quantization_config has a weight_block_size: FP8 blocks, not a scale per row or per weight"
		}
		return "fp8_tensor", ""
	case "compressed-tensors":
	default:
		return "", fmt.Sprintf("SRC's quantization_config.quant_method %s is neither fp8 nor compressed-tensors", render(method))
	}
	groups, _ := qc["config_groups"].(map[string]any)
	out := ""
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		w, _ := gm["weights"].(map[string]any)
		strategy, _ := w["strategy"].(string)
		var q string
		switch strategy {
		case "channel":
			q = "fp8_channel"
		case "tensor", "":
			q = "fp8_tensor"
		default:
			return "", fmt.Sprintf("SRC's config group strategy %s is neither channel nor tensor", render(strategy))
		}
		if out != "" && q != out {
			return "", "SRC's config groups differ in their weights strategy, so moeprep cannot have converted it"
		}
		out = q
	}
	if out == "" {
		return "", "SRC's compressed-tensors quantization_config has no config group"
	}
	return out, ""
}

// srcScaleDType is the dtype of SRC's expert scale tensors (every routed
// and shared expert's, which must be one), as convert records it; a
// non-empty problem says why convert would have refused SRC.
func srcScaleDType(src *checkpoint.Checkpoint, plan *family.Plan) (string, string) {
	var dt safetensors.DType
	var from string
	check := func(m family.MLP) string {
		for _, name := range []string{m.GateScale, m.UpScale, m.DownScale} {
			t, ok := src.Tensor(name)
			if !ok {
				return fmt.Sprintf("SRC has no scale tensor %s", render(name))
			}
			if dt == "" {
				dt, from = t.DType, name
			} else if t.DType != dt {
				return fmt.Sprintf("SRC's scale %s is %s and %s is %s, so moeprep cannot have converted it", name, t.DType, from, dt)
			}
		}
		return ""
	}
	for _, l := range plan.Layers {
		for _, e := range l.Experts {
			if why := check(e); why != "" {
				return "", why
			}
		}
		if l.Shared != nil {
			if why := check(*l.Shared); why != "" {
				return "", why
			}
		}
	}
	if dt == "" {
		return "", "SRC has no expert scale tensors"
	}
	return string(dt), ""
}

// srcInt4Block is weight_block_size as convert records it for SRC's
// pack-quantized INT4 experts, read from SRC's quantization_config itself:
// [1, group_size] for strategy group, [1, 0] for channel, every config
// group alike. A non-empty problem says why convert would have refused it.
func srcInt4Block(cfg map[string]any) ([]int64, string) {
	qc, _ := cfg["quantization_config"].(map[string]any)
	if m, _ := qc["quant_method"].(string); m != "compressed-tensors" {
		return nil, fmt.Sprintf("SRC's quantization_config.quant_method %s is not compressed-tensors", render(m))
	}
	groups, _ := qc["config_groups"].(map[string]any)
	var out []int64
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		w, _ := gm["weights"].(map[string]any)
		var b []int64
		switch st, _ := w["strategy"].(string); st {
		case "channel":
			b = []int64{1, 0}
		case "group":
			n, ok := w["group_size"].(float64)
			if !ok || n < 1 || n != float64(int64(n)) {
				return nil, fmt.Sprintf("SRC's config group has no usable group_size (%s)", render(w["group_size"]))
			}
			b = []int64{1, int64(n)}
		default:
			return nil, fmt.Sprintf("SRC's config group strategy %s is neither group nor channel", render(st))
		}
		if !agreeBlock(&out, b) {
			return nil, "SRC's config groups differ in their weights strategy or group size, so moeprep cannot have converted it"
		}
	}
	if out == nil {
		return nil, "SRC's compressed-tensors quantization_config has no config group"
	}
	return out, ""
}

// srcInt4Tensors reads, from SRC's tensors, the dtype of the routed
// experts' weight_scale tensors (all one) and how the shared expert is
// stored: "" "" when packed like the routed experts, else "none" and the
// dtype of its plain weights. A non-empty problem says why convert would
// have refused SRC.
func srcInt4Tensors(src *checkpoint.Checkpoint, plan *family.Plan) (scale, sharedQ, sharedDT, why string) {
	var from string
	for _, l := range plan.Layers {
		for _, e := range l.Experts {
			for _, name := range []string{e.GateScale, e.UpScale, e.DownScale} {
				t, ok := src.Tensor(name)
				if !ok {
					return "", "", "", fmt.Sprintf("SRC has no scale tensor %s", render(name))
				}
				if scale == "" {
					scale, from = string(t.DType), name
				} else if string(t.DType) != scale {
					return "", "", "", fmt.Sprintf("SRC's scale %s is %s and %s is %s, so moeprep cannot have converted it", name, t.DType, from, scale)
				}
			}
		}
		if l.Shared == nil {
			continue
		}
		var q, dt string
		for _, name := range []string{l.Shared.Gate, l.Shared.Up, l.Shared.Down} {
			t, ok := src.Tensor(name)
			if !ok {
				return "", "", "", fmt.Sprintf("SRC has no shared expert tensor %s", render(name))
			}
			tq, tdt := "", ""
			if t.DType != safetensors.I32 {
				tq, tdt = string(family.QuantNone), string(t.DType)
			}
			if q == "" && dt == "" {
				q, dt = tq, tdt
			} else if tq != q || tdt != dt {
				return "", "", "", fmt.Sprintf("SRC's shared expert tensor %s is %s unlike its other projections", name, t.DType)
			}
		}
		if sharedQ == "" && sharedDT == "" {
			sharedQ, sharedDT = q, dt
		} else if q != sharedQ || dt != sharedDT {
			return "", "", "", fmt.Sprintf("SRC's layer %d shared expert is stored unlike another layer's", l.Index)
		}
	}
	if scale == "" {
		return "", "", "", "SRC has no expert scale tensors"
	}
	return scale, sharedQ, sharedDT, ""
}

// srcNVFP4 derives an NVFP4 contract's weight_block_size from SRC's own
// description (config.json's quantization_config, else
// hf_quant_config.json's quantization: quant_algo NVFP4, group_size 16)
// and whether its experts carry input_scale (the first routed expert's
// gate projection, looked up by its hub name).
func srcNVFP4(src *checkpoint.Checkpoint, plan *family.Plan) (block []int64, input bool, why string) {
	desc, _ := src.Config["quantization_config"].(map[string]any)
	if desc == nil {
		if hf := src.HFQuantConfig(); hf != nil {
			desc, _ = hf["quantization"].(map[string]any)
		}
	}
	if desc == nil {
		return nil, false, "SRC has no NVFP4 description (quantization_config or hf_quant_config.json)"
	}
	if a, _ := desc["quant_algo"].(string); a != "NVFP4" {
		return nil, false, fmt.Sprintf("SRC's quant_algo is %q, not NVFP4", a)
	}
	g := 16.0
	if v, ok := desc["group_size"].(float64); ok {
		g = v
	}
	if g != 16 {
		return nil, false, fmt.Sprintf("SRC's group_size is %v, not 16", g)
	}
	if len(plan.Layers) > 0 && len(plan.Layers[0].Experts) > 0 {
		w := plan.Layers[0].Experts[0].Gate
		_, input = src.Tensor(strings.TrimSuffix(w, ".weight") + ".input_scale")
	}
	return []int64{1, 16}, input, ""
}

// srcMXFP4Block is weight_block_size as convert records it for SRC's
// gpt-oss MXFP4 experts, derived from SRC itself: quant_method mxfp4, and
// per MoE layer the stacked gate_up_proj_blocks U8 [E, rows, n, b] and
// gate_up_proj_scales U8 [E, rows, n] (and down's alike): one scale per b
// bytes of blocks, two E2M1 elements a byte, so [1, 2b] (OCP MX: [1, 32]).
// A non-empty problem says why convert would have refused it.
func srcMXFP4Block(src *checkpoint.Checkpoint, plan *family.Plan) ([]int64, string) {
	qc, _ := src.Config["quantization_config"].(map[string]any)
	if m, _ := qc["quant_method"].(string); m != "mxfp4" {
		return nil, fmt.Sprintf("SRC's quantization_config.quant_method %s is not mxfp4", render(m))
	}
	var out []int64
	for _, l := range plan.Layers {
		for _, w := range []string{"gate_up_proj", "down_proj"} {
			blocks, scales := l.Prefix+".experts."+w+"_blocks", l.Prefix+".experts."+w+"_scales"
			bt, ok1 := src.Tensor(blocks)
			st, ok2 := src.Tensor(scales)
			switch {
			case !ok1 || !ok2:
				return nil, fmt.Sprintf("SRC has no %s and %s", blocks, scales)
			case bt.DType != "U8" || st.DType != "U8" || len(bt.Shape) != 4 || len(st.Shape) != 3 ||
				bt.Shape[0] != st.Shape[0] || bt.Shape[1] != st.Shape[1] || bt.Shape[2] != st.Shape[2] || bt.Shape[3] < 1:
				return nil, fmt.Sprintf("SRC's %s %s %v and %s %s %v are not U8 [E, rows, n, b] and U8 [E, rows, n]", blocks, bt.DType, bt.Shape, scales, st.DType, st.Shape)
			}
			b := []int64{1, 2 * bt.Shape[3]}
			if !agreeBlock(&out, b) {
				return nil, "SRC's MXFP4 tensors differ in the elements one scale covers"
			}
		}
	}
	if out == nil {
		return nil, "SRC has no MoE layer"
	}
	return out, ""
}
