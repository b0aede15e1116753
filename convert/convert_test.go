package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

var (
	ds3BF16 = synth{model: "deepseek_v3", dtype: safetensors.BF16, E: 8, I: 24, H: 40, S: 1, layers: 3, dense: 1, rsf: 2.5, files: 2, seed: 1}
	ds3FP8  = synth{model: "deepseek_v3", dtype: safetensors.F8E4M3, E: 4, I: 192, H: 320, S: 1, layers: 3, dense: 1, rsf: 2.5, files: 3, seed: 2}
	ds2BF16 = synth{model: "deepseek_v2", dtype: safetensors.BF16, E: 4, I: 16, H: 24, S: 2, layers: 2, dense: 0, rsf: 2.5, files: 2, seed: 3}
	ds2FP8  = synth{model: "deepseek_v2", dtype: safetensors.F8E4M3, E: 4, I: 128, H: 256, S: 2, layers: 2, dense: 1, rsf: 2.5, files: 2, seed: 4}
	mixBF16 = synth{model: "mixtral", dtype: safetensors.BF16, E: 4, I: 16, H: 24, layers: 2, rsf: 1, files: 1, seed: 5}
	q3BF16  = synth{model: "qwen3_moe", dtype: safetensors.BF16, E: 4, I: 16, H: 24, layers: 2, rsf: 1, files: 2, seed: 6}
	q2BF16  = synth{model: "qwen2_moe", dtype: safetensors.BF16, E: 4, I: 16, H: 24, layers: 2, rsf: 1, files: 2, seed: 7}
	ds3F16  = synth{model: "deepseek_v3", dtype: safetensors.F16, E: 4, I: 16, H: 24, S: 1, layers: 2, dense: 0, rsf: 2.5, files: 1, seed: 8}
)

func withScaleFmt(s synth, f string) synth { s.scaleFmt = f; return s }

