package quantdesc

import (
	"maps"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/internal/jsoncfg"
	"github.com/moeprep/moeprep/weightfmt"
)

// This file reads in full the descriptions moeprep carries, into
// weightfmt's quantization names (weightfmt.QuantFP8Block, ...): how the
// expert weights are stored, and the settings each format checks.

// Read reads config.json's quantisation description, wherever it
// lives (Config: quantization_config, text_config's, or
// compression_config). Supported: DeepSeek-style FP8
// (quant_method fp8, e4m3, weight_block_size [128,128], dynamic
// activations); FP8 per tensor (quant_method fp8 without
// weight_block_size, dynamic activations); and compressed-tensors
// float-quantized FP8 per channel or per tensor (readCTFP8); MXFP8
// (quant_method mxfp8: readMXFP8; ModelOpt quant_algo MXFP8). Other methods
// pack weights differently (int4 groups, zero points, static activation
// scales) and would be copied or stacked wrongly; the planner has refused
// them (Desc.Supported) before this runs. scaleFmt is FP8 blocks'
// scale_fmt.
func Read(c jsoncfg.Object) (quant, scaleFmt string, err error) {
	q, method, ok, err := Config(c)
	if err != nil || !ok {
		return weightfmt.QuantNone, "", err
	}
	if method == "" {
		return "", "", q.Missing("quant_method")
	}
	if method == "mxfp4" {
		return weightfmt.QuantMXFP4, "", nil // the planner checks the rest against the family
	}
	if method == "compressed-tensors" && ctUses(q, "pack-quantized") {
		return weightfmt.QuantInt4Pack, "", nil // Int4Group reads the rest
	}
	if method == "compressed-tensors" && ctUses(q, "nvfp4-pack-quantized") {
		return weightfmt.QuantNVFP4CT, "", readCTFP4(q, ctNVFP4)
	}
	if method == "compressed-tensors" && ctUses(q, "mxfp4-pack-quantized") {
		return weightfmt.QuantMXFP4, "", readCTFP4(q, ctMXFP4) // the planner names its tensors as compressed-tensors does
	}
	if method == "modelopt" {
		return readModelOpt(q)
	}
	if method == "mxfp8" {
		return weightfmt.QuantMXFP8, "", readMXFP8(q)
	}
	if method == "compressed-tensors" {
		qu, err := readCTFP8(q)
		return qu, "", err
	}
	if method != "fp8" {
		return "", "", q.Errorf("quant_method", "%q is not supported (only fp8 and compressed-tensors float-quantized fp8)", method)
	}
	if f, err := q.Str("fmt", "e4m3"); err != nil {
		return "", "", err
	} else if f != "e4m3" {
		return "", "", q.Errorf("fmt", "%q is not supported (only e4m3)", f)
	}
	if a, err := q.Str("activation_scheme", "dynamic"); err != nil {
		return "", "", err
	} else if a != "dynamic" {
		return "", "", q.Errorf("activation_scheme", "%q is not supported (only dynamic: static activation scales, input_scale, are not carried)", a)
	}
	if !q.Has("weight_block_size") {
		// One weight_scale per weight, a scalar (vLLM's and transformers'
		// fp8 without blocks).
		return weightfmt.QuantFP8Tensor, "", nil
	}
	block, err := q.Ints("weight_block_size")
	if err != nil {
		return "", "", err
	}
	if len(block) != 2 || block[0] != block[1] || block[0] < 1 || block[0] > jsoncfg.MaxDim {
		return "", "", q.Errorf("weight_block_size", "%v is not supported (only square blocks [b, b]: DeepSeek's [128, 128], DeepSeek-V4.1's [32, 32])", block)
	}
	if scaleFmt, err = q.Str("scale_fmt", ""); err != nil {
		return "", "", err
	}
	return weightfmt.QuantFP8Block, scaleFmt, nil
}

