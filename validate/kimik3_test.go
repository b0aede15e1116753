package validate

import (
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// Kimi K3 as its release lays it out (issue 44, item 3): a latent MoE whose
// compressed-tensors MXFP4 routed experts run on routed_expert_down_proj's
// latent and leave through routed_expert_norm and routed_expert_up_proj,
// BF16 shared experts on the hidden state, SiTU everywhere (kimiK3Specs).

const kimiK3MoE = "language_model.layers.1.block_sparse_moe"

func TestKimiK3ConversionsValidate(t *testing.T) {
	specsPass(t, kimiK3Specs(), threeLayouts, nil, quantContract{weightfmt.QuantMXFP4, "U8", "", []int64{1, 32}}, nil)
	// --dtype dequantises the routed experts; the latent tensors and the
	// BF16 shared experts are carried as they are.
	dq := []convert.Options{{Layout: layout.Stacked, DType: safetensors.BF16}, {Layout: layout.GateUp, DType: safetensors.F32}}
	for name := range kimiK3Specs() {
		t.Run(name+"/dtype", func(t *testing.T) {
			reps := conversionsPass(t, synthFrom(t, kimiK3Specs(), name), DeviceCPU, dq, func(o convert.Options, c *layout.Contract) {
				if c.Dequantized == nil {
					t.Errorf("%+v: no dequantised record", o)
				}
			})
			if len(reps) != len(dq) {
				t.Errorf("%d reports for %d conversions", len(reps), len(dq))
			}
		})
	}
}

// TestKimiK3MutationsFail: one flipped element of one expert, a scale, a
// nibble order, a shared expert's weight (each path runs its own) and the
// carried latent projection (the byte proof: both paths run SRC's) are
// caught.
func TestKimiK3MutationsFail(t *testing.T) {
	ct := weightfmt.MXFP4(weightfmt.NamingCompressedTensors, safetensors.U8, safetensors.U8)
	shared := dstMutation{"a shared expert's weight changed", "h64-l32", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
		rewriteTensor(t, dst, kimiK3MoE+".shared_experts.down_proj.weight", func(raw []byte, _ []int64) { raw[41] ^= 0x40 })
	}}
	mutationsFail(t, kimiK3Specs(), append(mxfp4Mutations(kimiK3MoE, ct, "h96-l64", "h64-l32"), shared), DeviceCPU, []BytesMode{BytesOff, BytesAuto})
	mutationsFail(t, kimiK3Specs(), []dstMutation{
		{"the latent up projection changed", "h96-l64", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, kimiK3MoE+".routed_expert_up_proj.weight", func(raw []byte, _ []int64) { raw[7] ^= 0x40 })
		}},
	}, DeviceCPU, []BytesMode{BytesAuto})
}

// TestKimiK3Refusals: fuse-shared cannot put shared experts that read the
// hidden state into a bank that reads the latent; the GPU run has no step
// for the latent transforms, so --device cuda is refused in one line and
// auto runs the CPU. No GPU needed.
func TestKimiK3Refusals(t *testing.T) {
	refusalsHold(t, kimiK3Specs(), []refusal{
		{"fuse-shared", "h64-l32", nil, nil, true,
			"kimi_linear (model_type kimi_linear) is a latent MoE: its shared experts run on the hidden state (64 wide) and its routed experts on routed_expert_down_proj's latent (32 wide), so they cannot be slots of one bank"},
	})
	src := synthFrom(t, kimiK3Specs(), "h96-l64")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	cudaRefused(t, src, dst, PrecisionBF16,
		"a latent MoE (routed experts on routed_expert_down_proj's 64-wide latent, then routed_expert_norm and routed_expert_up_proj back to 96) has no GPU path",
		"running on the CPU")
}
