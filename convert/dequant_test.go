package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// fp8Dequant is an FP8 128x128 block weight of the synth dequantised as
// DeepSeek defines it, written here without weightfmt's dequantisation:
// each E4M3 value times its block's F32 scale, rounded to float32, then
// encoded in to (weightfmt.Encode, whose one rounding weightfmt's tests
// hold to numfmt's float64 encoders).
func fp8Dequant(w, scale synthTensor, to safetensors.DType) []byte {
	rows, cols := w.shape[0], w.shape[1]
	sc := (cols + 127) / 128
	vals := make([]float32, 0, rows*cols)
	for r := range rows {
		for c := range cols {
			s := math.Float32frombits(binary.LittleEndian.Uint32(scale.data[4*((r/128)*sc+c/128):]))
			vals = append(vals, float32(numfmt.E4M3ToF32(w.data[r*cols+c])*s))
		}
	}
	out := make([]byte, len(vals)*to.Size())
	weightfmt.Encode(to, vals, out)
	return out
}

// convert --dtype on an FP8 checkpoint (DeepSeek-V2's two shared experts,
// a dense layer, FP8 attention): every FP8 weight, stacked or not, holds
// its dequantisation rounded once, under its plain name; no scale is left;
// every other tensor is the source's bytes; config.json has lost
// quantization_config and only that; the contract records it. Fused, the
// shared expert's slices are its dequantised rows and columns.
func TestDequantFP8Convert(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	s := ds2FP8
	srcT := writeSynth(t, src, s, nil)
	setQuantConfig(t, src)
	I, H, S := int64(s.I), int64(s.H), int64(s.S)
	for i, o := range []Options{{DType: safetensors.BF16}, {DType: safetensors.F16, Layout: layout.GateUp, FuseShared: true, TP: 2},
		{DType: safetensors.F32, Layout: layout.UpGate}} {
		t.Run(fmt.Sprintf("%s %s fuse %v", o.DType, o.Layout, o.FuseShared), func(t *testing.T) {
			o.Src, o.Dst = src, filepath.Join(dir, fmt.Sprint("dst", i))
			sum, err := Convert(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			out, cfg := readOut(t, o.Dst)
			if _, has := cfg["quantization_config"]; has {
				t.Error("config.json kept quantization_config")
			}
			c, _, err := layout.ReadContract(cfg)
			if err != nil || c.Dequantized == nil || c.Dequantized.DType != string(o.DType) || c.Quantized() || c.WeightDType != string(o.DType) {
				t.Fatalf("contract %+v: %v", c, err)
			}
			if sum.DType != strings.ToLower(string(o.DType)) || sum.DequantizedTensors == 0 {
				t.Errorf("summary dtype %q, %d dequantised", sum.DType, sum.DequantizedTensors)
			}
			dq := func(name string) []byte {
				return fp8Dequant(srcT[name], srcT[strings.TrimSuffix(name, ".weight")+".weight_scale_inv"], o.DType)
			}
			stacked := map[string]bool{}
			for _, l := range s.moeLayers() {
				p := s.moePrefix(l)
				names := layout.NamesFor(o.Layout, p, nil)
				gate, down := out[names.Weight(layout.ProjGate)].data, out[names.Weight(layout.ProjDown)].data
				if o.Layout.Fused() {
					gate = out[names.Weight(layout.ProjGateUp)].data
				}
				es := int64(o.DType.Size())
				for e := range int64(s.E) {
					ep := fmt.Sprintf("%s.experts.%d.", p, e)
					g, u, d := dq(ep+"gate_proj.weight"), dq(ep+"up_proj.weight"), dq(ep+"down_proj.weight")
					if o.Layout.Fused() {
						eqFusedPair(t, o.Layout, gate, e, g, u, ep+"gate", ep+"up")
					} else {
						eqBytes(t, ep+"gate", sliceOf(gate, e, int64(len(g))), g)
						eqBytes(t, ep+"up", sliceOf(out[names.Weight(layout.ProjUp)].data, e, int64(len(u))), u)
					}
					eqBytes(t, ep+"down", sliceOf(down, e, int64(len(d))), d)
					for _, pr := range []string{"gate_proj", "up_proj", "down_proj"} {
						stacked[ep+pr+".weight"], stacked[ep+pr+".weight_scale_inv"] = true, true
					}
				}
				sp := p + ".shared_experts."
				if !o.FuseShared {
					continue
				}
				sg, su, sd := dq(sp+"gate_proj.weight"), dq(sp+"up_proj.weight"), dq(sp+"down_proj.weight")
				for r := range int64(o.TP) {
					for sl := range S {
						b := int64(s.E) + r*S + sl
						eqFusedPair(t, o.Layout, gate, b, rowsOf(sg, H*es, sl*I, I), rowsOf(su, H*es, sl*I, I), sp+"gate slice", sp+"up slice")
						eqBytes(t, sp+"down slice", sliceOf(down, b, H*I*es), colsOf(sd, H, S*I*es, sl*I*es, I*es))
					}
				}
				for _, pr := range []string{"gate_proj", "up_proj", "down_proj"} {
					stacked[sp+pr+".weight"], stacked[sp+pr+".weight_scale_inv"] = true, true
				}
			}
			for name, st := range srcT {
				switch {
				case stacked[name]:
					if _, ok := out[name]; ok {
						t.Errorf("%s: stacked, and still in DST", name)
					}
				case strings.HasSuffix(name, "_scale_inv"):
					if _, ok := out[name]; ok {
						t.Errorf("%s: a scale in a dequantised DST", name)
					}
				case st.dtype == safetensors.F8E4M3:
					got := out[name]
					if got.dtype != o.DType || !slices.Equal(got.shape, st.shape) {
						t.Errorf("%s: %s %v, want %s %v", name, got.dtype, got.shape, o.DType, st.shape)
					}
					eqBytes(t, name+" dequantised", got.data, dq(name))
				default:
					eqBytes(t, name+" copied", out[name].data, st.data)
				}
			}
		})
	}
}

// setQuantConfig gives the synth's config.json DeepSeek's FP8
// quantization_config (the synth writes FP8 weights without one).
func setQuantConfig(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, "config.json")
	if _, has := testkit.ReadJSON(t, p)["quantization_config"]; has {
		return
	}
	b := bytes.Replace(testkit.ReadFile(t, p), []byte("{"), []byte(`{"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},`), 1)
	testkit.WriteFile(t, p, b)
}