// readCTFP8 reads a compressed-tensors quantization_config whose every
// config group is float-quantized FP8 (num_bits 8, type float, symmetric)
// per channel or per tensor, with dynamic activations or none, all of one
// strategy (compressed-tensors' forward.py: w = q * weight_scale). The
// ignore list was resolved by Detect.
func readCTFP8(q jsoncfg.Object) (string, error) {
	topFmt, err := q.Str("format", "")
	if err != nil {
		return "", err
	}
	groups, ok, err := q.Object("config_groups")
	if err != nil {
		return "", err
	}
	if !ok || len(groups.M) == 0 {
		return "", q.Missing("config_groups")
	}
	var out string
	for _, name := range slices.Sorted(maps.Keys(groups.M)) {
		g, _, err := groups.Object(name)
		if err != nil {
			return "", err
		}
		f, err := g.Str("format", topFmt)
		if err != nil {
			return "", err
		}
		if f != "float-quantized" {
			return "", g.Errorf("format", "%q is not supported (only float-quantized FP8 per channel or per tensor)", f)
		}
		w, ok, err := g.Object("weights")
		if err != nil {
			return "", err
		}
		if !ok {
			return "", g.Missing("weights")
		}
		if t, err := w.Str("type", "int"); err != nil {
			return "", err
		} else if t != "float" {
			return "", w.Errorf("type", "%q is not supported (only float)", t)
		}
		if b, err := w.IntIn("num_bits", 8, 1, 64); err != nil {
			return "", err
		} else if b != 8 {
			return "", w.Errorf("num_bits", "%d is not supported (only 8: FP8 E4M3)", b)
		}
		if sym, err := w.Bool("symmetric", true); err != nil {
			return "", err
		} else if !sym {
			return "", w.Errorf("symmetric", "false is not supported (a zero point, weight_zero_point, is not carried)")
		}
		if d, err := w.Bool("dynamic", false); err != nil {
			return "", err
		} else if d {
			return "", w.Errorf("dynamic", "true is not supported (weights quantised at run time have no stored scales)")
		}
		strategy, err := w.Str("strategy", "tensor")
		if err != nil {
			return "", err
		}
		var qu string
		switch strategy {
		case "channel":
			qu = weightfmt.QuantFP8Channel
		case "tensor":
			qu = weightfmt.QuantFP8Tensor
		default:
			return "", w.Errorf("strategy", "%q is not supported (only channel or tensor)", strategy)
		}
		if out != "" && qu != out {
			return "", groups.Errorf(name, "weights strategy %q differs from another config group's: one expert format per checkpoint", strategy)
		}
		out = qu
		if a, ok, err := g.Object("input_activations"); err != nil {
			return "", err
		} else if ok && len(a.M) > 0 {
			d, err := a.Bool("dynamic", false)
			if err != nil {
				return "", err
			}
			if !d {
				return "", a.Errorf("dynamic", "false is not supported: static activation scales (input_scale) are not carried (only dynamic activations or none)")
			}
		}
	}
	return out, nil
}

// ctUses reports whether a compressed-tensors quantization_config
// describes weights in compression format (its own format, or any config
// group's): "pack-quantized", "nvfp4-pack-quantized".
func ctUses(q jsoncfg.Object, format string) bool {
	if f, _ := q.Str("format", ""); f == format {
		return true
	}
	groups, ok, err := q.Object("config_groups")
	if err != nil || !ok {
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(groups.M)) {
		g, ok, err := groups.Object(name)
		if err != nil || !ok {
			continue
		}
		if f, _ := g.Str("format", ""); f == format {
			return true
		}
	}
	return false
}

// Int4Group reads config.json's pack-quantized INT4 description (Read
// said weightfmt.QuantInt4Pack) in full and returns its group size (0 for
// strategy channel).
func Int4Group(c jsoncfg.Object) (int64, error) {
	q, _, _, _ := Config(c) // Read read it
	return readCTInt4(q)
}

