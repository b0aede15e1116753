package gpurun

import (
	"context"
	"github.com/moeprep/moeprep/layout"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestMixedFormatBanks: on the GPU, a layer whose MLPs are stored in two
// quantised formats (DeepSeek-V4: FP4 routed experts, FP8 128x128 shared
// expert) loads each MLP with its own: a routed expert decoded from FP4 to
// bf16 on the device, bit for bit the CPU's decode rounded to bf16; the
// shared expert as FP8 codes, byte for byte SRC's, under F32 block scales
// equal to SRC's (transformers' weight_scale_inv) or to 2^(e-127) of each
// E8M0 entry (the official x.scale, widened as uploaded). Loading the
// shared expert as the routed format, what the GPU path did before, is
// refused naming its tensor.
func TestMixedFormatBanks(t *testing.T) {
	specs := map[string]fixtures.SynthSpec{
		"transformers": {Family: "deepseek_v4", Layers: 2, HashLayers: 1, Hidden: 64, Intermediate: 64, Experts: 4, TopK: 2,
			DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 4201},
		"official": {Family: "deepseek_v4", Layers: 2, HashLayers: 1, Hidden: 64, Intermediate: 64, Experts: 4, TopK: 2,
			DType: fixtures.DTypeFP4Experts, Vocab: 64, Seed: 4202, Layout: fixtures.LayoutDeepSeekOfficial},
	}
	dev := testGPU(t)
	s, err := newStager(dev, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.free()
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			if _, err := fixtures.Write(context.Background(), src, spec, fixtures.Options{}); err != nil {
				t.Fatal(err)
			}
			ck, plan := cktest.OpenPlanned(t, src)
			wf, err := plan.Format()
			if err != nil {
				t.Fatal(err)
			}
			sf, err := plan.SharedFormat()
			if err != nil {
				t.Fatal(err)
			}
			h, inter := plan.HiddenSize, plan.MoEIntermediateSize
			layer := plan.Layers[1]
			m := layer.Experts[2]
			b, err := loadMLPBankOf(s, ck, m, h, inter, wf, plan.Act)
			if err != nil {
				t.Fatal(err)
			}
			want := cpuMLP(t, ck, m, h, inter, wf)
			for i, mat := range []kernels.Mat{b.Gate, b.Up, b.Down} {
				sameBits(t, "routed expert", 2, i, bankBF16(t, s, mat, 0, len(want[i])), want[i])
			}
			b.Free()

			sh := *layer.Shared
			if _, err := loadMLPBankOf(s, ck, sh, h, inter, wf, plan.Act); err == nil || !strings.Contains(err.Error(), sh.Weight(layout.ProjGate)) {
				t.Errorf("shared expert loaded as %s: %v, want a refusal naming %s", wf, err, sh.Weight(layout.ProjGate))
			}
			b, err = loadMLPBankOf(s, ck, sh, h, inter, sf, plan.Act)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Free()
			if err := s.wait(); err != nil {
				t.Fatal(err)
			}
			for i, p := range []struct {
				w, sc string
				mat   kernels.Mat
				scale *cuda.Buffer[float32]
			}{{sh.Weight(layout.ProjGate), sh.Get(layout.ProjGate, layout.RoleScale), b.Gate, b.GateScale}, {sh.Weight(layout.ProjUp), sh.Get(layout.ProjUp, layout.RoleScale), b.Up, b.UpScale}, {sh.Weight(layout.ProjDown), sh.Get(layout.ProjDown, layout.RoleScale), b.Down, b.DownScale}} {
				wt, _ := ck.Tensor(p.w)
				raw, err := wt.ReadAll()
				if err != nil {
					t.Fatal(err)
				}
				if p.mat.DType != kernels.MatFP8 || p.mat.Len != len(raw) {
					t.Fatalf("shared %s: bank %v of %d, want FP8 of %d", p.w, p.mat.DType, p.mat.Len, len(raw))
				}
				got := make([]byte, len(raw))
				if err := s.dev.Do(func(c *cuda.Ctx) error { return c.CopyDtoH(got, p.mat.Ptr) }); err != nil {
					t.Fatal(err)
				}
				if string(got) != string(raw) {
					t.Errorf("shared %s: device FP8 codes differ from SRC's", p.w)
				}
				st, _ := ck.Tensor(p.sc)
				sraw, err := st.ReadAll()
				if err != nil {
					t.Fatal(err)
				}
				wantS := make([]float32, st.NumElements())
				dt := st.DType
				if dt == safetensors.U8 {
					dt = safetensors.F8E8M0
				}
				if err := weightfmt.Decode(dt, sraw, wantS); err != nil {
					t.Fatal(err)
				}
				gotS, err := p.scale.ToHost(len(wantS))
				if err != nil {
					t.Fatal(err)
				}
				for j := range wantS {
					if gotS[j] != wantS[j] {
						t.Fatalf("shared projection %d scale [%d]: device %g, SRC %g (%s)", i, j, gotS[j], wantS[j], st.DType)
					}
				}
			}
		})
	}
}