func TestConvertProducesExactStacks(t *testing.T) {
	cases := []struct {
		name string
		src  synth
		o    Options
		fold bool // expect rsf folded
	}{
		{"ds3 bf16 convert stacked", ds3BF16, Options{}, false},
		{"ds3 bf16 convert gate-up", ds3BF16, Options{Layout: layout.GateUp, MaxShardSize: 20000}, false},
		{"ds3 bf16 convert up-gate", ds3BF16, Options{Layout: layout.UpGate}, false},
		{"ds3 fp8 convert stacked", ds3FP8, Options{MaxShardSize: 100000}, false},
		{"ds3 fp8 fuse tp4 auto stacked", ds3FP8, Options{FuseShared: true, TP: 4}, true},
		{"ds3 fp8 fuse tp2 down gate-up", ds3FP8, Options{FuseShared: true, TP: 2, FoldScaling: "down", Layout: layout.GateUp}, true},
		{"ds3 fp8 fuse none up-gate R3", ds3FP8, Options{FuseShared: true, TP: 8, Replicas: 3, FoldScaling: "none", Layout: layout.UpGate}, false},
		{"ds3 fp8 ue8m0 fuse auto", withScaleFmt(ds3FP8, "ue8m0"), Options{FuseShared: true, TP: 2}, false},
		{"ds3 bf16 fuse tp1 auto", ds3BF16, Options{FuseShared: true}, false},
		{"ds3 bf16 fuse tp8 down gate-up", ds3BF16, Options{FuseShared: true, TP: 8, FoldScaling: "down", Layout: layout.GateUp, Jobs: 1}, true},
		{"ds3 f16 fuse tp2 down", ds3F16, Options{FuseShared: true, TP: 2, FoldScaling: "down"}, true},
		{"ds2 bf16 S2 fuse tp2 stacked", ds2BF16, Options{FuseShared: true, TP: 2, FoldScaling: "down"}, true},
		{"ds2 bf16 S2 fuse tp3 up-gate", ds2BF16, Options{FuseShared: true, TP: 3, Layout: layout.UpGate}, false},
		{"ds2 fp8 S2 fuse tp2 gate-up auto", ds2FP8, Options{FuseShared: true, TP: 2, Layout: layout.GateUp}, true},
		{"mixtral convert stacked", mixBF16, Options{}, false},
		{"mixtral convert gate-up", mixBF16, Options{Layout: layout.GateUp}, false},
		{"qwen3 convert up-gate", q3BF16, Options{Layout: layout.UpGate}, false},
		{"qwen2 convert stacked keeps gated shared", q2BF16, Options{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			srcT := writeSynth(t, src, tc.src, nil)
			o := tc.o
			o.Src, o.Dst = src, dst
			sum, err := Convert(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			checkOutput(t, tc.src, srcT, src, dst, o, tc.fold, sum)
		})
	}
}

// checkOutput proves DST against the source: stacks slice by slice, shared
// replicas, folding, every other tensor, index, contract, manifest, files.
func checkOutput(t *testing.T, s synth, srcT map[string]synthTensor, src, dst string, o Options, fold bool, sum *Summary) {
	t.Helper()
	if _, err := os.Stat(dst + PartialSuffix); !os.IsNotExist(err) {
		t.Errorf("%s still exists after success", dst+PartialSuffix)
	}
	out, cfg := readOut(t, dst)
	c, ok, err := layout.ReadContract(cfg)
	if err != nil || !ok {
		t.Fatalf("contract: ok %v err %v", ok, err)
	}
	lay, _ := layout.Parse(string(o.Layout))
	R, S := 0, 0
	if o.FuseShared {
		R = max(o.Replicas, max(o.TP, 1))
		if o.Replicas > 0 {
			R = o.Replicas
		}
		S = s.S
	}
	wantSlot := 1 / s.rsf
	if fold {
		wantSlot = 1
	}
	if c.Layout != lay || c.NumExperts != s.E || c.NumFusedSharedExperts != R*S || c.SharedReplicas != R ||
		c.SharedSlices != S || c.SharedFirstID != s.E || c.RoutedScalingFactor != s.rsf ||
		c.RoutedScalingFactorFolded != fold || c.SharedSlotWeight != wantSlot || c.Manifest != layout.ManifestFileName ||
		len(c.Layers) != len(s.moeLayers()) {
		t.Errorf("contract %+v: want layout %s E %d R %d S %d folded %v slot %v", c, lay, s.E, R, S, fold, wantSlot)
	}
	if sum.Folded != fold || sum.FusedShared != R*S {
		t.Errorf("summary %+v", sum)
	}
	for k, v := range s.config() { // the source config survives unchanged
		got, _ := json.Marshal(cfg[k])
		want, _ := json.Marshal(v)
		if !bytes.Equal(got, want) {
			t.Errorf("config.json %s = %s, source had %s", k, got, want)
		}
	}

	fp8 := s.fp8()
	es := int64(s.dtype.Size())
	I, H, E := int64(s.I), int64(s.H), s.E
	pn := s.projNames()
	expected := map[string]bool{}
	consumed := map[string]bool{}
	maxRel := 0.0
	for li, l := range s.moeLayers() {
		p := s.moePrefix(l)
		if c.Layers[li].Prefix != p || c.Layers[li].Index != l {
			t.Errorf("contract layer %d = %+v, want index %d prefix %s", li, c.Layers[li], l, p)
		}
		names := layout.Names(lay, p, fp8)
		bank := E + R*S
		// per bank id: gate, up, down bytes and scales, as the source defines them
		type mats struct{ g, u, d, gs, us, ds []byte }
		expert := func(b int) mats {
			if b < E {
				ep := fmt.Sprintf("%s.experts.%d.", p, b)
				m := mats{g: srcT[ep+pn[0]+".weight"].data, u: srcT[ep+pn[1]+".weight"].data, d: srcT[ep+pn[2]+".weight"].data}
				consumed[ep+pn[0]+".weight"], consumed[ep+pn[1]+".weight"], consumed[ep+pn[2]+".weight"] = true, true, true
				if fp8 {
					m.gs, m.us, m.ds = srcT[ep+pn[0]+".weight_scale_inv"].data, srcT[ep+pn[1]+".weight_scale_inv"].data, srcT[ep+pn[2]+".weight_scale_inv"].data
					for _, n := range pn {
						consumed[ep+n+".weight_scale_inv"] = true
					}
				}
				return m
			}
			sl := int64((b - E) % S)
			sp := p + "." + s.sharedModule() + "."
			SI := int64(S) * I
			m := mats{
				g: rowsOf(srcT[sp+"gate_proj.weight"].data, H*es, sl*I, I),
				u: rowsOf(srcT[sp+"up_proj.weight"].data, H*es, sl*I, I),
				d: colsOf(srcT[sp+"down_proj.weight"].data, H, SI*es, sl*I*es, I*es),
			}
			if S == 1 { // the whole shared expert, whatever I is
				m.g, m.u, m.d = srcT[sp+"gate_proj.weight"].data, srcT[sp+"up_proj.weight"].data, srcT[sp+"down_proj.weight"].data
			}
			if fp8 && S == 1 {
				m.gs, m.us, m.ds = srcT[sp+"gate_proj.weight_scale_inv"].data, srcT[sp+"up_proj.weight_scale_inv"].data, srcT[sp+"down_proj.weight_scale_inv"].data
			} else if fp8 {
				gc := int64(ceilDiv(s.H, 128)) * 4
				m.gs = rowsOf(srcT[sp+"gate_proj.weight_scale_inv"].data, gc, sl*I/128, I/128)
				m.us = rowsOf(srcT[sp+"up_proj.weight_scale_inv"].data, gc, sl*I/128, I/128)
				m.ds = colsOf(srcT[sp+"down_proj.weight_scale_inv"].data, int64(ceilDiv(s.H, 128)), SI/128*4, sl*I/128*4, I/128*4)
			}
			return m
		}
		if o.FuseShared {
			for _, n := range []string{"gate_proj", "up_proj", "down_proj"} {
				consumed[p+"."+s.sharedModule()+"."+n+".weight"] = true
				consumed[p+"."+s.sharedModule()+"."+n+".weight_scale_inv"] = true
			}
		}
		get := func(name string) tensorData {
			expected[name] = true
			d, ok := out[name]
			if !ok {
				t.Fatalf("output lacks %s", name)
			}
			return d
		}
		downDT, downScaleDT := s.dtype, safetensors.F32
		var gate, up, gateUp, down, gs, us, gus, ds tensorData
		if lay.Fused() {
			gateUp, down = get(names.Weight(layout.ProjGateUp)), get(names.Weight(layout.ProjDown))
			if fp8 {
				gus, ds = get(names.Get(layout.ProjGateUp, layout.RoleScale)), get(names.Get(layout.ProjDown, layout.RoleScale))
			}
		} else {
			gate, up, down = get(names.Weight(layout.ProjGate)), get(names.Weight(layout.ProjUp)), get(names.Weight(layout.ProjDown))
			if fp8 {
				gs, us, ds = get(names.Get(layout.ProjGate, layout.RoleScale)), get(names.Get(layout.ProjUp, layout.RoleScale)), get(names.Get(layout.ProjDown, layout.RoleScale))
			}
		}
		for b := 0; b < bank; b++ {
			m := expert(b)
			where := fmt.Sprintf("layer %d bank id %d", l, b)
			foldW := fold && !fp8 && b < E
			foldS := fold && fp8 && b < E
			if lay.Fused() {
				eqFusedPair(t, lay, gateUp.data, int64(b), m.g, m.u, where+" gate_up first half", where+" gate_up second half")
				if fp8 {
					eqFusedPair(t, lay, gus.data, int64(b), m.gs, m.us, where+" gate_up scale first", where+" gate_up scale second")
				}
			} else {
				eqBytes(t, where+" gate", sliceOf(gate.data, int64(b), int64(len(m.g))), m.g)
				eqBytes(t, where+" up", sliceOf(up.data, int64(b), int64(len(m.u))), m.u)
				if fp8 {
					eqBytes(t, where+" gate scale", sliceOf(gs.data, int64(b), int64(len(m.gs))), m.gs)
					eqBytes(t, where+" up scale", sliceOf(us.data, int64(b), int64(len(m.us))), m.us)
				}
			}
			gotD := sliceOf(down.data, int64(b), int64(len(m.d)))
			if foldW {
				maxRel = math.Max(maxRel, eqFolded(t, where+" down", gotD, m.d, downDT, s.rsf))
			} else {
				eqBytes(t, where+" down", gotD, m.d)
			}
			if fp8 {
				gotS := sliceOf(ds.data, int64(b), int64(len(m.ds)))
				if foldS {
					maxRel = math.Max(maxRel, eqFolded(t, where+" down scale", gotS, m.ds, downScaleDT, s.rsf))
				} else {
					eqBytes(t, where+" down scale", gotS, m.ds)
				}
			}
		}
	}
	if c.FoldMaxRelChange != maxRel || sum.FoldMaxRelChange != maxRel {
		t.Errorf("fold_max_rel_change %v (summary %v), recomputed %v", c.FoldMaxRelChange, sum.FoldMaxRelChange, maxRel)
	}
	if fold && !fp8 && maxRel == 0 {
		t.Errorf("bf16/f16 folding by %v changed nothing: the test data cannot tell", s.rsf)
	}
	for name, st := range srcT {
		if consumed[name] {
			continue
		}
		expected[name] = true
		got, ok := out[name]
		checkAsIs(t, name, got, ok, st.tensorData, "output against the source")
	}
	for name := range out {
		if !expected[name] {
			t.Errorf("output has unexpected tensor %s", name)
		}
	}
	for _, f := range []string{"tokenizer.json", "generation_config.json", "extra/notes.txt"} {
		a, _ := os.ReadFile(filepath.Join(src, f))
		b, err := os.ReadFile(filepath.Join(dst, f))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s not copied unchanged: %v", f, err)
		}
	}
	m, err := layout.ReadManifest(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Verify(dst); err != nil {
		t.Error(err)
	}
	var all []string
	filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dst, p)
			if rel != layout.ManifestFileName {
				all = append(all, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if len(all) != len(m.Files) || sum.Files != len(all)+1 {
		t.Errorf("manifest lists %d files, DST holds %d (+manifest), summary says %d", len(m.Files), len(all), sum.Files)
	}
	for _, f := range all {
		if _, ok := m.Files[f]; !ok {
			t.Errorf("manifest lacks %s", f)
		}
	}
}

func sliceOf(b []byte, i, n int64) []byte {
	if (i+1)*n > int64(len(b)) {
		return nil
	}
	return b[i*n : (i+1)*n]
}

// rowsOf is rows [r0, r0+nr) of a row-major matrix with rowBytes per row.
func rowsOf(b []byte, rowBytes, r0, nr int64) []byte { return b[r0*rowBytes : (r0+nr)*rowBytes] }

// colsOf is the byte columns [c0, c0+nc) of each of rows rows.
func colsOf(b []byte, rows, rowBytes, c0, nc int64) []byte {
	var out []byte
	for r := int64(0); r < rows; r++ {
		out = append(out, b[r*rowBytes+c0:r*rowBytes+c0+nc]...)
	}
	return out
}

// eqFusedPair checks bank id b of a fused gate_up tensor: its first half
// holds g and its second u, or the other way round in the up-gate layout.
func eqFusedPair(t *testing.T, lay layout.Layout, data []byte, b int64, g, u []byte, firstWhat, secondWhat string) {
	t.Helper()
	first, second := g, u
	if lay == layout.UpGate {
		first, second = u, g
	}
	n := int64(len(first))
	eqBytes(t, firstWhat, sliceOf(data, b, 2*n)[:n], first)
	eqBytes(t, secondWhat, sliceOf(data, b, 2*n)[n:], second)
}

func eqBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(want) == 0 || !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes differ from the source's %d", what, len(got), len(want))
	}
}

