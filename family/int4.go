package family

import (
	"encoding/binary"
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"slices"

	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// This file reads compressed-tensors pack-quantized INT4 (W4A16,
// symmetric, strategy group or channel) into a Plan: Kimi-K2-Thinking's
// and Kimi-K2.5's routed experts, llm-compressor's W4A16 releases. Its
// ignore list may leave the shared expert BF16 (Kimi: re:.*shared_experts.*),
// which the plan then states apart (SharedQuantization).

// TensorBytes is what a Tensors may also implement to hand family the bytes
// of a small tensor (compressed-tensors' weight_shape, two int64s), at most
// max bytes of it; checkpoint.Checkpoint does. Without it the values of
// weight_shape go unchecked here (their dtype and shape still are).
type TensorBytes interface {
	SmallTensorBytes(name string, max int64) ([]byte, error)
}

// checkInt4Groups resolves an int4_pack checkpoint's ignore list: the
// routed experts must be INT4; the shared expert of a family that has one
// is INT4 too, or left unquantised (Kimi: its re:.*shared_experts.*), which
// the plan records as SharedQuantization none.
func checkInt4Groups(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, p.textLayers(), func(d quantdesc.Desc) error {
		if err := routedUnquantised(d, "the ignore list", "one routed expert format"); err != nil {
			return err
		}
		sharedLeftPlain(d, p)
		return nil
	})
}

// sharedLeftPlain records, for a family with a shared expert, that the
// description leaves it unquantised (SharedQuantization none: Kimi's
// re:.*shared_experts.*).
func sharedLeftPlain(d quantdesc.Desc, p *Plan) {
	if p.NumSharedExperts > 0 && d.Groups[quantdesc.GroupShared] == "" {
		p.SharedQuantization = QuantNone
	}
}

// SharedFormat is how the plan's shared expert is stored: Format, unless
// SharedQuantization says otherwise (plain weights, or FP8 blocks, of
// SharedWeightDType).
func (p *Plan) SharedFormat() (weightfmt.Format, error) {
	if p.SharedQuantization == "" {
		return p.Format()
	}
	return weightfmt.New(weightfmt.Spec{Quantization: string(p.SharedQuantization), DType: p.SharedWeightDType,
		ScaleDType: p.SharedScaleDType, Naming: p.SharedNaming, Block: p.sharedBlock()})
}

// sharedBlock is an FP8 shared expert's block where the plan's FP8 blocks
// are not DeepSeek's 128 (DeepSeek-V4.1's 32 beside FP4 routed experts);
// nil otherwise (the format's default).
func (p *Plan) sharedBlock() []int64 {
	if p.SharedQuantization == QuantFP8Block && p.FP8Block > 0 {
		return []int64{p.FP8Block, p.FP8Block}
	}
	return nil
}

// SharedBlock is sharedBlock for the contract (shared_weight_block_size).
func (p *Plan) SharedBlock() []int64 { return p.sharedBlock() }

// plainShared reports whether the MLP being checked is a shared expert left
// unquantised next to quantised routed experts.
func (k *checker) plainShared() bool {
	return k.inShared && k.p.SharedQuantization == QuantNone
}

// int4MLP checks one MLP of INT4 weights: each projection's weight_packed,
// weight_scale and weight_shape.
func (k *checker) int4MLP(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	return k.quantMLP(where, prefix, proj, inter, hint, k.int4Weight, layout.RoleWeight, layout.RoleScale, layout.RoleShape)
}

// maxShapeBytes bounds what int4Weight reads of a weight_shape tensor.
const maxShapeBytes = 64

