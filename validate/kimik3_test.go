package validate

import (
	"context"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/stream"
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

// kimiK3Mutations: one flipped element of one expert, a scale, a nibble
// order, a shared expert's weight (each path runs its own) and each
// carried latent projection (the byte proof; on the GPU the fused path
// also runs DST's own).
func kimiK3Mutations() []dstMutation {
	return append(mxfp4Mutations(kimiK3MoE, ctMXFP4, "h96-l64", "h64-l32"),
		dstMutation{"a shared expert's weight changed", "h64-l32", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, kimiK3MoE+".shared_experts.down_proj.weight", func(raw []byte, _ []int64) { raw[41] ^= 0x40 })
		}},
		dstMutation{"the latent up projection changed", "h96-l64", convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, kimiK3MoE+".routed_expert_up_proj.weight", func(raw []byte, _ []int64) { raw[7] ^= 0x40 })
		}},
		dstMutation{"the latent down projection changed", "h64-l32", convert.Options{Layout: layout.Stacked}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, kimiK3MoE+".routed_expert_down_proj.weight", func(raw []byte, _ []int64) { raw[13] ^= 0x40 })
		}})
}

// kimiK3Latent are the mutations of the carried latent tensors.
var kimiK3Latent = []string{"the latent up projection changed", "the latent down projection changed"}

// TestKimiK3MutationsFail: every mutation is caught on the CPU; those the
// CPU's layer checks see (each path runs its own experts and shared
// experts) without the byte proof too, the latent tensors' (both paths
// run SRC's on the CPU) by the byte proof.
func TestKimiK3MutationsFail(t *testing.T) {
	muts := kimiK3Mutations()
	mutationsFail(t, kimiK3Specs(), muts[:len(muts)-len(kimiK3Latent)], DeviceCPU, []BytesMode{BytesOff, BytesAuto})
	mutationsFail(t, kimiK3Specs(), muts, DeviceCPU, []BytesMode{BytesAuto}, kimiK3Latent...)
}

// TestKimiK3Refusals: fuse-shared cannot put shared experts that read the
// hidden state into a bank that reads the latent. The GPU takes the latent
// MoE (gpurun's latent.go) in the bf16 precision its MXFP4 decode needs,
// and refuses f32 and fp8 in one line, as for any MXFP4 checkpoint. No GPU
// needed.
func TestKimiK3Refusals(t *testing.T) {
	refusalsHold(t, kimiK3Specs(), []refusal{
		{"fuse-shared", "h64-l32", nil, nil, true,
			"kimi_linear (model_type kimi_linear) is a latent MoE: its shared experts run on the hidden state (64 wide) and its routed experts on routed_expert_down_proj's latent (32 wide), so they cannot be slots of one bank"},
	})
	src := synthFrom(t, kimiK3Specs(), "h96-l64")
	dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
	bf16OnlyOnGPU(t, src, dst, "MXFP4 expert weights (quantization mxfp4, U8 scales)")
}

// TestGPUKimiK3: the latent MoE on the GPU (the bank on the latent, the
// projections on the router GEMM's kernel, SiTU in act.cu) passes in every
// layout against the CPU reference at gpu-bf16, and every mutation fails
// the run; the layer checks alone catch the latent tensors' (the fused path
// runs DST's, the others SRC's) and the shared expert's.
func TestGPUKimiK3(t *testing.T) {
	gpuDecodedPass(t, kimiK3Specs(), layoutsOnly, kimiK3Mutations(), append([]string{"a shared expert's weight changed"}, kimiK3Latent...)...)
}