// eqFolded checks got == round(src*rsf) element by element, and independently
// that each is within half a unit in the last place of the exact product;
// it returns the largest relative change.
func eqFolded(t *testing.T, what string, got, src []byte, d safetensors.DType, rsf float64) float64 {
	t.Helper()
	if len(got) != len(src) {
		t.Errorf("%s: %d bytes, source %d", what, len(got), len(src))
		return 0
	}
	es := d.Size()
	halfULP := map[safetensors.DType]float64{safetensors.BF16: 1.0 / 256, safetensors.F16: 1.0 / 2048, safetensors.F32: 1.0 / (1 << 24)}[d]
	maxRel, bad := 0.0, 0
	for i := 0; i < len(src); i += es {
		x, y := decode(src[i:], d), decode(got[i:], d)
		exact := x * rsf
		if want := weightfmt.FoldValue(x, rsf, d); y != want {
			bad++
		}
		if exact != 0 {
			r := math.Abs(y-exact) / math.Abs(exact)
			maxRel = math.Max(maxRel, r)
			if r > halfULP {
				bad++
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements not the rounded product by %v", what, bad, len(src)/es, rsf)
	}
	return maxRel
}

func decode(b []byte, d safetensors.DType) float64 {
	switch d {
	case safetensors.BF16:
		return float64(numfmt.BF16ToF32(binary.LittleEndian.Uint16(b)))
	case safetensors.F16:
		return float64(numfmt.F16ToF32(binary.LittleEndian.Uint16(b)))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
}

func TestConfigWithContractKeepsSourceBytes(t *testing.T) {
	c := &layout.Contract{Version: 1, Layout: layout.Stacked, NumExperts: 4, SharedSlotWeight: 1}
	for _, src := range []string{"{\n  \"a\": 1,\n  \"z\": [1, 2]\n}\n", "{}", "{ }\n", `{"b":{"c":2}}`} {
		out, err := configWithContract([]byte(src), c)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		trimmed := strings.TrimRight(strings.TrimSpace(src), "}")
		if !strings.HasPrefix(string(out), strings.TrimRight(trimmed, " \n")) {
			t.Errorf("%q: output %q does not keep the source bytes", src, out)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if got, ok, err := layout.ReadContract(m); !ok || err != nil || got.NumExperts != 4 {
			t.Errorf("%q: contract %+v %v %v", src, got, ok, err)
		}
	}
	if _, err := configWithContract([]byte("[1]"), c); err == nil {
		t.Error("a JSON array config was accepted")
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"5GB", 5e9, true}, {"500MB", 5e8, true}, {"2GiB", 2 << 30, true}, {"1.5 kb", 1500, true},
		{"123", 123, true}, {"10B", 10, true}, {"", 0, false}, {"-1GB", 0, false}, {"GB", 0, false}, {"5XB", 0, false},
	} {
		got, err := ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	out := slices.Sorted(maps.Keys(m))
	return out
}
