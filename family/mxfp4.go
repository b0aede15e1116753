package family

import (
	"fmt"
	"slices"

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

// checkMXFP4Groups refuses an MXFP4 checkpoint whose
// modules_to_not_convert leaves the routed experts unquantised (then
// nothing is MXFP4 and the description is wrong about the tensors).
func checkMXFP4Groups(raw map[string]any, t Tensors, p *Plan) error {
	return eachQuantDesc(raw, t, func(d QuantDesc) error {
		return routedUnquantised(d, "modules_to_not_convert", "one routed expert format")
	})
}

// mxfp4Stacked checks gpt-oss's stacked MXFP4 experts of one layer (the
// plain names gateUp and down name their *_blocks and *_scales).
func (k *checker) mxfp4Stacked(where, gateUp, down string, interleaved bool, hint string) error {
	if k.p.Family != "gpt_oss" {
		return fmt.Errorf("%s: MXFP4 (quant_method mxfp4) experts stacked on disk are carried for gpt-oss only, not %s", where, k.p.Family)
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
	return MLP{
		Gate: rows(gu.Weight, 0), Up: rows(gu.Weight, 1), Down: ViewName(dn.Weight, e, 0, 0),
		GateScale: rows(gu.Scale, 0), UpScale: rows(gu.Scale, 1), DownScale: ViewName(dn.Scale, e, 0, 0),
	}
}