// TestKimiK3GPUReference (CPU): the reference a GPU run compares with
// (gpuReference) takes a latent layer apart as a CPU run does: on each MoE
// layer it routes as the CPU's fused path on DST taken apart the same way
// and computes what it does within the CPU's tolerance, H wide for the
// routed and the forced tokens, and it is not the layer's bank run on the
// hidden state.
func TestKimiK3GPUReference(t *testing.T) {
	ctx := context.Background()
	src := synthFrom(t, kimiK3Specs(), "h64-l32")
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp})
	s := &session{o: Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 1, Tokens: 8}}
	targets := openSession(t, s)
	if len(targets) != 2 {
		t.Fatalf("%d MoE layers, want 2", len(targets))
	}
	for _, tg := range targets {
		x, tk, h, _, tokens, cov, err := s.layerStart(tg)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := s.gpuReference(ctx, tg, x, tk, cpuref.RefOptions{Tokens: tokens, Coverage: cov, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if h != 64 || len(ref.Y) != (tk+cov.T)*h {
			t.Fatalf("layer %d: %d values for %d + %d tokens x %d", tg.index, len(ref.Y), tk, cov.T, h)
		}
		lr, err := s.latentStart(tg, x, tk)
		if err != nil || lr == nil {
			t.Fatalf("layer %d: not taken apart: %v", tg.index, err)
		}
		fused, err := cpuref.FusedLayerRun(ctx, s.dst, lr.fused, lr.xl, tk, cpuref.FusedOptions{Tokens: tokens, Coverage: cov, BlockSize: s.o.BlockSize, RouterInput: x})
		if err != nil {
			t.Fatal(err)
		}
		bank := slices.Clone(fused.Y)
		if err := s.latentFinish(ctx, tg, lr, nil, fused); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ref.Routing.IDs, fused.Routing.IDs[:len(ref.Routing.IDs)]) {
			t.Errorf("layer %d: the reference routes %v, the fused path %v", tg.index, ref.Routing.IDs[:8], fused.Routing.IDs[:8])
		}
		if m := judge.Compare(ref.Y, fused.Y); !(m.RelL2 < 1e-5) {
			t.Errorf("layer %d: reference vs fused rel L2 %.3g", tg.index, m.RelL2)
		}
		// Without the shared experts on x the sum is far from it: the
		// comparison can fail.
		part, err := lr.finish(ctx, bank, s.dst, s.dstPlan, nil, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		if m := judge.Compare(ref.Y, part); !(m.RelL2 > 1e-2) {
			t.Errorf("layer %d: without the shared experts only %.3g away", tg.index, m.RelL2)
		}
	}
}

// A latent MoE's projections and norm are in its layer's head step, SRC's
// and DST's: each path reads its down projection before any expert, and a
// read waiting for a later step lets every step before it in past the
// pass's budget (DST's sat in a step after the experts, SRC's in none, so
// the whole layer was read into memory ahead of its readers: 34 GB of host
// memory at Kimi K3's 896 experts). The streamed run then reads every byte
// once, none outside the pass.
func TestKimiK3LatentInHeadStep(t *testing.T) {
	for name := range kimiK3Specs() {
		t.Run(name, func(t *testing.T) {
			src := synthFrom(t, kimiK3Specs(), name)
			for _, o := range threeLayouts {
				l := o.Layout
				dst := convertInto(t, src, o)
				s := &session{o: Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 1, Tokens: 8}}
				targets := openSession(t, s)
				pp := s.planPass(targets, nil)
				for _, tg := range targets {
					head := pp.steps[pp.layers[tg.index].head]
					lt := tg.fused.Latent
					for _, want := range []struct {
						side  string
						names []string
						ck    func(string) bool
					}{
						{"SRC", []string{tg.src.LatentDown, tg.src.LatentNorm, tg.src.LatentUp}, func(n string) bool { x, ok := s.src.Tensor(n); return ok && inStep(head, x.Name, x.File) }},
						{"DST", []string{lt.Down, lt.Norm, lt.Up}, func(n string) bool { x, ok := s.dst.Tensor(n); return ok && inStep(head, x.Name, x.File) }},
					} {
						for _, n := range want.names {
							if n == "" || !want.ck(n) {
								t.Errorf("%s layer %d: %s's latent tensor %q is not in the head step", l, tg.index, want.side, n)
							}
						}
					}
				}
				_, s2 := streamedRun(t, src, dst)
				if s2.streamMisses != 0 {
					t.Errorf("%s: %d tensor reads missed the pass", l, s2.streamMisses)
				}
			}
		})
	}
}

// inStep reports whether step st reads tensor name of file.
func inStep(st stream.Step, name, file string) bool {
	return slices.ContainsFunc(st.Extents, func(x stream.Extent) bool { return x.T != nil && x.T.Name == name && x.T.File == file })
}
