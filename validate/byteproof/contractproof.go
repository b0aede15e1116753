package byteproof

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
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
		fc = &layout.Contract{Quantization: g.Quantization, WeightDType: g.WeightDType, WeightBlockSize: g.WeightBlockSize, ScaleDType: g.ScaleDType, Naming: g.Naming}
		fk = func(k string) string { return "dequantized.groups[experts]." + k }
	}
	// Only --layout transformers moves the stacks to another module, and
	// only to the one transformers 5 holds this family's in.
	if c.ExpertsModule != "" && c.ExpertsModule != plan.Transformers.Module {
		return refuse("experts_module", c.ExpertsModule, fmt.Sprintf("transformers 5 holds %s's experts under %s (the only module convert --layout transformers writes)", plan.ModelType, render(orAbsent(plan.Transformers.Module))))
	}
	fp8 := plan.Quantization == family.QuantFP8Block
	quant := string(plan.Quantization)
	if quant == "" {
		quant = string(family.QuantNone)
	}
	block, blockErr := srcBlockSize(src.Config)
	scaleDType, scaleErr := "", ""
	perRow := plan.Quantization == family.QuantFP8Channel || plan.Quantization == family.QuantFP8Tensor
	int4 := plan.Quantization == family.QuantInt4Pack
	mx := plan.Quantization == family.QuantMXFP4
	mx8 := plan.Quantization == family.QuantMXFP8
	sharedQ, sharedDT := "", ""
	if perRow || int4 || mx || mx8 {
		// These formats' ignore lists may leave the shared expert plain.
		var why string
		if sharedQ, sharedDT, why = srcSharedStorage(src, plan); why != "" {
			return refuse("shared_quantization", orAbsent(c.SharedQuantization), why)
		}
	}
	if perRow {
		if q, why := srcScaledQuant(src.Config); why != "" {
			return refuse(fk("quantization"), fc.Quantization, why)
		} else if q != quant {
			return bad(fk("quantization"), fc.Quantization, q, "SRC's quantization_config")
		}
		scaleDType, scaleErr = srcScaleDType(src, plan, sharedQ == "")
	}
	var int4Block []int64
	if int4 {
		var why string
		if int4Block, why = srcInt4Block(src.Config); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
		if scaleDType, why = srcScaleDType(src, plan, false); why != "" {
			return refuse(fk("scale_dtype"), fc.ScaleDType, why)
		}
	}
	// A plain shared expert beside quantised routed experts is fused only
	// requantised (--requantize-shared), by the routed format's rule.
	var requant *layout.Requantization
	switch {
	case sharedQ == string(family.QuantNone) && c.Dequantized != nil && sharedDT == c.Dequantized.DType:
		// a plain shared expert of the dtype --dtype dequantises the
		// routed experts into is stored like them, fused or not
		sharedQ, sharedDT = "", ""
	case sharedQ != "" && sharedQ != string(family.QuantNone) && c.Dequantized != nil:
		// a quantised shared expert apart from the routed experts
		// (DeepSeek-V4's FP8 beside FP4) is dequantised by its own format
		// among the other weights: stored like the dequantised experts
		sharedQ, sharedDT = "", ""
	case sharedQ == string(family.QuantNone) && c.NumFusedSharedExperts > 0:
		requant = srcRequantization(quant, sharedDT, plan.ScaleFmt == "ue8m0")
		sharedQ, sharedDT = "", "" // fused shared experts are stored like the routed ones
	}
	sharedSD, sharedNaming := "", ""
	var sharedBlock []int64
	if sharedQ == string(family.QuantFP8Block) {
		sharedSD, sharedNaming = srcSharedScaleNaming(src, plan)
		sharedBlock = plan.SharedBlock()
	}
	nv := plan.Quantization == family.QuantNVFP4 || plan.Quantization == family.QuantNVFP4CT
	var nvBlock []int64
	nvInput := false
	if nv {
		var why string
		if nvBlock, nvInput, why = srcNVFP4(src, plan); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
	}
	var mxBlock []int64
	naming, namingWhy := "", "SRC's MXFP4 description (compressed-tensors, DeepSeek-V4's expert_dtype fp4; absent: gpt-oss)"
	if mx {
		var why string
		if mxBlock, scaleDType, naming, why = srcMXFP4(src, plan); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
	}
	if mx8 {
		var why string
		if mxBlock, scaleDType, naming, why = srcMXFP8(src, plan); why != "" {
			return refuse(fk("weight_block_size"), fc.WeightBlockSize, why)
		}
		namingWhy = "SRC's MXFP8 description (quant_method mxfp8: minimax; ModelOpt's quant_algo MXFP8: absent)"
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
	case c.ZeroExperts != plan.ZeroExperts:
		// the router ranks them: a count off moves every id past the bank
		return bad("zero_experts", orAbsent(c.ZeroExperts), orAbsent(plan.ZeroExperts), "SRC's config (zero_expert_num)")
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
	case fp8 && !slices.Equal(fc.WeightBlockSize, block):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, block, "SRC's quantization_config")
	case int4 && !slices.Equal(fc.WeightBlockSize, int4Block):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, int4Block, "SRC's quantization_config (pack-quantized INT4: [1, group size], [1, 0] per channel)")
	case nv && !slices.Equal(fc.WeightBlockSize, nvBlock):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, nvBlock, "SRC's NVFP4 description (group_size 16: [1, 16])")
	case c.InputScales != (nvInput && c.Dequantized == nil):
		return bad("input_scales", c.InputScales, nvInput && c.Dequantized == nil, "SRC's NVFP4 expert tensors (input_scale), which a dequantised DST drops")
	case mx && !slices.Equal(fc.WeightBlockSize, mxBlock):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, mxBlock, "SRC's MXFP4 blocks and scales ([1, elements per E8M0 scale])")
	case mx8 && !slices.Equal(fc.WeightBlockSize, mxBlock):
		return bad(fk("weight_block_size"), fc.WeightBlockSize, mxBlock, "SRC's MXFP8 weights and scales ([1, elements per E8M0 scale])")
	case fc.Naming != naming:
		return bad(fk("naming"), orAbsent(fc.Naming), orAbsent(naming), namingWhy)
	case c.SharedQuantization != sharedQ:
		return bad("shared_quantization", orAbsent(c.SharedQuantization), orAbsent(sharedQ), "SRC's shared expert tensors")
	case c.SharedWeightDType != sharedDT:
		return bad("shared_weight_dtype", orAbsent(c.SharedWeightDType), orAbsent(sharedDT), "SRC's shared expert tensors")
	case c.SharedScaleDType != sharedSD:
		return bad("shared_scale_dtype", orAbsent(c.SharedScaleDType), orAbsent(sharedSD), "SRC's FP8 shared expert scales (DeepSeek's x.scale: its dtype; weight_scale_inv: absent)")
	case !slices.Equal(c.SharedWeightBlockSize, sharedBlock):
		return bad("shared_weight_block_size", blockOrAbsent(c.SharedWeightBlockSize), blockOrAbsent(sharedBlock), "SRC's quantization_config (an FP8 shared expert's weight_block_size where not 128x128)")
	case c.SharedNaming != sharedNaming:
		return bad("shared_naming", orAbsent(c.SharedNaming), orAbsent(sharedNaming), "SRC's FP8 shared expert scales (x.scale: deepseek; weight_scale_inv: absent)")
	case requant == nil && c.SharedRequantized != nil:
		return bad("shared_requantized", c.SharedRequantized, shown("absent"), "SRC's shared expert, stored like the routed experts or not fused,")
	case requant != nil && (c.SharedRequantized == nil || *c.SharedRequantized != *requant):
		return bad("shared_requantized", orAbsent(c.SharedRequantized), requant, "SRC's plain shared expert fused into "+quant+" slots")
	case !fp8 && !perRow && !int4 && !nv && !mx && !mx8 && len(fc.WeightBlockSize) != 0:
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
	return checkContractFusion(src, plan, c, block, bad, refuse)
}