// readCTInt4 reads a compressed-tensors quantization_config whose every
// config group is pack-quantized INT4 (type int, num_bits 4, symmetric,
// static) of one strategy and group size, without activation quantisation
// (W4A16), and returns the group size (0 for strategy channel).
func readCTInt4(q jsoncfg.Object) (int64, error) {
	topFmt, err := q.Str("format", "")
	if err != nil {
		return 0, err
	}
	groups, ok, err := q.Object("config_groups")
	if err != nil {
		return 0, err
	}
	if !ok || len(groups.M) == 0 {
		return 0, q.Missing("config_groups")
	}
	group := int64(-1)
	for _, name := range slices.Sorted(maps.Keys(groups.M)) {
		g, _, err := groups.Object(name)
		if err != nil {
			return 0, err
		}
		f, err := g.Str("format", topFmt)
		if err != nil {
			return 0, err
		}
		if f != "pack-quantized" {
			return 0, g.Errorf("format", "%q is not supported with pack-quantized config groups (one expert format per checkpoint)", f)
		}
		w, ok, err := g.Object("weights")
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, g.Missing("weights")
		}
		if t, err := w.Str("type", "int"); err != nil {
			return 0, err
		} else if t != "int" {
			return 0, w.Errorf("type", "%q is not supported (only int)", t)
		}
		if b, err := w.IntIn("num_bits", 8, 1, 64); err != nil {
			return 0, err
		} else if b != 4 {
			return 0, w.Errorf("num_bits", "%d is not supported (only 4: INT4, eight to an int32)", b)
		}
		if sym, err := w.Bool("symmetric", true); err != nil {
			return 0, err
		} else if !sym {
			return 0, w.Errorf("symmetric", "false is not supported (asymmetric INT4 stores a zero point, weight_zero_point, which moeprep does not carry)")
		}
		if d, err := w.Bool("dynamic", false); err != nil {
			return 0, err
		} else if d {
			return 0, w.Errorf("dynamic", "true is not supported (weights quantised at run time have no stored scales)")
		}
		if w.Has("actorder") {
			if a, err := w.Str("actorder", ""); err != nil {
				// actorder may also be a boolean in older configs.
				if b, berr := w.Bool("actorder", false); berr != nil || b {
					return 0, w.Errorf("actorder", "is not supported (activation ordering stores weight_g_idx: columns not in scale-group order)")
				}
			} else if a == "group" || a == "dynamic" {
				return 0, w.Errorf("actorder", "%q is not supported (activation ordering stores weight_g_idx: columns not in scale-group order)", a)
			}
		}
		strategy, err := w.Str("strategy", "group")
		if err != nil {
			return 0, err
		}
		var gs int64
		switch strategy {
		case "group":
			n, err := w.IntIn("group_size", 0, 1, jsoncfg.MaxDim)
			if err != nil {
				return 0, err
			}
			if n == 0 {
				return 0, w.Missing("group_size")
			}
			gs = int64(n)
		case "channel":
		default:
			return 0, w.Errorf("strategy", "%q is not supported (only group or channel)", strategy)
		}
		if group >= 0 && gs != group {
			return 0, groups.Errorf(name, "weights strategy %s group size %d differs from another config group's %d: one expert format per checkpoint", strategy, gs, group)
		}
		group = gs
		if a, ok, err := g.Object("input_activations"); err != nil {
			return 0, err
		} else if ok && len(a.M) > 0 {
			return 0, a.Errorf("num_bits", "activation quantisation with pack-quantized INT4 weights is not supported (only W4A16: input_activations null)")
		}
	}
	return group, nil
}

// readModelOpt reads a quant_method modelopt quantization_config (or
// hf_quant_config.json's quantization): quant_algo NVFP4 with group_size
// 16, or MXFP8 with group_size 32 (Detect has refused the others).
func readModelOpt(q jsoncfg.Object) (string, string, error) {
	algo, err := q.Str("quant_algo", "")
	if err != nil {
		return "", "", err
	}
	switch strings.ToUpper(algo) {
	case "NVFP4", "W4A16_NVFP4":
	case "MIXED_PRECISION":
		// Detect has checked quantized_layers (NVFP4Experts).
		return weightfmt.QuantNVFP4ModelOpt, "", nil
	case "MXFP8":
		// ModelOpt's MXFP8QTensor: one E8M0 scale per 32 (BLOCK_SIZE);
		// its config writes group_size 32 where it writes one.
		if g, err := q.IntIn("group_size", weightfmt.MXFP8Group, 1, jsoncfg.MaxDim); err != nil {
			return "", "", err
		} else if g != weightfmt.MXFP8Group {
			return "", "", q.Errorf("group_size", "%d is not supported (MXFP8 scales groups of %d)", g, weightfmt.MXFP8Group)
		}
		return weightfmt.QuantMXFP8, "", nil
	default:
		return "", "", q.Errorf("quant_algo", "%q is not supported with quant_method modelopt (only NVFP4, W4A16_NVFP4, MXFP8, or MIXED_PRECISION with NVFP4 experts)", algo)
	}
	if g, err := q.IntIn("group_size", weightfmt.NVFP4Group, 1, jsoncfg.MaxDim); err != nil {
		return "", "", err
	} else if g != weightfmt.NVFP4Group {
		return "", "", q.Errorf("group_size", "%d is not supported (NVFP4 scales groups of %d)", g, weightfmt.NVFP4Group)
	}
	return weightfmt.QuantNVFP4ModelOpt, "", nil
}

