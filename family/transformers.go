package family

import "github.com/moeprep/moeprep/layout"

// TransformersForm is how transformers 5 holds a family's routed experts in
// memory once it has loaded a checkpoint: what `convert --layout
// transformers` writes, so that transformers loads the output as the
// original model (the same parameters, no missing or unexpected key).
//
// For most families transformers 5 stacks the experts itself on load (its
// conversion mapping concatenates the per-expert gate and up rows into
// experts.gate_up_proj [E, 2I, H] and the down rows into experts.down_proj
// [E, H, I]), so the form is moeprep's gate-up layout, out-in. The zero
// value says that.
type TransformersForm struct {
	// AsStored: the form is the source's own expert tensors, byte for
	// byte: transformers 5 holds the experts exactly as the family's
	// checkpoints store them and converts nothing on load (aria's
	// experts.fc1/fc2 [E, H, 2I]/[E, I, H], DBRX's flat experts.mlp.w1/v1/w2,
	// gpt-oss's interleaved gate_up_proj with its biases, or its MXFP4
	// _blocks/_scales), or it holds a form moeprep's stacks do not write
	// and builds it from the checkpoint on load (LongCat-Flash's gate-up
	// rows for its zero-compute experts, Nemotron-H's ungated stacks).
	AsStored bool
	// InOut: the stacks are held transposed, [in, out] per expert, for
	// x @ W (Llama 4's gate_up_proj [E, H, 2I], gate columns then up, and
	// down_proj [E, I, H]). Meaningless with AsStored.
	InOut bool
	// Module is the name transformers 5 gives the MoE module that holds
	// the stacks where it differs from what layout.ExpertsPrefix makes of
	// the checkpoint's (Step-3.7's "moe" is "mlp"; Granite's
	// "block_sparse_moe" stays, where Mixtral's becomes "mlp"); "" for the
	// rule. Meaningless with AsStored.
	Module string
	// Why says in a few words where the form comes from, for convert's
	// notice ("" for the zero value).
	Why string
}

// Layout is the stored layout and orientation the form is written as.
func (f TransformersForm) Layout() (layout.Layout, layout.Orientation) {
	switch {
	case f.AsStored:
		return layout.AsStored, layout.OutIn
	case f.InOut:
		return layout.GateUp, layout.InOut
	}
	return layout.GateUp, layout.OutIn
}

// Describe is the form in one clause, for convert's notice.
func (f TransformersForm) Describe(modelType string) string {
	switch {
	case f.AsStored:
		return "its experts are written as the checkpoint stores them: " + f.Why
	case f.InOut:
		return "transformers 5 holds " + modelType + "'s experts as experts.gate_up_proj [E, H, 2I] and experts.down_proj [E, I, H], transposed: " + f.Why
	case f.Module != "":
		return "transformers 5 holds " + modelType + "'s experts as " + f.Module + ".experts.gate_up_proj [E, 2I, H] and " + f.Module + ".experts.down_proj [E, H, I]: " + f.Why
	}
	return "transformers 5 holds " + modelType + "'s experts as experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]"
}

// TransformersOutputForm is the form `convert --layout transformers`
// writes for this checkpoint: the family's (Plan.Transformers), except
// where the routed experts are stored quantised. transformers 5 reads
// quantised experts only as the checkpoint's per-expert tensors: with
// FP8 dequantised on load (FineGrainedFP8Config(dequantize=True), its
// quantizer's update_weight_conversions) it collects each expert's
// `weight` with its `weight_scale_inv` and folds the pair before its
// conversion stacks the experts, and compressed-tensors checkpoints are
// decompressed the same way, per expert (weight_packed, weight_scale,
// weight_shape), before stacking. A stacked quantised tensor matches
// neither: transformers 5.17 loaded moeprep's stacked FP8
// experts.gate_up_proj without its scales and reported
// experts.gate_up_proj_scale_inv as unexpected (docs/OUTPUT.md). So
// quantised experts are written as stored, which loads as the original
// does whichever way transformers is told to load it.
func (p *Plan) TransformersOutputForm() TransformersForm {
	if p.Transformers.AsStored || p.Quantization == "" || p.Quantization == QuantNone {
		return p.Transformers
	}
	return TransformersForm{AsStored: true, Why: quantisedExpertsWhy(p.Quantization)}
}

// quantisedExpertsWhy is the clause convert's notice gives for writing
// experts stored in q as they are.
func quantisedExpertsWhy(q Quantization) string {
	switch q {
	case QuantFP8Block, QuantFP8Tensor:
		return "transformers 5 dequantises FP8 experts per expert, each weight with its own scale, before it stacks them, and reads no stacked FP8 scale (experts.gate_up_proj_scale_inv is an unexpected key with dequantize=True)"
	case QuantFP8Channel, QuantInt4Pack, QuantNVFP4CT:
		return "transformers 5 decompresses compressed-tensors experts per expert before it stacks them and reads no stacked quantised tensor"
	}
	return "transformers 5 reads " + string(q) + " experts per expert, as the checkpoint stores them, and no stacked form of them"
}