// checkContractFusion compares with what SRC implies the contract's values
// of the shared expert's fusion (slices, replicas) and of the fold of rsf
// (the fold mode, whether it folded, the shared slots' weight); block is
// SRC's FP8 block size. bad and refuse are checkContract's.
func checkContractFusion(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, block []int64,
	bad func(key string, got, want any, why string) *ByteMismatch, refuse func(key string, got any, why string) *ByteMismatch) *ByteMismatch {
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
		got, want := c.Layers[i], layout.LayerInfo{Index: l.Key(), MTP: l.MTP, Prefix: l.Prefix, Bank: l.Bank.String()}
		if got.Index != want.Index || got.MTP != want.MTP || got.Prefix != want.Prefix || got.Bank != want.Bank {
			return bad(fmt.Sprintf("layers[%d]", i), got, want, "SRC's plan")
		}
		// Each layer's activations as the contract reads them, whichever
		// level (contract or layer) records them.
		if a, w := c.RoutedAct(got), plan.RoutedAct(l); a != w {
			return bad(fmt.Sprintf("layers[%d] activation", i), a, w, "SRC's family ("+plan.ModelType+")")
		}
		if l.Shared != nil && c.NumFusedSharedExperts == 0 {
			if a, w := c.SharedAct(got), plan.SharedActOf(l); a != w {
				return bad(fmt.Sprintf("layers[%d] shared_activation", i), a, w, "SRC's family ("+plan.ModelType+")")
			}
		}
	}
	return nil
}

