package family

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/safetensors"
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

// nvfp4MLP checks one MLP of NVFP4 weights.
func (k *checker) nvfp4MLP(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	var m MLP
	names := [3]*string{&m.Gate, &m.Up, &m.Down}
	scales := [3]*string{&m.GateScale, &m.UpScale, &m.DownScale}
	globals := [3]*string{&m.GateGlobal, &m.UpGlobal, &m.DownGlobal}
	inputs := [3]*string{&m.GateInput, &m.UpInput, &m.DownInput}
	if err := k.eachProj(proj, inter, func(n int, pr string, rows, cols int64) error {
		w := prefix + "." + pr + ".weight"
		if err := k.nvfp4Weight(where, pr, w, rows, cols, hint); err != nil {
			return err
		}
		*names[n], *scales[n], *globals[n] = w, w+"_scale", w+"_scale_2"
		if k.p.NVFP4InputScale {
			*inputs[n] = prefix + "." + pr + ".input_scale"
		}
		return nil
	}); err != nil {
		return MLP{}, err
	}
	return m, nil
}

// scalarF32 checks a per-tensor F32 scale stored as [] or [1].
func (k *checker) scalarF32(where, name, what string) error {
	sm, ok := k.t.Lookup(name)
	if !ok {
		return fmt.Errorf("%s: missing tensor %s (%s)", where, name, what)
	}
	if sm.DType != safetensors.F32 || !(len(sm.Shape) == 0 || slices.Equal(sm.Shape, []int64{1})) {
		return fmt.Errorf("%s: %s is %s %s, expected F32 [] (%s)", where, name, sm.DType, shapeString(sm.Shape), what)
	}
	return nil
}

// nvfp4Weight checks one NVFP4 projection (weight [rows, cols]).
func (k *checker) nvfp4Weight(where, role, weight string, rows, cols int64, hint string) error {
	meta, ok := k.t.Lookup(weight)
	if !ok {
		return fmt.Errorf("%s: missing tensor %s", where, weight)
	}
	if meta.DType != safetensors.U8 {
		return fmt.Errorf("%s: %s is %s but the quantisation config says NVFP4 (U8, two E2M1 to a byte) for this module", where, weight, meta.DType)
	}
	if k.dtype == "" {
		k.dtype, k.dtypeFrom = meta.DType, weight
	}
	f, err := k.p.Format()
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if cols%weightfmt.NVFP4Group != 0 {
		return fmt.Errorf("%s: %s weight has %d input columns, not a whole number of %d-column NVFP4 scale groups", where, role, cols, weightfmt.NVFP4Group)
	}
	mx := weightfmt.Matrix{Format: f, Rows: rows, Cols: cols}
	if want := mx.Shape(); !slices.Equal(meta.Shape, want) {
		return fmt.Errorf("%s: %s %s shape %s, expected %s (%s weight [%d, %d], two E2M1 to a byte) %s",
			where, role, weight, shapeString(meta.Shape), shapeString(want), role, rows, cols, hint)
	}
	sn := weight + "_scale"
	sm, ok := k.t.Lookup(sn)
	if !ok {
		return fmt.Errorf("%s: missing tensor %s (NVFP4 weights need their block scales)", where, sn)
	}
	r, c := mx.ScaleShape()
	if sm.DType != safetensors.F8E4M3 || !slices.Equal(sm.Shape, []int64{r, c}) {
		return fmt.Errorf("%s: %s is %s %s, expected F8_E4M3 [%d, %d] (one per %d input columns of %s weight [%d, %d])",
			where, sn, sm.DType, shapeString(sm.Shape), r, c, weightfmt.NVFP4Group, role, rows, cols)
	}
	if err := k.scalarF32(where, weight+"_scale_2", "NVFP4's per-tensor second scale"); err != nil {
		return err
	}
	in := strings.TrimSuffix(weight, ".weight") + ".input_scale"
	_, hasIn := k.t.Lookup(in)
	if !k.nvInputSeen {
		k.nvInputSeen, k.p.NVFP4InputScale, k.nvInputFrom = true, hasIn, weight
	}
	switch {
	case hasIn && !k.p.NVFP4InputScale:
		return fmt.Errorf("%s: %s present but %s has no input_scale: every NVFP4 expert weight has one or none", where, in, k.nvInputFrom)
	case !hasIn && k.p.NVFP4InputScale:
		return fmt.Errorf("%s: missing tensor %s (%s has one: every NVFP4 expert weight has one or none)", where, in, k.nvInputFrom)
	case hasIn:
		return k.scalarF32(where, in, "NVFP4's static activation scale")
	}
	return nil
}
