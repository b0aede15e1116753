package family

import (
	"fmt"

	"github.com/moeprep/moeprep/quantdesc"
)

// This file plans NVFP4 experts by their descriptions (quantdesc):
// ModelOpt's (NVIDIA's DeepSeek-R1-FP4, DeepSeek-V3.2-NVFP4; config.json's
// quant_method modelopt and/or hf_quant_config.json) and
// compressed-tensors'. Every routed expert projection (and the shared
// expert's) is x.weight U8 [out, in/2], x.weight_scale F8_E4M3
// [out, in/16], x.weight_scale_2 F32 scalar (multiplies) and, in ModelOpt's
// W4A4 exports, x.input_scale F32 scalar: the static activation scale,
// carried byte-exact per expert; moeprep's validate does not simulate the
// FP4 activations (it dequantises the weights only). packed.go checks the
// tensors.

// checkMixedCovers refuses a ModelOpt MIXED_PRECISION plan whose
// quantized_layers leaves out some MoE layer's experts: by the description
// they are unquantised, by their tensors NVFP4, and an engine reading the
// description would load them wrongly.
func checkMixedCovers(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, p.textLayers(), func(d quantdesc.Desc) error {
		if !d.NVFP4Experts() {
			return nil
		}
		for _, l := range p.Layers {
			if e := l.Prefix + ".experts"; !d.CoversExperts(e) {
				return fmt.Errorf("%s: %s: quantized_layers names none of layer %d's experts (%s): by it they are unquantised, but their tensors are NVFP4", d.File, d.Key, l.Key(), e)
			}
		}
		return nil
	})
}

// checkNVFP4Groups resolves the exclude lists of an NVFP4 checkpoint: the
// routed experts, and the shared expert of a family that has one, must be
// NVFP4 (attention and dense MLPs are copied as they are).
func checkNVFP4Groups(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, p.textLayers(), func(d quantdesc.Desc) error {
		if d.Kind != quantdesc.KindNVFP4 && !d.NVFP4Experts() {
			return fmt.Errorf("%s: %s: %s: another format than the NVFP4 of the other description; moeprep carries one expert format per checkpoint", d.File, d.Key, d.Summary())
		}
		if err := routedUnquantised(d, "the exclude list", "one routed expert format"); err != nil {
			return err
		}
		if p.NumSharedExperts > 0 && d.Groups[quantdesc.GroupShared] == "" {
			return fmt.Errorf("%s: %s: %s: the shared expert is left unquantised while the routed experts are %s; moeprep carries NVFP4 shared experts only",
				d.File, d.Key, d.Summary(), d.Label)
		}
		return nil
	})
}
