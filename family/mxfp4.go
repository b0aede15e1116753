package family

import (
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"slices"

	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// gpt-oss's MXFP4 checkpoints (openai/gpt-oss-20b, -120b; transformers
// integrations/mxfp4.py): quantization_config {"quant_method": "mxfp4",
// "modules_to_not_convert": [router, attention, embeddings, lm_head]}, and
// per MoE layer the experts stacked on disk, not transposed:
//
//	experts.gate_up_proj_blocks U8 [E, 2I, H/32, 16], _scales U8 [E, 2I, H/32]
//	experts.down_proj_blocks    U8 [E, H, I/32, 16],  _scales U8 [E, H, I/32]
//	experts.gate_up_proj_bias BF16 [E, 2I], experts.down_proj_bias [E, H]
//
// Rows are output features (convert_moe_packed_tensors dequantises
// [E, rows, cols] and transposes only afterwards), gate and up rows
// alternate (even rows gate, odd rows up, as the bf16 save's columns), and
// every row carries its own E8M0 scales along its columns: selecting rows
// (an expert, the gate or up half) is exact, bytes and scales alike. An
// expert's projection is read through views (checkpoint/view.go): slice e
// of the 4-D blocks is the [rows, cols/2] byte matrix of weightfmt's MXFP4,
// its gate the even rows ("[e][R:0:I:2]"), its scales the same rows of the
// [rows, cols/32] grid.

// DeepSeek-V4's official checkpoints say "expert_dtype": "fp4" (top
// level; some copies put it in quantization_config) beside an FP8
// 128x128 quantization_config with scale_fmt ue8m0: the routed experts are
// MXFP4 in DeepSeek's names (inference/model.py: x.weight
// float4_e2m1fn_x2, stored I8 or U8 [out, in/2]; x.scale F8_E8M0
// [out, in/32]); the shared expert and every other projection stay FP8.

// readExpertFP4 reads expert_dtype into p: "fp4" makes the routed experts
// MXFP4 in DeepSeek's names (DeepSeek-V4 beside FP8 128x128 blocks,
// DeepSeek-V4.1 beside FP8 32x32 blocks); "fp8" or none leaves p.
func readExpertFP4(c config, p *Plan) error {
	at := c
	dt, err := c.str("expert_dtype", "")
	if err != nil {
		return err
	}
	if q, _, ok, _ := quantdesc.Config(c.j()); dt == "" && ok {
		at = configOf(q)
		if dt, err = at.str("expert_dtype", ""); err != nil {
			return err
		}
	}
	switch {
	case dt == "" || dt == "fp8":
		return nil
	case dt != "fp4":
		return at.errorf("expert_dtype", "%q is not supported (fp4: DeepSeek-V4's FP4 experts, or fp8)", dt)
	case p.Family != "deepseek_v4" && p.Family != deepseekV41Text.name:
		return at.errorf("expert_dtype", "fp4 is DeepSeek-V4's and V4.1's (MXFP4 experts named x.weight and x.scale); not planned for model_type %s", p.ModelType)
	case p.Quantization != QuantFP8Block && p.Quantization != QuantNone:
		return at.errorf("expert_dtype", "fp4 beside a %s quantisation description; DeepSeek-V4 describes FP8 128x128 blocks", p.Quantization)
	case p.Family == deepseekV41Text.name && p.FP8Block == 0:
		// The release's dense weights are FP8 in 32x32 blocks (both sources);
		// 128x128 beside V4.1's names is no checkpoint anyone ships.
		return at.errorf("expert_dtype", "fp4 beside FP8 128x128 blocks under model_type deepseek_v41: DeepSeek-V4.1 ships its FP8 weights in [32, 32] blocks (weight_block_size)")
	case p.FP8Block != 0 && p.Family == "deepseek_v4":
		// DeepSeek-V4 ships FP8 128x128 beside its FP4 experts; other blocks
		// are V4.1's, whose release names its own model type.
		return at.errorf("expert_dtype", "fp4 beside FP8 in %dx%d blocks under model_type deepseek_v4: DeepSeek-V4 ships 128x128 blocks, and DeepSeek-V4.1's FP4 experts beside FP8 32x32 blocks are read under its own config (model_type deepseek_v41)", p.FP8Block, p.FP8Block)
	}
	p.Quantization, p.Naming, p.ScaleFmt = QuantMXFP4, weightfmt.NamingDeepSeek, ""
	return nil
}

// sharedApart decides, at the first shared expert of a plan whose routed
// experts are DeepSeek-V4's FP4, how it is stored: FP4 like them (nothing
// to record), FP8 128x128 blocks with F32 weight_scale_inv as transformers
// writes DeepSeek-V4's FP8, FP8 128x128 blocks under DeepSeek's own names
// (x.scale, F8_E8M0: the official repo layout; SharedNaming and
// SharedScaleDType record it), or unquantised.
func (k *checker) sharedApart(where, prefix string, proj [3]string) error {
	if !k.inShared || k.sharedSeen || k.p.Naming != weightfmt.NamingDeepSeek {
		return nil
	}
	k.sharedSeen = true
	w := prefix + "." + proj[0] + ".weight"
	meta, ok := k.t.Lookup(w)
	switch {
	case !ok:
		return nil // the checks name it
	case meta.DType == safetensors.F8E4M3:
		if sm, ds := k.t.Lookup(prefix + "." + proj[0] + ".scale"); ds {
			k.p.SharedNaming, k.p.SharedScaleDType = weightfmt.NamingDeepSeek, sm.DType
		}
		k.p.SharedQuantization, k.p.SharedWeightDType, k.sharedFrom = QuantFP8Block, meta.DType, w
	case isFloat(meta.DType):
		k.p.SharedQuantization = QuantNone
	}
	return nil
}

// apartSharedMLP checks a shared expert quantised otherwise than the
// routed experts (SharedQuantization: FP8 blocks beside DeepSeek-V4's FP4
// experts) as a plan of that format would.
func (k *checker) apartSharedMLP(where, prefix string, proj [3]string, inter int, hint string) (MLP, error) {
	sp := *k.p
	sp.Quantization, sp.Naming, sp.WeightDType, sp.ScaleDType, sp.SharedQuantization = k.p.SharedQuantization, k.p.SharedNaming, "", k.p.SharedScaleDType, ""
	sub := &checker{t: k.t, p: &sp}
	m, err := sub.mlp(where, prefix, proj, inter, hint)
	if err == nil && sub.dtype != k.p.SharedWeightDType {
		err = fmt.Errorf("%s: shared expert %s, expected %s like %s", where, sub.dtype, k.p.SharedWeightDType, k.sharedFrom)
	}
	return m, err
}

// readMXFP4Naming names a compressed-tensors mxfp4-pack-quantized plan's
// tensors as compressed-tensors does (x.weight_packed, x.weight_scale, per
// expert); gpt-oss's quant_method mxfp4 keeps the format's own.
func readMXFP4Naming(c config, p *Plan) {
	if _, m, _, _ := quantdesc.Config(c.j()); p.Quantization == QuantMXFP4 && m == "compressed-tensors" {
		p.Naming = weightfmt.NamingCompressedTensors
	}
}

// checkMXFP4Groups refuses an MXFP4 checkpoint whose exclusion list
// (gpt-oss's modules_to_not_convert, compressed-tensors' ignore) leaves the
// routed experts unquantised (then nothing is MXFP4 and the description
// is wrong about the tensors); compressed-tensors' may leave the shared
// expert unquantised, stated apart as INT4's is (sharedLeftPlain).
func checkMXFP4Groups(raw map[string]any, t Tensors, p *Plan) error {
	by := "modules_to_not_convert"
	if p.Naming == weightfmt.NamingCompressedTensors {
		by = "the ignore list"
	}
	return eachQuantDesc(raw, t, p.textLayers(), func(d quantdesc.Desc) error {
		if err := routedUnquantised(d, by, "one routed expert format"); err != nil {
			return err
		}
		if p.Naming == weightfmt.NamingCompressedTensors {
			sharedLeftPlain(d, p)
		}
		return nil
	})
}

// mxfp4Stacked checks gpt-oss's stacked MXFP4 experts of one layer (the
// plain names gateUp and down name their *_blocks and *_scales).
func (k *checker) mxfp4Stacked(where, gateUp, down string, interleaved bool, hint string) error {
	if k.p.Family != "gpt_oss" || k.p.Naming != "" {
		return fmt.Errorf("%s: MXFP4 experts stacked on disk are carried as gpt-oss stores them (quant_method mxfp4, *_blocks and *_scales) only, not %s's %s", where, k.p.Family, weightfmt.TensorsOf(mustFormat(k.p), gateUp).Weight)
	}
	e, h, i := int64(k.p.NumExperts), int64(k.p.HiddenSize), int64(k.p.MoEIntermediateSize)
	g := int64(weightfmt.MXFP4Group)
	if h%g != 0 || i%g != 0 {
		return fmt.Errorf("%s: MXFP4 needs hidden_size %d and intermediate_size %d to be multiples of %d (one E8M0 scale per %d columns) %s", where, h, i, g, g, hint)
	}
	f, err := k.p.Format()
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, w := range []struct {
		plain      string
		rows, cols int64
	}{{gateUp, 2 * i, h}, {down, h, i}} {
		if _, ok := k.t.Lookup(w.plain); ok {
			return fmt.Errorf("%s: %s is stored unquantised but config.json's quantization_config says mxfp4 (expected %s_blocks and %s_scales)", where, w.plain, w.plain, w.plain)
		}
		tn := weightfmt.TensorsOf(f, w.plain)
		for _, t := range []struct {
			name  string
			shape []int64
			what  string
		}{{tn.Weight, []int64{e, w.rows, w.cols / g, g / 2}, "E2M1 pairs"}, {tn.Scale, []int64{e, w.rows, w.cols / g}, "E8M0 scales"}} {
			meta, ok := k.t.Lookup(t.name)
			if !ok {
				return fmt.Errorf("%s: missing tensor %s (MXFP4 %s) %s", where, t.name, t.what, hint)
			}
			if meta.DType != safetensors.U8 {
				return fmt.Errorf("%s: %s dtype %s, expected U8 (MXFP4 %s as gpt-oss stores them)", where, t.name, meta.DType, t.what)
			}
			if !slices.Equal(meta.Shape, t.shape) {
				return fmt.Errorf("%s: %s shape %s, expected %s (MXFP4 %s) %s", where, t.name, shapeString(meta.Shape), shapeString(t.shape), t.what, hint)
			}
		}
	}
	if k.dtype == "" {
		k.dtype, k.dtypeFrom = safetensors.U8, weightfmt.TensorsOf(f, gateUp).Weight
	} else if k.dtype != safetensors.U8 {
		return fmt.Errorf("%s: MXFP4 experts (U8) beside %s ones (%s)", where, k.dtype, k.dtypeFrom)
	}
	return nil
}

// mxfp4Views names expert e's projections and their scale grids as views
// of the stacked MXFP4 tensors mxfp4Stacked checked.
func (k *checker) mxfp4Views(gateUp, down string, e, inter int, interleaved bool) MLP {
	f, _ := k.p.Format() // mxfp4Stacked built it
	gu, dn := weightfmt.TensorsOf(f, gateUp), weightfmt.TensorsOf(f, down)
	rows := func(name string, half int) string {
		if interleaved {
			return StridedRowsViewName(name, e, half, inter, 2)
		}
		return ViewName(name, e, half*inter, (half+1)*inter)
	}
	m := MLPOf(rows(gu.Weight, 0), rows(gu.Weight, 1), ViewName(dn.Weight, e, 0, 0))
	m.Set(layout.ProjGate, layout.RoleScale, rows(gu.Scale, 0))
	m.Set(layout.ProjUp, layout.RoleScale, rows(gu.Scale, 1))
	m.Set(layout.ProjDown, layout.RoleScale, ViewName(dn.Scale, e, 0, 0))
	return m
}
