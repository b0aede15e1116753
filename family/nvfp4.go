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
	switch strings.ToUpper(algo) {
	case "NVFP4", "W4A16_NVFP4":
	case "MIXED_PRECISION":
		// DetectQuant has checked quantized_layers (nvfp4Experts).
		return QuantNVFP4, "", nil
	default:
		return "", "", q.errorf("quant_algo", "%q is not supported with quant_method modelopt (only NVFP4, W4A16_NVFP4, or MIXED_PRECISION with NVFP4 experts)", algo)
	}
	if g, err := q.intIn("group_size", weightfmt.NVFP4Group, 1, maxDim); err != nil {
		return "", "", err
	} else if g != weightfmt.NVFP4Group {
		return "", "", q.errorf("group_size", "%d is not supported (NVFP4 scales groups of %d)", g, weightfmt.NVFP4Group)
	}
	return QuantNVFP4, "", nil
}

// ctFP4 is what compressed-tensors writes for one FP4 scheme: the
// config groups' format, the quantisation args' strategy and group size,
// and the activation settings whose scales need not be carried (dynamic:
// true stores nothing; NVFP4's "local" stores input_global_scale, carried,
// not simulated).
type ctFP4 struct {
	format, strategy string
	group            int
	dynamic          []any
	dynamicWords     string // dynamic, for messages
}

var (
	// llm-compressor's NVFP4 and NVFP4A16 schemes.
	ctNVFP4 = ctFP4{"nvfp4-pack-quantized", "tensor_group", weightfmt.NVFP4Group, []any{true, "local"}, `"local" or true`}
	// llm-compressor's MXFP4 and MXFP4A16 schemes.
	ctMXFP4 = ctFP4{"mxfp4-pack-quantized", "group", weightfmt.MXFP4Group, []any{true}, "true"}
)

// readCTFP4 checks a compressed-tensors quantization_config whose config
// groups are of scheme s: weights type float, 4 bits, s's strategy and
// group size, symmetric, static; activations none (W4A16) or FP4 of the
// same grouping with s's dynamic settings.
func readCTFP4(q config, s ctFP4) error {
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
		} else if f != s.format {
			return g.errorf("format", "%q is not supported with %s config groups (one expert format per checkpoint)", f, s.format)
		}
		w, ok, err := g.object("weights")
		if err != nil {
			return err
		}
		if !ok {
			return g.missing("weights")
		}
		if err := s.args(w, "weights"); err != nil {
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
		if err := s.args(a, "input activations"); err != nil {
			return err
		}
		if d := a.m["dynamic"]; !slices.Contains(s.dynamic, d) {
			return a.errorf("dynamic", "%s is not supported (static FP4 activation block scales are not carried; only %s)", describe(d), s.dynamicWords)
		}
	}
	return nil
}

// args checks the quantisation args of FP4 weights or activations in a
// compressed-tensors config group: type float, 4 bits, s's strategy and
// group size, symmetric.
func (s ctFP4) args(w config, what string) error {
	if t, err := w.str("type", "int"); err != nil {
		return err
	} else if t != "float" {
		return w.errorf("type", "%q is not supported for %s %s (only float: E2M1)", t, s.format, what)
	}
	if b, err := w.intIn("num_bits", 8, 1, 64); err != nil {
		return err
	} else if b != 4 {
		return w.errorf("num_bits", "%d is not supported for %s %s (only 4)", b, s.format, what)
	}
	if st, err := w.str("strategy", "tensor"); err != nil {
		return err
	} else if st != s.strategy {
		return w.errorf("strategy", "%q is not supported for %s %s (only %s)", st, s.format, what, s.strategy)
	}
	if g, err := w.intIn("group_size", 0, 0, maxDim); err != nil {
		return err
	} else if g != s.group {
		return w.errorf("group_size", "%d is not supported for %s %s (one scale per %d)", g, s.format, what, s.group)
	}
	if sym, err := w.boolean("symmetric", true); err != nil {
		return err
	} else if !sym {
		return w.errorf("symmetric", "false is not supported (a zero point, weight_zero_point, is not carried)")
	}
	return nil
}

// checkMixedCovers refuses a ModelOpt MIXED_PRECISION plan whose
// quantized_layers leaves out some MoE layer's experts: by the description
// they are unquantised, by their tensors NVFP4, and an engine reading the
// description would load them wrongly.
func checkMixedCovers(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, p.textLayers(), func(d QuantDesc) error {
		if !d.nvfp4Experts() {
			return nil
		}
		for _, l := range p.Layers {
			e := l.Prefix + ".experts"
			i, found := slices.BinarySearch(d.experts, e)
			if !found && (i == len(d.experts) || !strings.HasPrefix(d.experts[i], e+".")) {
				return fmt.Errorf("%s: %s: quantized_layers names none of layer %d's experts (%s): by it they are unquantised, but their tensors are NVFP4", d.File, d.Key, l.Index, e)
			}
		}
		return nil
	})
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
	return eachQuantDesc(raw, t, p.textLayers(), func(d QuantDesc) error {
		if d.Kind != QuantKindNVFP4 && !d.nvfp4Experts() {
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