// readMXFP8 checks a quant_method mxfp8 quantization_config as
// MiniMax-M3-MXFP8 writes it (and SGLang's and vLLM's Mxfp8Config read
// it): weight_block_size [1, 32] where given, dynamic activations (the
// only scheme those readers take: no input_scale is stored).
func readMXFP8(q jsoncfg.Object) error {
	if a, err := q.Str("activation_scheme", "dynamic"); err != nil {
		return err
	} else if a != "dynamic" {
		return q.Errorf("activation_scheme", "%q is not supported (only dynamic: static activation scales, input_scale, are not carried)", a)
	}
	if !q.Has("weight_block_size") {
		return nil
	}
	block, err := q.Ints("weight_block_size")
	if err != nil {
		return err
	}
	if !slices.Equal(block, []int{1, weightfmt.MXFP8Group}) {
		return q.Errorf("weight_block_size", "%v is not supported with quant_method mxfp8 (only [1, %d]: one E8M0 scale per %d elements of a row)", block, weightfmt.MXFP8Group, weightfmt.MXFP8Group)
	}
	return nil
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
func readCTFP4(q jsoncfg.Object, s ctFP4) error {
	topFmt, err := q.Str("format", "")
	if err != nil {
		return err
	}
	groups, ok, err := q.Object("config_groups")
	if err != nil {
		return err
	}
	if !ok || len(groups.M) == 0 {
		return q.Missing("config_groups")
	}
	for _, name := range slices.Sorted(maps.Keys(groups.M)) {
		g, _, err := groups.Object(name)
		if err != nil {
			return err
		}
		if f, err := g.Str("format", topFmt); err != nil {
			return err
		} else if f != s.format {
			return g.Errorf("format", "%q is not supported with %s config groups (one expert format per checkpoint)", f, s.format)
		}
		w, ok, err := g.Object("weights")
		if err != nil {
			return err
		}
		if !ok {
			return g.Missing("weights")
		}
		if err := s.args(w, "weights"); err != nil {
			return err
		}
		if d, err := w.Bool("dynamic", false); err != nil {
			return err
		} else if d {
			return w.Errorf("dynamic", "true is not supported (weights quantised at run time have no stored scales)")
		}
		a, ok, err := g.Object("input_activations")
		if err != nil || !ok || len(a.M) == 0 {
			return err // W4A16: no activation quantisation
		}
		if err := s.args(a, "input activations"); err != nil {
			return err
		}
		if d := a.M["dynamic"]; !slices.Contains(s.dynamic, d) {
			return a.Errorf("dynamic", "%s is not supported (static FP4 activation block scales are not carried; only %s)", jsoncfg.Describe(d), s.dynamicWords)
		}
	}
	return nil
}

// args checks the quantisation args of FP4 weights or activations in a
// compressed-tensors config group: type float, 4 bits, s's strategy and
// group size, symmetric.
func (s ctFP4) args(w jsoncfg.Object, what string) error {
	if t, err := w.Str("type", "int"); err != nil {
		return err
	} else if t != "float" {
		return w.Errorf("type", "%q is not supported for %s %s (only float: E2M1)", t, s.format, what)
	}
	if b, err := w.IntIn("num_bits", 8, 1, 64); err != nil {
		return err
	} else if b != 4 {
		return w.Errorf("num_bits", "%d is not supported for %s %s (only 4)", b, s.format, what)
	}
	if st, err := w.Str("strategy", "tensor"); err != nil {
		return err
	} else if st != s.strategy {
		return w.Errorf("strategy", "%q is not supported for %s %s (only %s)", st, s.format, what, s.strategy)
	}
	if g, err := w.IntIn("group_size", 0, 0, jsoncfg.MaxDim); err != nil {
		return err
	} else if g != s.group {
		return w.Errorf("group_size", "%d is not supported for %s %s (one scale per %d)", g, s.format, what, s.group)
	}
	if sym, err := w.Bool("symmetric", true); err != nil {
		return err
	} else if !sym {
		return w.Errorf("symmetric", "false is not supported (a zero point, weight_zero_point, is not carried)")
	}
	return nil
}

// ReadHF reads hf_quant_config.json (nil: none) where config.json has no
// quantization_config: weightfmt.QuantNVFP4ModelOpt for quant_algo NVFP4,
// weightfmt.QuantMXFP8 for MXFP8, weightfmt.QuantNone for none (the
// planner has refused the other algorithms: Desc.Supported).
func ReadHF(hf map[string]any) (string, error) {
	if hf == nil {
		return weightfmt.QuantNone, nil
	}
	q, ok, err := (jsoncfg.Object{M: hf}).Object("quantization")
	if err != nil {
		return "", hfErr(err)
	}
	if !ok {
		return weightfmt.QuantNone, nil
	}
	qu, _, err := readModelOpt(q)
	if err != nil {
		return "", hfErr(err)
	}
	return qu, nil
}