// sameFloat is exact equality: the contract's numbers go through JSON,
// which gives back the very float64 convert wrote.
func sameFloat(a, b float64) bool { return a == b }

// orAbsent shows a contract value that JSON omits when zero.
// blockOrAbsent is a block size as the contract writes it, "absent" when
// it has none.
func blockOrAbsent(b []int64) any {
	if len(b) == 0 {
		return shown("absent")
	}
	return b
}

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
	if *out != nil && !slices.Equal(*out, b) {
		return false
	}
	*out = b
	return true
}

// srcQuantDesc is SRC's config.json quantisation description where
// convert reads it: quantization_config, else text_config's, else
// compression_config (whose quant_method defaults to compressed-tensors);
// nil when none. Its quant_method comes with it.
func srcQuantDesc(cfg map[string]any) (map[string]any, string) {
	tc, _ := cfg["text_config"].(map[string]any)
	for _, d := range []struct {
		in  map[string]any
		key string
	}{{cfg, "quantization_config"}, {tc, "quantization_config"}, {cfg, "compression_config"}} {
		desc, ok := d.in[d.key].(map[string]any)
		if !ok {
			continue
		}
		m, _ := desc["quant_method"].(string)
		if _, has := desc["quant_method"]; !has && d.key == "compression_config" {
			m = "compressed-tensors"
		}
		return desc, m
	}
	return nil, ""
}

