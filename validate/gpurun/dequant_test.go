package gpurun

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/moelayer"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// TestDecodedBanksMatchCPU: on the GPU, every weight of a 4-bit format (and
// of MXFP8, whose E8M0 grid is staged a chunk's rows at a time too, and of
// FP8 in 32x32 and 64x64 blocks, whose grids are staged whole) as
// the stager decodes it on the device is bit for bit the CPU's decode
// (tensorload.LoadMatrix) rounded to bf16: SRC's per-expert MLPs through
// loadMLPBankOf (gpt-oss's gate and up as strided views of its interleaved
// rows; Kimi's BF16 shared expert as the plain weights it is) and DST's
// stacks in every layout through LoadFusedBank (each expert's slice, and
// each gate-up half, against SRC's expert). The decode chunk is a few rows,
// so a weight spans several chunks and a chunk of a stack spans experts
// (and NVFP4's per-expert global scales).
func TestDecodedBanksMatchCPU(t *testing.T) {
	specs := map[string]fixtures.SynthSpec{
		"int4-g32": {Family: "kimi_k2", Layers: 2, DenseLayers: 1, Hidden: 96, Intermediate: 64, Experts: 5, SharedExperts: 1, TopK: 2,
			RoutedScalingFactor: 2.5, DType: fixtures.DTypeInt4Pack, GroupSize: 32, Vocab: 64, Seed: 4101, BiasLike: "deepseek"},
		"int4-channel": {Family: "qwen3_moe", Layers: 2, DenseLayers: 1, Hidden: 72, Intermediate: 24, Experts: 4, TopK: 2,
			DType: fixtures.DTypeInt4Pack, Vocab: 64, Seed: 4102},
		"mxfp4": {Family: "gpt_oss", Layers: 1, Hidden: 64, Intermediate: 96, Experts: 4, TopK: 2, DType: fixtures.DTypeMXFP4, Vocab: 64, Seed: 4103},
		"nvfp4": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 48, Intermediate: 32, Experts: 6, SharedExperts: 1, TopK: 2,
			NGroup: 2, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: fixtures.DTypeNVFP4, Vocab: 64, Seed: 4104, BiasLike: "deepseek"},
		"mxfp8": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 96, Experts: 5, SharedExperts: 1, TopK: 2,
			NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: fixtures.DTypeMXFP8, Vocab: 64, Seed: 4105, BiasLike: "deepseek"},
		// FP8 in 32x32 blocks (UE8M0 F32 scales): 80 hidden columns and
		// down rows end in a ragged block, a chunk of 3 rows spans blocks
		// and experts. And 64x64 blocks.
		"fp8-b32": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 80, Intermediate: 64, Experts: 5, SharedExperts: 1, TopK: 2,
			NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: "fp8", ScaleFmt: "ue8m0", FP8Block: 32, Vocab: 64, Seed: 4106, BiasLike: "deepseek"},
		"fp8-b64": {Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 128, Intermediate: 96, Experts: 4, SharedExperts: 1, TopK: 2,
			NGroup: 1, TopKGroup: 1, RoutedScalingFactor: 2.5, DType: "fp8", FP8Block: 64, Vocab: 64, Seed: 4107, BiasLike: "deepseek"},
	}
	s := testStager(t)
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			src, ck, plan, wf := synthPlanned(t, spec)
			layer := plan.Layers[0]
			h, inter := plan.HiddenSize, plan.MoEIntermediateSize
			s.dq.chunk = 3 * (weightfmt.Matrix{Format: wf, Rows: 1, Cols: int64(h)}).RowBytes()
			// want[e] is SRC's expert e as the CPU decodes it: gate, up, down.
			want := make([][3][]uint16, len(layer.Experts))
			for e, m := range layer.Experts {
				want[e] = cpuMLP(t, ck, m, h, inter, wf)
				b, err := loadMLPBankOf(s, ck, m, h, inter, wf, plan.Act)
				if err != nil {
					t.Fatal(err)
				}
				for i, mat := range []kernels.Mat{b.Gate, b.Up, b.Down} {
					sameBits(t, "src expert", e, i, bankBF16(t, s, mat, 0, len(want[e][i])), want[e][i])
				}
				b.Free()
			}
			if layer.Shared != nil {
				si := rowsOf(t, ck, layer.Shared.Weight(layout.ProjGate))
				shared := cpuMLP(t, ck, *layer.Shared, h, si, wf)
				b, err := loadMLPBankOf(s, ck, *layer.Shared, h, si, wf, plan.Act)
				if err != nil {
					t.Fatal(err)
				}
				for i, mat := range []kernels.Mat{b.Gate, b.Up, b.Down} {
					sameBits(t, "src shared expert", 0, i, bankBF16(t, s, mat, 0, len(shared[i])), shared[i])
				}
				b.Free()
			}
			for _, l := range []layout.Layout{layout.Stacked, layout.GateUp, layout.UpGate} {
				dst := filepath.Join(t.TempDir(), string(l))
				if _, err := convert.Convert(context.Background(), convert.Options{Src: src, Dst: dst, Layout: l}); err != nil {
					t.Fatal(err)
				}
				dck := cktest.Open(t, dst)
				c, _, err := layout.ReadContract(dck.Config)
				if err != nil {
					t.Fatal(err)
				}
				cf, err := c.Format()
				if err != nil {
					t.Fatal(err)
				}
				fl := &moelayer.FusedLayer{Index: layer.Index, Contract: c, Names: layout.NamesFor(l, layer.Prefix, cf)}
				b, err := LoadFusedBank(context.Background(), s, dck, fl)
				if err != nil {
					t.Fatal(err)
				}
				gn := inter * h
				for e := range want {
					var gate, up []uint16
					if l.Fused() {
						gate, up = bankBF16(t, s, b.GateUp, 2*e*gn, gn), bankBF16(t, s, b.GateUp, (2*e+1)*gn, gn)
						if b.UpFirst {
							gate, up = up, gate
						}
					} else {
						gate, up = bankBF16(t, s, b.Gate, e*gn, gn), bankBF16(t, s, b.Up, e*gn, gn)
					}
					for i, got := range [][]uint16{gate, up, bankBF16(t, s, b.Down, e*gn, gn)} {
						sameBits(t, string(l)+" dst expert", e, i, got, want[e][i])
					}
				}
				b.Free()
			}
		})
	}
}