// withoutKey drops a top-level member wherever it stands (first, middle,
// last, alone, repeated) and keeps every other byte; a nested member of
// that name stays.
func TestWithoutKey(t *testing.T) {
	const k = "quantization_config"
	for _, tc := range []struct{ in, want string }{
		{`{"a": 1, "quantization_config": {"x": [1, 2]}, "b": 2}`, `{"a": 1, "b": 2}`},
		{"{\n  \"quantization_config\": {},\n  \"a\": 1\n}\n", "{\n  \"a\": 1\n}\n"},
		{`{"a": {"quantization_config": 1}, "quantization_config": null}`, `{"a": {"quantization_config": 1}}`},
		{`{"quantization_config": 1}`, `{}`},
		{`{"quantization_config": 1, "quantization_config": 2, "c": "}"}`, `{"c": "}"}`},
		{`{"a": 1}`, `{"a": 1}`},
	} {
		got, err := withoutKey([]byte(tc.in), k)
		if err != nil || string(got) != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := withoutKey([]byte(`[1]`), k); err == nil {
		t.Error("an array was accepted")
	}
}

// --dtype is refused where it cannot apply, in one line saying why.
func TestDequantRefusals(t *testing.T) {
	dir := t.TempDir()
	bf, fp := filepath.Join(dir, "bf16"), filepath.Join(dir, "fp8")
	writeSynth(t, bf, ds3BF16, nil)
	writeSynth(t, fp, ds3FP8, nil)
	setQuantConfig(t, fp)
	big := filepath.Join(dir, "big")
	writeSynth(t, big, ds3FP8, func(ts []synthTensor) []synthTensor {
		for i := range ts {
			if ts[i].name == "model.layers.0.self_attn.o_proj.weight_scale_inv" {
				binary.LittleEndian.PutUint32(ts[i].data, math.Float32bits(1e4)) // 448 * 1e4 > 65504
			}
		}
		return ts
	})
	setQuantConfig(t, big)
	for _, tc := range []struct {
		src  string
		o    Options
		want string
	}{
		{bf, Options{DType: safetensors.BF16}, "not quantised, so there is nothing to dequantise"},
		{fp, Options{DType: safetensors.I8}, "--dtype i8: want bf16, f16 or f32"},
		{fp, Options{DType: safetensors.BF16, FuseShared: true, FoldScaling: layout.FoldDown}, "--fold-scaling down with --dtype"},
		{big, Options{DType: safetensors.F16}, "model.layers.0.self_attn.o_proj.weight: dequantised value"},
	} {
		o := tc.o
		o.Src, o.Dst = tc.src, filepath.Join(dir, "out")
		_, err := Convert(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v, want one line saying %q", tc.o, err, tc.want)
		}
	}
}

// --dry-run accounts for the larger output: the dequantised tensors' bytes
// in the dtype, and the estimate from the larger of read and write.
func TestDequantDryRun(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeSynth(t, src, ds3FP8, nil)
	setQuantConfig(t, src)
	plain, err := DryRun(context.Background(), Options{Src: src, Dst: filepath.Join(dir, "a")})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F32} {
		p, err := DryRun(context.Background(), Options{Src: src, Dst: filepath.Join(dir, "b"), DType: d})
		if err != nil {
			t.Fatal(err)
		}
		if p.WriteBytes < plain.WriteBytes*int64(d.Size())*9/10 || p.DType != strings.ToLower(string(d)) || p.DequantizedTensors == 0 {
			t.Errorf("%s: write %d bytes (plain %d), dtype %q, %d dequantised", d, p.WriteBytes, plain.WriteBytes, p.DType, p.DequantizedTensors)
		}
		sum, err := Convert(context.Background(), Options{Src: src, Dst: filepath.Join(dir, "out"+string(d)), DType: d})
		if err != nil {
			t.Fatal(err)
		}
		var shards int64
		for _, s := range p.Shards {
			shards += s.Bytes
		}
		if sum.Bytes < shards {
			t.Errorf("%s: wrote %d bytes, the plan's shards are %d", d, sum.Bytes, shards)
		}
		if p.ReadRate > 0 && p.EstimatedSeconds < float64(p.WriteBytes)/p.ReadRate*0.99 {
			t.Errorf("%s: estimate %.3f s for %d bytes written at %.0f B/s", d, p.EstimatedSeconds, p.WriteBytes, p.ReadRate)
		}
	}
}