// int4Weight checks one INT4 projection (plain name weight, [rows, cols]):
// weight_packed I32 [rows, ceil(cols/8)], weight_scale [rows, cols/group]
// (or [rows, 1]) of the plan's scale dtype, weight_shape I64 [2] holding
// [rows, cols]; no weight_zero_point or weight_g_idx.
func (k *checker) int4Weight(where, role, weight string, rows, cols int64, hint string) (weightfmt.Tensors, error) {
	tn := weightfmt.Tensors{Weight: weight + "_packed", Scale: weight + "_scale", Shape: weight + "_shape"}
	for _, extra := range []struct{ suffix, why string }{
		{"_zero_point", "asymmetric INT4 (a zero point) is not supported: moeprep reads symmetric weights only"},
		{"_g_idx", "activation-ordered INT4 (weight_g_idx) is not supported: its columns are not in scale-group order"},
	} {
		if _, ok := k.t.Lookup(weight + extra.suffix); ok {
			return tn, fmt.Errorf("%s: %s present: %s", where, weight+extra.suffix, extra.why)
		}
	}
	meta, ok := k.t.Lookup(tn.Weight)
	if !ok {
		if _, plain := k.t.Lookup(weight); plain {
			return tn, fmt.Errorf("%s: %s is stored unpacked (%s) but config.json's quantization_config says pack-quantized INT4 for the routed experts", where, tn.Weight, weight)
		}
		return tn, fmt.Errorf("%s: missing tensor %s", where, tn.Weight)
	}
	if meta.DType != safetensors.I32 {
		return tn, fmt.Errorf("%s: %s dtype %s, expected I32 (eight INT4 values to a word)", where, tn.Weight, meta.DType)
	}
	if k.dtype == "" {
		k.dtype, k.dtypeFrom = meta.DType, tn.Weight
	} else if k.dtype != meta.DType {
		return tn, fmt.Errorf("%s: %s dtype %s, expected %s like %s", where, role, meta.DType, k.dtype, k.dtypeFrom)
	}
	if k.p.ScaleDType == "" {
		if sm, ok := k.t.Lookup(tn.Scale); ok && isFloat(sm.DType) {
			k.p.ScaleDType, k.scaleFrom = sm.DType, tn.Scale
		}
	}
	f, err := k.p.Format()
	if err != nil {
		return tn, fmt.Errorf("%s: %w", where, err)
	}
	mx := weightfmt.Matrix{Format: f, Rows: rows, Cols: cols}
	if want := mx.Shape(); !slices.Equal(meta.Shape, want) {
		return tn, fmt.Errorf("%s: %s %s shape %s, expected %s (%s weight [%d, %d], eight INT4 to an int32) %s",
			where, role, tn.Weight, shapeString(meta.Shape), shapeString(want), role, rows, cols, hint)
	}
	if k.p.GroupSize > 0 && cols%k.p.GroupSize != 0 {
		return tn, fmt.Errorf("%s: %s weight has %d input columns, not a whole number of %d-column scale groups (config.json group_size)", where, role, cols, k.p.GroupSize)
	}
	sm, ok := k.t.Lookup(tn.Scale)
	if !ok {
		return tn, fmt.Errorf("%s: missing tensor %s (INT4 weights need their scales)", where, tn.Scale)
	}
	if sm.DType != k.p.ScaleDType {
		return tn, fmt.Errorf("%s: %s dtype %s, expected %s like %s", where, tn.Scale, sm.DType, k.p.ScaleDType, k.scaleFrom)
	}
	r, c := mx.ScaleShape()
	if want := []int64{r, c}; !slices.Equal(sm.Shape, want) {
		g := "one scale per output row"
		if k.p.GroupSize > 0 {
			g = fmt.Sprintf("one per %d input columns of each row", k.p.GroupSize)
		}
		return tn, fmt.Errorf("%s: %s shape %s, expected %s (%s of %s weight [%d, %d])", where, tn.Scale, shapeString(sm.Shape), shapeString(want), g, role, rows, cols)
	}
	shm, ok := k.t.Lookup(tn.Shape)
	if !ok {
		return tn, fmt.Errorf("%s: missing tensor %s (compressed-tensors' unpacked [out, in] of %s)", where, tn.Shape, tn.Weight)
	}
	if shm.DType != safetensors.I64 || !slices.Equal(shm.Shape, []int64{2}) {
		return tn, fmt.Errorf("%s: %s is %s %s, expected I64 [2]", where, tn.Shape, shm.DType, shapeString(shm.Shape))
	}
	if tb, ok := k.t.(TensorBytes); ok {
		b, err := tb.SmallTensorBytes(tn.Shape, maxShapeBytes)
		if err != nil {
			return tn, fmt.Errorf("%s: %w", where, err)
		}
		if len(b) != 16 {
			return tn, fmt.Errorf("%s: %s holds %d bytes, expected 16", where, tn.Shape, len(b))
		}
		got := []int64{int64(binary.LittleEndian.Uint64(b)), int64(binary.LittleEndian.Uint64(b[8:]))}
		if !slices.Equal(got, []int64{rows, cols}) {
			return tn, fmt.Errorf("%s: %s says %s, expected [%d, %d] (the %s weight's [out, in] %s)", where, tn.Shape, shapeString(got), rows, cols, role, hint)
		}
	}
	tn.Weight, tn.Scale, tn.Shape = own(tn.Weight, meta), own(tn.Scale, sm), own(tn.Shape, shm)
	return tn, nil
}

// plainSharedMLP checks a shared expert left unquantised next to quantised
// routed experts: float weights, all of one dtype (SharedWeightDType), no
// scales.
func (k *checker) plainSharedMLP(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	var m MLP
	if err := k.eachProj(proj, inter, func(n int, pr string, rows, cols int64) error {
		name := prefix + "." + pr + ".weight"
		meta, ok := k.t.Lookup(name)
		if !ok {
			if _, packed := k.t.Lookup(name + "_packed"); packed {
				return fmt.Errorf("%s: %s is packed but config.json's ignore list leaves the shared expert unquantised", where, name+"_packed")
			}
			return fmt.Errorf("%s: missing tensor %s", where, name)
		}
		if want := []int64{rows, cols}; !slices.Equal(meta.Shape, want) {
			return fmt.Errorf("%s: %s shape %s, expected %s %s", where, pr, shapeString(meta.Shape), shapeString(want), hint)
		}
		if !isFloat(meta.DType) {
			return fmt.Errorf("%s: %s dtype %s, expected BF16, F16 or F32 (the ignore list leaves the shared expert unquantised)", where, name, meta.DType)
		}
		if k.p.SharedWeightDType == "" {
			k.p.SharedWeightDType, k.sharedFrom = meta.DType, name
		} else if meta.DType != k.p.SharedWeightDType {
			return fmt.Errorf("%s: %s dtype %s, expected %s like %s", where, pr, meta.DType, k.p.SharedWeightDType, k.sharedFrom)
		}
		for _, sfx := range []string{"_scale", "_scale_inv"} {
			if _, has := k.t.Lookup(name + sfx); has {
				return fmt.Errorf("%s: %s present but the ignore list leaves the shared expert unquantised", where, name+sfx)
			}
		}
		m.Set(layout.MLPProjs[n], layout.RoleWeight, name)
		return nil
	}); err != nil {
		return MLP{}, err
	}
	return m, nil
}