// testGPU opens GPU 0, or skips without a driver or a GPU.
func testGPU(t *testing.T) *cuda.Device {
	t.Helper()
	dev, err := cuda.Open(0)
	if errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// synthPlanned writes spec into src, opens and plans it, and gives its
// experts' weight format.
func synthPlanned(t *testing.T, spec fixtures.SynthSpec) (src string, ck *checkpoint.Checkpoint, plan *family.Plan, wf weightfmt.Format) {
	t.Helper()
	src = cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), spec)
	ck, plan = cktest.OpenPlanned(t, src)
	wf, err := plan.Format()
	if err != nil {
		t.Fatal(err)
	}
	return src, ck, plan, wf
}

// testStager is a stager on testGPU's device, freed before the device is
// closed.
func testStager(t *testing.T) *Stager {
	t.Helper()
	s, err := newStager(testGPU(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.free)
	return s
}

// rowsOf is the rows of 2-D tensor name.
func rowsOf(t *testing.T, src tensorload.TensorSource, name string) int {
	t.Helper()
	tt, ok := src.Tensor(name)
	if !ok || len(tt.Shape) != 2 {
		t.Fatalf("tensor %s missing or not 2-D", name)
	}
	return int(tt.Shape[0])
}

// cpuMLP is MLP m (gate, up [inter, h], down [h, inter]) as the CPU
// reference decodes it (tensorload.LoadMatrix), rounded to bf16.
func cpuMLP(t *testing.T, src tensorload.TensorSource, m family.MLP, h, inter int, wf weightfmt.Format) [3][]uint16 {
	t.Helper()
	var out [3][]uint16
	for i, r := range []tensorload.MatrixRef{
		{Name: m.Weight(layout.ProjGate), Index: -1, Rows: inter, Cols: h, Scale: m.Get(layout.ProjGate, layout.RoleScale), Format: wf, Global: m.Get(layout.ProjGate, layout.RoleGlobal)},
		{Name: m.Weight(layout.ProjUp), Index: -1, Rows: inter, Cols: h, Scale: m.Get(layout.ProjUp, layout.RoleScale), Format: wf, Global: m.Get(layout.ProjUp, layout.RoleGlobal)},
		{Name: m.Weight(layout.ProjDown), Index: -1, Rows: h, Cols: inter, Scale: m.Get(layout.ProjDown, layout.RoleScale), Format: wf, Global: m.Get(layout.ProjDown, layout.RoleGlobal)},
	} {
		f, err := tensorload.LoadMatrix(src, r)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = make([]uint16, len(f))
		for j, v := range f {
			out[i][j] = numfmt.F32ToBF16(v)
		}
	}
	return out
}

// bankBF16 reads n bf16 values of m from element off once s's stream has
// run.
func bankBF16(t *testing.T, s *Stager, m kernels.Mat, off, n int) []uint16 {
	t.Helper()
	if m.DType != kernels.MatBF16 || off+n > m.Len {
		t.Fatalf("bank weight %v of %d elements: want bf16 elements [%d, %d)", m.DType, m.Len, off, off+n)
	}
	if err := s.wait(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2*n)
	if err := s.dev.Do(func(c *cuda.Ctx) error { return c.CopyDtoH(b, m.Ptr.Add(2*off)) }); err != nil {
		t.Fatal(err)
	}
	v := make([]uint16, n)
	for i := range v {
		v[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return v
}

// sameBits fails t where got differs from want (projection i: gate, up,
// down of expert e).
func sameBits(t *testing.T, what string, e, i int, got, want []uint16) {
	t.Helper()
	for j := range want {
		if got[j] != want[j] {
			t.Fatalf("%s %d %s [%d]: device 0x%04x, CPU 0x%04x", what, e, [3]string{"gate", "up", "down"}[i], j, got[j], want[j])
		}
	}
}

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
	s := testStager(t)
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			_, ck, plan, wf := synthPlanned(t, spec)
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
			_, err = loadMLPBankOf(s, ck, sh, h, inter, wf, plan.Act)
			testkit.ErrorContains(t, err, sh.Weight(layout.ProjGate), "shared expert loaded as "+wf.String())
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