// --resume of a dequantised run reuses the shards whose source bytes (the
// weights, scales and global scales dequantising reads) still hash as
// recorded and redoes the one whose scale changed in place; the result is
// what a fresh run writes. Over the complete output it does nothing.
func TestDequantResume(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeSynth(t, src, ds3FP8, nil)
	o := Options{Src: src, Dst: filepath.Join(dir, "dst"), MaxShardSize: 400_000, DType: safetensors.BF16}
	interruptedRun(t, o)
	flipTensorByte(t, src, "model.layers.2.mlp.experts.3.down_proj.weight_scale_inv")
	o.Resume = true
	sum, err := Convert(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if sum.ReusedShards == 0 || sum.ReusedShards == sum.Shards {
		t.Errorf("reused %d of %d shards: want the unchanged ones reused and the changed one redone", sum.ReusedShards, sum.Shards)
	}
	fresh := o
	fresh.Dst, fresh.Resume = filepath.Join(dir, "fresh"), false
	if _, err := Convert(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, "resumed output", snapshot(t, o.Dst), snapshot(t, fresh.Dst))
	if sum, err = Convert(context.Background(), o); err != nil || !sum.AlreadyComplete || sum.DType != "bf16" {
		t.Fatalf("resume of the complete output: %+v %v", sum, err)
	}
	o.DType = safetensors.F16
	if _, err := Convert(context.Background(), o); err == nil || !strings.Contains(err.Error(), "other options") {
		t.Errorf("resume with another --dtype: %v", err)
	}
}
