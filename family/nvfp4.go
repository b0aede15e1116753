package family

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/weightfmt"
)

// This file reads ModelOpt NVFP4 (NVIDIA's DeepSeek-R1-FP4,
// DeepSeek-V3.2-NVFP4) into a Plan: config.json's quantization_config
// {quant_method modelopt, quant_algo NVFP4, group_size 16} and/or
// hf_quant_config.json's {quantization: {quant_algo NVFP4, group_size 16,
// exclude_modules}}. Every routed expert projection (and the shared
// expert's) is x.weight U8 [out, in/2], x.weight_scale F8_E4M3
// [out, in/16], x.weight_scale_2 F32 scalar (multiplies) and, in ModelOpt's
// W4A4 exports, x.input_scale F32 scalar: the static activation scale,
// carried byte-exact per expert; moeprep's validate does not simulate the
// FP4 activations (it dequantises the weights only).

// readModelOptNVFP4 reads a quant_method modelopt quantization_config:
// quant_algo NVFP4 with group_size 16 (DetectQuant has refused the others).
func readModelOptNVFP4(q config) (Quantization, string, error) {
	algo, err := q.str("quant_algo", "")
	if err != nil {
		return "", "", err
	}
	if strings.ToUpper(algo) != "NVFP4" {
		return "", "", q.errorf("quant_algo", "%q is not supported with quant_method modelopt (only NVFP4)", algo)
	}
	if g, err := q.intIn("group_size", weightfmt.NVFP4Group, 1, maxDim); err != nil {
		return "", "", err
	} else if g != weightfmt.NVFP4Group {
		return "", "", q.errorf("group_size", "%d is not supported (NVFP4 scales groups of %d)", g, weightfmt.NVFP4Group)
	}
	return QuantNVFP4, "", nil
}

// readCTNVFP4 checks a compressed-tensors quantization_config whose config
// groups are nvfp4-pack-quantized (llm-compressor's NVFP4 and NVFP4A16
// schemes): weights type float, 4 bits, strategy tensor_group, group_size
// 16, symmetric, static; activations none (W4A16) or NVFP4 with the
// per-tensor global scale stored (dynamic "local": input_global_scale,
// carried, not simulated) or nothing stored (dynamic true).
func readCTNVFP4(q config) error {
	topFmt, err := q.str("format", "")
	if err != nil {
		return err
	}
	groups, ok, err := q.object("config_groups")
	if err != nil {
		return err
	}
	if !ok || len(groups.m) == 0 {
		return q.missing("config_groups")
	}
	for _, name := range slices.Sorted(maps.Keys(groups.m)) {
		g, _, err := groups.object(name)
		if err != nil {
			return err
		}
		if f, err := g.str("format", topFmt); err != nil {
			return err
		} else if f != "nvfp4-pack-quantized" {
			return g.errorf("format", "%q is not supported with nvfp4-pack-quantized config groups (one expert format per checkpoint)", f)
		}
		w, ok, err := g.object("weights")
		if err != nil {
			return err
		}
		if !ok {
			return g.missing("weights")
		}
		if err := nvfp4Args(w, "weights"); err != nil {
			return err
		}
		if d, err := w.boolean("dynamic", false); err != nil {
			return err
		} else if d {
			return w.errorf("dynamic", "true is not supported (weights quantised at run time have no stored scales)")
		}
		a, ok, err := g.object("input_activations")
		if err != nil || !ok || len(a.m) == 0 {
			return err // W4A16: no activation quantisation
		}
		if err := nvfp4Args(a, "input activations"); err != nil {
			return err
		}
		// dynamic "local": the per-tensor global scale is stored
		// (input_global_scale), the block scales computed at run time;
		// true: nothing is stored; false would store static block scales.
		if d := a.m["dynamic"]; d != true && d != "local" {
			return a.errorf("dynamic", "%s is not supported (static NVFP4 activation block scales are not carried; only \"local\" or true)", describe(d))
		}
	}
	return nil
}

// nvfp4Args checks the quantisation args of NVFP4 weights or activations
// in a compressed-tensors config group: type float, 4 bits, strategy
// tensor_group, group_size 16, symmetric.
func nvfp4Args(w config, what string) error {
	if t, err := w.str("type", "int"); err != nil {
		return err
	} else if t != "float" {
		return w.errorf("type", "%q is not supported for NVFP4 %s (only float: E2M1)", t, what)
	}
	if b, err := w.intIn("num_bits", 8, 1, 64); err != nil {
		return err
	} else if b != 4 {
		return w.errorf("num_bits", "%d is not supported for NVFP4 %s (only 4)", b, what)
	}
	if st, err := w.str("strategy", "tensor"); err != nil {
		return err
	} else if st != "tensor_group" {
		return w.errorf("strategy", "%q is not supported for NVFP4 %s (only tensor_group: a scale per 16 and one per tensor)", st, what)
	}
	if g, err := w.intIn("group_size", 0, 0, maxDim); err != nil {
		return err
	} else if g != weightfmt.NVFP4Group {
		return w.errorf("group_size", "%d is not supported for NVFP4 %s (NVFP4 scales groups of %d)", g, what, weightfmt.NVFP4Group)
	}
	if sym, err := w.boolean("symmetric", true); err != nil {
		return err
	} else if !sym {
		return w.errorf("symmetric", "false is not supported (a zero point, weight_zero_point, is not carried)")
	}
	return nil
}

// readHFNVFP4 reads hf_quant_config.json (nil: none) where config.json
// has no quantization_config: QuantNVFP4 for quant_algo NVFP4, QuantNone
// for none (refuseQuant has refused the other algorithms).
func readHFNVFP4(hf map[string]any) (Quantization, error) {
	if hf == nil {
		return QuantNone, nil
	}
	q, ok, err := (config{m: hf}).object("quantization")
	if err != nil {
		return "", hfErr(err)
	}
	if !ok {
		return QuantNone, nil
	}
	qu, _, err := readModelOptNVFP4(q)
	if err != nil {
		return "", hfErr(err)
	}
	return qu, nil
}

// checkNVFP4Groups resolves the exclude lists of an NVFP4 checkpoint: the
// routed experts, and the shared expert of a family that has one, must be
// NVFP4 (attention and dense MLPs are copied as they are).
func checkNVFP4Groups(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, func(d QuantDesc) error {
		if d.Kind != QuantKindNVFP4 {
			return fmt.Errorf("%s: %s: %s: another format than the NVFP4 of the other description; moeprep carries one expert format per checkpoint", d.File, d.Key, d.Summary())
		}
		if err := routedUnquantised(d, "the exclude list", "one routed expert format"); err != nil {
			return err
		}
		if p.NumSharedExperts > 0 && d.Groups[GroupShared] == "" {
			return fmt.Errorf("%s: %s: %s: the shared expert is left unquantised while the routed experts are %s; moeprep carries NVFP4 shared experts only",
				d.File, d.Key, d.Summary(), d.Label)
		}
		return nil
	})
}