// srcBlockSize is the FP8 block convert reads from SRC's
// quantization_config.weight_block_size, [128, 128] when absent; a
// non-empty problem says why convert would have refused it.
func srcBlockSize(cfg map[string]any) ([]int64, string) {
	qc, _ := srcQuantDesc(cfg)
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
			return fmt.Sprintf("SRC's layer %d gates its shared expert per token by %s, so fuse-shared refuses it", l.Key(), l.SharedGate)
		case l.Shared == nil:
			return fmt.Sprintf("SRC's layer %d has no shared expert to fuse", l.Key())
		case l.Shared.Get(layout.ProjGate, layout.RoleBias) != "":
			return fmt.Sprintf("SRC's layer %d has a shared expert with biases, so fuse-shared refuses it", l.Key())
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
		dt, why := srcScaleDType(src, plan, false)
		return why == "" && (dt == string(safetensors.F32) || mode == layout.FoldDown)
	}
	if plan.Quantization == family.QuantInt4Pack {
		// The same, into the routed experts' weight_scale.
		dt, why := srcScaleDType(src, plan, false)
		return why == "" && (dt == string(safetensors.F32) || mode == layout.FoldDown)
	}
	if plan.Quantization == family.QuantFP8Block {
		if plan.ScaleFmt == "ue8m0" {
			return false
		}
		for _, l := range plan.Layers {
			for _, e := range l.Experts {
				if t, ok := src.Tensor(e.Get(layout.ProjDown, layout.RoleScale)); ok && t.DType != safetensors.F32 {
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
	qc, method := srcQuantDesc(cfg)
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
// expert's, and the shared expert's where withShared: all one), as
// convert records it; a non-empty problem says why convert would have
// refused SRC.
func srcScaleDType(src *checkpoint.Checkpoint, plan *family.Plan, withShared bool) (string, string) {
	var dt safetensors.DType
	var from string
	check := func(m family.MLP) string {
		for _, p := range layout.MLPProjs {
			name := m.Get(p, layout.RoleScale)
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
		if l.Shared != nil && withShared {
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
	qc, m := srcQuantDesc(cfg)
	if m != "compressed-tensors" {
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

// srcSharedStorage reads, from SRC's tensors, how the shared expert is
// stored: "" "" like the routed experts (weights of their dtype), else
// "none" and the dtype of its plain weights, or fp8_block_128x128 and
// F8_E4M3 (beside DeepSeek-V4's FP4 experts), every projection and layer
// alike. A non-empty problem says why convert would have refused SRC.
func srcSharedStorage(src *checkpoint.Checkpoint, plan *family.Plan) (sharedQ, sharedDT, why string) {
	seen := false
	for _, l := range plan.Layers {
		if l.Shared == nil {
			continue
		}
		var q, dt string
		first := false
		for _, p := range layout.MLPProjs {
			name := l.Shared.Weight(p)
			if name == "" {
				continue // an ungated shared MLP's gate
			}
			t, ok := src.Tensor(name)
			if !ok {
				return "", "", fmt.Sprintf("SRC has no shared expert tensor %s", render(name))
			}
			tq, tdt := "", ""
			switch {
			case t.DType == plan.WeightDType:
			case t.DType == safetensors.F8E4M3:
				tq, tdt = string(family.QuantFP8Block), string(t.DType)
			case t.DType == safetensors.BF16 || t.DType == safetensors.F16 || t.DType == safetensors.F32:
				tq, tdt = string(family.QuantNone), string(t.DType)
			default:
				return "", "", fmt.Sprintf("SRC's shared expert tensor %s is %s, so moeprep cannot have converted it", name, t.DType)
			}
			if !first {
				q, dt, first = tq, tdt, true
			} else if tq != q || tdt != dt {
				return "", "", fmt.Sprintf("SRC's shared expert tensor %s is %s unlike its other projections", name, t.DType)
			}
		}
		if !seen {
			sharedQ, sharedDT, seen = q, dt, true
		} else if q != sharedQ || dt != sharedDT {
			return "", "", fmt.Sprintf("SRC's layer %d shared expert is stored unlike another layer's", l.Key())
		}
	}
	return sharedQ, sharedDT, ""
}

// srcSharedScaleNaming is how SRC names an FP8 128x128 shared expert's
// scales, read from its first shared gate projection: DeepSeek's own
// x.scale (its dtype, "deepseek"), or transformers' x.weight_scale_inv
// ("", "").
func srcSharedScaleNaming(src *checkpoint.Checkpoint, plan *family.Plan) (scaleDType, naming string) {
	for _, l := range plan.Layers {
		if l.Shared == nil {
			continue
		}
		base, ok := strings.CutSuffix(l.Shared.First(), ".weight")
		if !ok {
			return "", ""
		}
		if t, ok := src.Tensor(base + ".scale"); ok {
			return string(t.DType), weightfmt.NamingDeepSeek
		}
		return "", ""
	}
	return "", ""
}

// srcRequantization is the shared_requantized record of a plain shared
// expert of dtype dt quantised into quantization q, written out here from
// the producers' rules (compressed-tensors' symmetric scales: amax over
// half the code range, 15/2 for INT4 and 896/2 for E4M3, at least float32's
// epsilon; DeepSeek's FP8 blocks the same, powers of two rounded up for
// UE8M0), not from weightfmt's table; nil for a format with no rule.
func srcRequantization(q, dt string, ue8m0 bool) *layout.Requantization {
	r := &layout.Requantization{SourceDType: dt, Quantization: q, MinScale: 0x1p-23, Rounding: "nearest-even"}
	switch q {
	case string(family.QuantInt4Pack):
		r.Rule, r.ScaleDivisor, r.CodeRange = "absmax-int4", 7.5, [2]float64{-8, 7}
	case string(family.QuantFP8Block), string(family.QuantFP8Channel), string(family.QuantFP8Tensor):
		r.Rule, r.ScaleDivisor, r.CodeRange = "absmax-e4m3", 448, [2]float64{-448, 448}
		r.ScalePowerOfTwo = ue8m0 && q == string(family.QuantFP8Block)
	case string(family.QuantMXFP8):
		// ModelOpt's MXFP8QTensor: 2^ceil(log2(amax / 448)), the exponent
		// clamped at -127 (E8M0's byte 0), elements clamped to +-448.
		r.Rule, r.ScaleDivisor, r.CodeRange = "mxfp8-e8m0", 448, [2]float64{-448, 448}
		r.MinScale, r.ScalePowerOfTwo = 0x1p-127, true
	default:
		return nil
	}
	return r
}

// srcNVFP4 derives an NVFP4 contract's weight_block_size from SRC's own
// description and whether its experts carry a static activation scale
// (the first routed expert's gate projection, looked up by its hub name).
// ModelOpt: config.json's quantization_config, else hf_quant_config.json's
// quantization (quant_algo NVFP4, group_size 16), x.input_scale;
// compressed-tensors: config groups of nvfp4-pack-quantized weights in
// groups of 16, x.input_global_scale beside x.weight_packed.
func srcNVFP4(src *checkpoint.Checkpoint, plan *family.Plan) (block []int64, input bool, why string) {
	desc, method := srcQuantDesc(src.Config)
	ct := plan.Quantization == family.QuantNVFP4CT
	if desc == nil && !ct {
		if hf := src.HFQuantConfig(); hf != nil {
			desc, _ = hf["quantization"].(map[string]any)
		}
	}
	if desc == nil {
		return nil, false, "SRC has no NVFP4 description (quantization_config or hf_quant_config.json)"
	}
	g, leaf, weight := 16.0, ".input_scale", ".weight"
	if ct {
		if why := ctGroups(desc, method, "nvfp4-pack-quantized", func(w map[string]any) string {
			if v, _ := w["group_size"].(float64); v != 16 {
				return fmt.Sprintf("SRC's config group has group_size %s, not 16", render(w["group_size"]))
			}
			return ""
		}); why != "" {
			return nil, false, why
		}
		leaf, weight = ".input_global_scale", ".weight_packed"
	} else {
		if v, ok := desc["group_size"].(float64); ok {
			g = v
		}
		switch a, _ := desc["quant_algo"].(string); a {
		case "NVFP4", "W4A16_NVFP4":
		case "MIXED_PRECISION":
			if why := srcMixedNVFP4(desc, g); why != "" {
				return nil, false, why
			}
		default:
			return nil, false, fmt.Sprintf("SRC's quant_algo is %q, not NVFP4", a)
		}
	}
	if g != 16 {
		return nil, false, fmt.Sprintf("SRC's group_size is %v, not 16", g)
	}
	if len(plan.Layers) > 0 && len(plan.Layers[0].Experts) > 0 {
		w := plan.Layers[0].Experts[0].Weight(layout.ProjGate)
		_, input = src.Tensor(strings.TrimSuffix(w, weight) + leaf)
	}
	return []int64{1, 16}, input, ""
}

// srcMixedNVFP4 checks a ModelOpt MIXED_PRECISION description's
// quantized_layers as NVFP4 experts: every entry naming routed experts
// (an "experts" segment) NVFP4 or W4A16_NVFP4 in groups of 16 (the
// entry's group_size, else the description's g), at least one.
func srcMixedNVFP4(desc map[string]any, g float64) string {
	layers, _ := desc["quantized_layers"].(map[string]any)
	n := 0
	for name, v := range layers {
		if !strings.Contains(name+".", ".experts.") {
			continue
		}
		e, _ := v.(map[string]any)
		a, _ := e["quant_algo"].(string)
		gs := g
		if x, ok := e["group_size"].(float64); ok {
			gs = x
		}
		if a != "NVFP4" && a != "W4A16_NVFP4" || gs != 16 {
			return fmt.Sprintf("SRC's quantized_layers %s is %s in groups of %v, not NVFP4 in 16s", render(name), render(a), gs)
		}
		n++
	}
	if n == 0 {
		return "SRC's MIXED_PRECISION quantized_layers names no experts"
	}
	return ""
}

// ctGroups checks that a compressed-tensors description's config groups
// are all of compression format (the group's, else the description's) and
// that check("" when it passes) holds for each one's weights.
func ctGroups(desc map[string]any, method, format string, check func(weights map[string]any) string) string {
	if method != "compressed-tensors" {
		return fmt.Sprintf("SRC's quant_method %s is not compressed-tensors", render(method))
	}
	top, _ := desc["format"].(string)
	groups, _ := desc["config_groups"].(map[string]any)
	if len(groups) == 0 {
		return "SRC's compressed-tensors description has no config group"
	}
	for _, g := range groups {
		gm, _ := g.(map[string]any)
		f, ok := gm["format"].(string)
		if !ok {
			f = top
		}
		if f != format {
			return fmt.Sprintf("SRC's config group format %s is not %s", render(f), format)
		}
		w, _ := gm["weights"].(map[string]any)
		if why := check(w); why != "" {
			return why
		}
	}
	return ""
}

// srcMXFP4 derives an MXFP4 contract's weight_block_size, scale_dtype and
// naming from SRC itself: gpt-oss's stacked experts (quant_method mxfp4,
// srcMXFP4Block), or per-expert weights as compressed-tensors
// (mxfp4-pack-quantized config groups of 32) or DeepSeek-V4 (expert_dtype
// fp4) store them, each routed expert's [rows, n] packed weight and
// [rows, m] scale grid giving [1, 2n/m]; scale_dtype is the scales' dtype
// where it is not U8. A non-empty problem says why convert would have
// refused it.
func srcMXFP4(src *checkpoint.Checkpoint, plan *family.Plan) (block []int64, scaleDType, naming, why string) {
	desc, method := srcQuantDesc(src.Config)
	top, _ := src.Config["expert_dtype"].(string)
	inDesc, _ := desc["expert_dtype"].(string)
	switch {
	case method == "mxfp4":
		block, why = srcMXFP4Block(src, plan)
		return block, "", "", why
	case method == "compressed-tensors":
		naming = "compressed-tensors"
		why = ctGroups(desc, method, "mxfp4-pack-quantized", func(w map[string]any) string {
			if v, _ := w["group_size"].(float64); v != 32 {
				return fmt.Sprintf("SRC's config group has group_size %s, not 32", render(w["group_size"]))
			}
			return ""
		})
	case top == "fp4" || inDesc == "fp4":
		naming = "deepseek"
	default:
		why = "SRC describes no MXFP4 experts (quant_method mxfp4, compressed-tensors mxfp4-pack-quantized, expert_dtype fp4)"
	}
	if why != "" {
		return nil, "", "", why
	}
	for _, l := range plan.Layers {
		for _, e := range l.Experts {
			for _, q := range layout.MLPProjs {
				p := [2]string{e.Weight(q), e.Get(q, layout.RoleScale)}
				wt, ok1 := src.Tensor(p[0])
				st, ok2 := src.Tensor(p[1])
				switch {
				case !ok1 || !ok2:
					return nil, "", "", fmt.Sprintf("SRC has no %s and %s", render(p[0]), render(p[1]))
				case len(wt.Shape) != 2 || len(st.Shape) != 2 || wt.Shape[0] != st.Shape[0] || st.Shape[1] < 1 || (2*wt.Shape[1])%st.Shape[1] != 0:
					return nil, "", "", fmt.Sprintf("SRC's %s %v and %s %v are not [rows, n] and [rows, m] with m dividing 2n", p[0], wt.Shape, p[1], st.Shape)
				}
				if !agreeBlock(&block, []int64{1, 2 * wt.Shape[1] / st.Shape[1]}) {
					return nil, "", "", "SRC's MXFP4 tensors differ in the elements one scale covers"
				}
				sd := string(st.DType)
				if sd == "U8" {
					sd = ""
				}
				if scaleDType == "" {
					scaleDType = sd
				} else if sd != scaleDType {
					return nil, "", "", fmt.Sprintf("SRC's scale %s is %s unlike the others", p[1], st.DType)
				}
			}
		}
	}
	if block == nil {
		return nil, "", "", "SRC has no MoE layer"
	}
	return block, scaleDType, naming, ""
}

// srcMXFP8 derives an MXFP8 contract's weight_block_size, scale_dtype and
// naming from SRC itself: its description (quant_method mxfp8: MiniMax's
// names, "minimax"; ModelOpt's quant_algo MXFP8 in quantization_config or
// hf_quant_config.json: the format's own, absent), and per routed expert
// projection the F8_E4M3 weight [rows, n] beside its scale [rows, m]
// ("_scale_inv" or "_scale" after the weight's name, as the description
// says) with m dividing n: [1, n/m] (OCP MX: [1, 32]), one scale dtype
// (U8: absent).
func srcMXFP8(src *checkpoint.Checkpoint, plan *family.Plan) (block []int64, scaleDType, naming, why string) {
	desc, method := srcQuantDesc(src.Config)
	suffix, seen := "_scale", false
	switch algo := func(d map[string]any) string { a, _ := d["quant_algo"].(string); return strings.ToUpper(a) }; {
	case method == "mxfp8":
		naming, suffix = weightfmt.NamingMiniMax, "_scale_inv"
	case method == "modelopt" && algo(desc) == "MXFP8":
	case desc == nil && src.HFQuantConfig() != nil:
		hq, _ := src.HFQuantConfig()["quantization"].(map[string]any)
		if algo(hq) != "MXFP8" {
			return nil, "", "", "SRC's hf_quant_config.json does not say quant_algo MXFP8"
		}
	default:
		return nil, "", "", "SRC describes no MXFP8 weights (quant_method mxfp8, ModelOpt quant_algo MXFP8)"
	}
	for _, l := range plan.Layers {
		for _, e := range l.Experts {
			for _, w := range []string{e.Weight(layout.ProjGate), e.Weight(layout.ProjUp), e.Weight(layout.ProjDown)} {
				if w == "" {
					continue
				}
				wt, ok1 := src.Tensor(w)
				st, ok2 := src.Tensor(w + suffix)
				switch {
				case !ok1 || !ok2:
					return nil, "", "", fmt.Sprintf("SRC has no %s and %s", render(w), render(w+suffix))
				case wt.DType != safetensors.F8E4M3 || len(wt.Shape) != 2 || len(st.Shape) != 2 || wt.Shape[0] != st.Shape[0] || st.Shape[1] < 1 || wt.Shape[1]%st.Shape[1] != 0:
					return nil, "", "", fmt.Sprintf("SRC's %s %s %v and %s %v are not F8_E4M3 [rows, n] and [rows, m] with m dividing n", w, wt.DType, wt.Shape, w+suffix, st.Shape)
				}
				if !agreeBlock(&block, []int64{1, wt.Shape[1] / st.Shape[1]}) {
					return nil, "", "", "SRC's MXFP8 weights differ in the elements one scale covers"
				}
				sd := string(st.DType)
				if sd == "U8" {
					sd = ""
				}
				if !seen {
					scaleDType, seen = sd, true
				} else if sd != scaleDType {
					return nil, "", "", fmt.Sprintf("SRC's scale %s is %s unlike the others", w+suffix, st.DType)
				}
			}
		}
	}
	if block == nil {
		return nil, "", "", "SRC has no MoE layer"
	}
	return block, scaleDType, naming, ""
}

// srcMXFP4Block is weight_block_size as convert records it for SRC's
// gpt-oss MXFP4 experts, derived from SRC itself: quant_method mxfp4, and
// per MoE layer the stacked gate_up_proj_blocks U8 [E, rows, n, b] and
// gate_up_proj_scales U8 [E, rows, n] (and down's alike): one scale per b
// bytes of blocks, two E2M1 elements a byte, so [1, 2b] (OCP MX: [1, 32]).
// A non-empty problem says why convert would have refused it.
func srcMXFP4Block(src *checkpoint.Checkpoint, plan *family.Plan) ([]int64, string) {
	if _, m := srcQuantDesc(src.Config); m != "mxfp4" {
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
