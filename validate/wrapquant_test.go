package validate

import (
	"context"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit/quantwrap"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/judge"
)

// quantisedWrapperCase is a quantised wrapper release in small, the
// conversions it must pass and the contract's formats.
type quantisedWrapperCase struct {
	q            quantwrap.Spec
	quant, dense string
	runs         []convert.Options
	// expert and vision are DST tensors (stacked layout) of which one
	// expert's worth of bytes is corrupted: a routed expert stack, and
	// a tensor outside the text MoE layers (the vision tower's), which
	// only the byte proof reads.
	expert, vision string
}

// quantisedWrapperCases are Kimi-K2.5's INT4 release (with its BF16 shared
// expert, fused requantised too) and Qwen3.5-MoE's FP8 release.
func quantisedWrapperCases() []quantisedWrapperCase {
	return []quantisedWrapperCase{
		{quantwrap.KimiK25Int4(), "int4_pack", "none",
			append(slices.Clone(threeLayouts), requantRuns()...),
			"language_model.model.blocks.2.mlp.experts.all_up.weight_packed", "vision_tower.encoder.blocks.0.mlp.fc0.weight"},
		{quantwrap.Qwen35FP8(), "fp8_block_128x128", "", threeLayouts,
			"model.language_model.layers.1.mlp.experts.all_down.weight", "model.visual.blocks.0.attn.qkv.weight"},
	}
}

// TestGPUQuantisedWrappers: the quantised wrappers of
// TestQuantisedWrappersValidate on the GPU: every conversion passes
// validate --device cuda (against SRC's reference, the byte proof
// included), and the corrupted routed expert fails there with the byte
// proof off, so the GPU's numbers alone catch it.
func TestGPUQuantisedWrappers(t *testing.T) {
	needGPU(t)
	for _, tc := range quantisedWrapperCases() {
		t.Run(tc.q.Fixture, func(t *testing.T) {
			src := quantwrap.Write(t, hfFixtures, tc.q)
			conversionsPass(t, src, DeviceCUDA, tc.runs, nil)
			dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
			rewriteTensor(t, dst, tc.expert, func(raw []byte, _ []int64) {
				for i := range max(len(raw)/8, 1) {
					raw[i] ^= 0x5a
				}
			})
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: DeviceCUDA, Bytes: BytesOff})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Failed() || rep.Device != DeviceCUDA {
				t.Errorf("%s corrupted: validate on %s passed", tc.expert, rep.Device)
			}
		})
	}
}

// Kimi-K2.5's INT4 release and Qwen3.5-MoE's FP8 release, in small:
// every layout converts and validates on the CPU (fused vs reference and
// the byte proof, which covers the vision tower's bytes), the contract
// says the format, and a mutated expert fails.
func TestQuantisedWrappersValidate(t *testing.T) {
	for _, tc := range quantisedWrapperCases() {
		t.Run(tc.q.Fixture, func(t *testing.T) {
			src := quantwrap.Write(t, hfFixtures, tc.q)
			reps := conversionsPass(t, src, DeviceCPU, tc.runs, func(o convert.Options, c *layout.Contract) {
				if c.Quantization != tc.quant || string(c.SharedQuantization) != tc.dense && !o.RequantizeShared {
					t.Errorf("%+v: contract quantization %q shared %q, want %q %q", o, c.Quantization, c.SharedQuantization, tc.quant, tc.dense)
				}
			})
			for i, rep := range reps {
				fused := 0
				for _, r := range rep.Rows {
					if r.Check == judge.FusedVsReference {
						fused++
					}
				}
				if fused != 2 || rep.Bytes == nil || !rep.Bytes.Pass || rep.Bytes.Tensors == 0 {
					t.Errorf("%+v: %d fused-vs-reference rows (want one per MoE layer, 2), byte proof %+v", tc.runs[i], fused, rep.Bytes)
				}
			}
			for _, name := range []string{tc.expert, tc.vision} {
				dst := convertInto(t, src, convert.Options{Layout: layout.Stacked})
				rewriteTensor(t, dst, name, func(raw []byte, _ []int64) {
					for i := range max(len(raw)/8, 1) { // one expert's worth: the first eighth
						raw[i] ^= 0x5a
					}
				})
				modes := []BytesMode{BytesAuto, BytesOnly}
				if name == tc.expert {
					modes = append(modes, BytesOff) // the layer checks alone catch it too
				}
				for _, bytes := range modes {
					rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 3, Device: DeviceCPU, Bytes: bytes})
					if err != nil {
						t.Fatalf("%s, bytes %s: %v", name, bytes, err)
					}
					if !rep.Failed() {
						t.Errorf("%s corrupted, bytes %s: validate passed", name, bytes)
					}
				}
			}
		})
	}
}
