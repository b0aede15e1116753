package validate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/judge"
)

func TestOptionsRefused(t *testing.T) {
	withCUDA(t, cuda.ErrNoDriver)
	src := filepath.Join(hfFixtures, "qwen3-moe")
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"cuda", Options{Src: src, Golden: src, Device: "cuda"}, "no usable GPU: cuda: no NVIDIA driver"},
		{"unknown device", Options{Src: src, Golden: src, Device: "tpu"}, "unknown --device"},
		{"nothing", Options{}, "give SRC and DST"},
		{"one side, no golden", Options{Dst: src}, "--golden"},
		{"bad tokens", Options{Src: src, Golden: src, Tokens: -1}, "--tokens"},
		{"bad layers", Options{Src: src, Golden: src, Layers: "1,x"}, "--layers"},
		{"not a MoE layer", Options{Src: src, Golden: src, Layers: "0"}, "not a MoE layer"},
		{"bad sample", Options{Src: src, Golden: src, Layers: "sample:0"}, "sample:N"},
		{"DST not converted", Options{Src: src, Dst: src}, "no \"moeprep\" contract"},
		{"missing golden dir", Options{Src: src, Golden: filepath.Join(t.TempDir(), "none")}, "not a golden directory"},
		{"empty golden dir", Options{Src: src, Golden: t.TempDir()}, "no moe-layer-L.safetensors"},
	}
	for _, tt := range tests {
		_, err := Run(context.Background(), tt.o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want one containing %q", tt.name, err, tt.want)
			continue
		}
		if exitcode.Code(err) != exitcode.BadInput || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %q maps to exit %d (want 2, one line)", tt.name, err, exitcode.Code(err))
		}
	}
	if _, err := Run(context.Background(), Options{Src: src, Golden: src, Device: "cuda"}); !errors.Is(err, ErrDeviceUnavailable) {
		t.Errorf("cuda: %v is not ErrDeviceUnavailable", err)
	}
}

func TestSelectLayers(t *testing.T) {
	all := []int{1, 2, 3, 5, 8, 13, 61}
	tests := []struct {
		spec     string
		want     []int
		explicit bool
	}{
		{"all", all, false},
		{"sample:1", []int{1}, false},
		{"sample:2", []int{1, 61}, false},
		{"sample:3", []int{1, 5, 61}, false},
		{"sample:99", all, false},
		{"13, 2,2", []int{2, 13}, true},
	}
	for _, tt := range tests {
		got, explicit, err := selectLayers(tt.spec, all)
		if err != nil || !slices.Equal(got, tt.want) || explicit != tt.explicit {
			t.Errorf("%q: %v %v %v, want %v %v", tt.spec, got, explicit, err, tt.want, tt.explicit)
		}
	}
	for _, bad := range []string{"4", "-1", "sample:x", "sample:-2", "1;2", ""} {
		if _, _, err := selectLayers(bad, all); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDrawX(t *testing.T) {
	a, b := DrawX(5, 3, 64, 128), DrawX(5, 3, 64, 128)
	if !slices.Equal(a, b) {
		t.Fatal("DrawX is not deterministic")
	}
	if c := DrawX(5, 4, 64, 128); slices.Equal(a, c) {
		t.Fatal("different layers drew the same x")
	}
	var sum, sq float64
	for _, v := range a {
		if numfmt.RoundBF16(v) != v {
			t.Fatalf("%v is not bf16-representable", v)
		}
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	n := float64(len(a))
	if mean, vr := sum/n, sq/n-(sum/n)*(sum/n); math.Abs(mean) > 0.05 || math.Abs(vr-1) > 0.05 {
		t.Errorf("x mean %.3f var %.3f, want standard normal", mean, vr)
	}
}

func TestCompare(t *testing.T) {
	d := judge.Compare([]float32{3, 4.5}, []float32{3, 4})
	if math.Abs(d.RelL2-0.1) > 1e-12 || d.MaxAbs != 0.5 || d.Problem != "" {
		t.Errorf("rel_l2 %v max_abs %v problem %q, want 0.1 0.5", d.RelL2, d.MaxAbs, d.Problem)
	}
	if want := (9 + 18.0) / (math.Sqrt(9+20.25) * 5); math.Abs(d.Cosine-want) > 1e-12 {
		t.Errorf("cos %v, want %v", d.Cosine, want)
	}
	if d := judge.Compare([]float32{0, 0}, []float32{0, 0}); d.Problem == "" || judge.TolFP32.Verdict(d) == "" {
		t.Error("zeros vs zeros passed: never compare on zeros")
	}
	if d := judge.Compare([]float32{float32(math.NaN()), 1}, []float32{1, 1}); judge.TolFP32.Verdict(d) == "" {
		t.Error("NaN passed")
	}
	if d := judge.Compare([]float32{1}, []float32{1, 2}); judge.TolFP32.Verdict(d) == "" {
		t.Error("length mismatch passed")
	}
	if v := judge.TolFP32.Verdict(judge.Compare([]float32{1, 2.00001}, []float32{1, 2})); v != "" {
		t.Errorf("4.5e-6 relative failed fp32: %s", v)
	}
	if v := judge.TolFP32.Verdict(judge.Compare([]float32{1, 2.0001}, []float32{1, 2})); v == "" {
		t.Error("4.5e-5 relative passed fp32")
	}
}

func TestWeightsMatch(t *testing.T) {
	ids := []int32{3, 1}
	if _, ok := judge.WeightsMatch(ids, []float32{0.5, 0.25}, []int32{1, 3}, []float32{0.25, 0.50001}, 1, 2); !ok {
		t.Error("weights within rtol, other order, refused")
	}
	if e, ok := judge.WeightsMatch(ids, []float32{0.5, 0.25}, []int32{1, 3}, []float32{0.25, 0.51}, 1, 2); ok || math.Abs(e-0.01) > 1e-6 {
		t.Errorf("weights 0.01 apart: ok %v err %v", ok, e)
	}
}

func TestReportOutputs(t *testing.T) {
	rep := &Report{runSetup: runSetup{Device: "cpu"}, BlockSize: 64, Rows: []LayerResult{
		{Layer: 1, Check: judge.FusedVsReference, Tokens: 8, Experts: 257, ExpertsUsed: 40, Diff: judge.Diff{RelL2: 1e-7, Cosine: 1}, TopK: 1, Tolerance: judge.TolFP32, Pass: true},
		{Layer: 2, MTP: true, Check: judge.FusedVsGolden, Tokens: 8, Experts: 257, ExpertsUsed: 41, Diff: judge.Diff{RelL2: math.Inf(1), Problem: "zeros"}, TopK: math.NaN(), Tolerance: judge.TolGolden, Reason: "zeros"},
	}}
	if !rep.Failed() || exitcode.Code(rep.Err()) != exitcode.CheckFailed || !strings.Contains(rep.Err().Error(), "layer 2") {
		t.Fatalf("failed %v err %v", rep.Failed(), rep.Err())
	}
	var tb jsonBuf
	if err := rep.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layer", "rel_l2", "40/257", "1.000e-07", "2 (mtp)", "FAIL: zeros", "PASS", "1/2 checks passed"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb)
		}
	}
	var jb jsonBuf
	if err := rep.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Failed bool `json:"failed"`
		Layers []struct {
			Layer   int     `json:"layer"`
			RelL2   float64 `json:"rel_l2"`
			TopK    float64 `json:"topk"`
			Verdict string  `json:"verdict"`
			Experts int     `json:"experts"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(jb, &back); err != nil {
		t.Fatalf("%v\n%s", err, jb)
	}
	if !back.Failed || len(back.Layers) != 2 || back.Layers[0].RelL2 != 1e-7 || back.Layers[0].Verdict != "PASS" ||
		back.Layers[1].Verdict != "FAIL" || back.Layers[1].TopK != -1 || back.Layers[0].Experts != 257 {
		t.Errorf("JSON round trip: %+v", back)
	}
	if (&Report{}).Failed() == false {
		t.Error("a report with no rows passes")
	}
}

// writeGolden writes a golden file from float32 tensors and optional ids.
func writeGolden(t *testing.T, path string, tensors map[string][]float32, shapes map[string][]int64, ids []int32) {
	t.Helper()
	var entries []safetensors.Entry
	for _, n := range []string{"x", "y", "topk_weights"} {
		v, ok := tensors[n]
		if !ok {
			continue
		}
		entries = append(entries, memEntry(n, safetensors.F32, shapes[n], testkit.F32LE(v...)))
	}
	if ids != nil {
		b := make([]byte, 4*len(ids))
		for i, v := range ids {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		entries = append(entries, memEntry("topk_ids", safetensors.I32, shapes["topk_ids"], b))
	}
	if _, err := safetensors.WriteFile(context.Background(), path, nil, entries, nil); err != nil {
		t.Fatal(err)
	}
}

func TestReadGolden(t *testing.T) {
	dir := t.TempDir()
	x := []float32{1, 2, 3, 4, 5, 6}
	good := filepath.Join(dir, GoldenFileName(3))
	writeGolden(t, good, map[string][]float32{"x": x, "y": x, "topk_weights": {0.5, 0.5}},
		map[string][]int64{"x": {2, 3}, "y": {2, 3}, "topk_weights": {2, 1}, "topk_ids": {2, 1}}, []int32{4, 7})
	g, err := ReadGolden(good, 3)
	if err != nil {
		t.Fatal(err)
	}
	if g.T != 2 || g.H != 3 || g.K != 1 || !slices.Equal(g.IDs, []int32{4, 7}) || g.Y[5] != 6 {
		t.Errorf("golden %+v", g)
	}
	tests := []struct {
		name    string
		tensors map[string][]float32
		shapes  map[string][]int64
		ids     []int32
		h       int
		want    string
	}{
		{"no y", map[string][]float32{"x": x}, map[string][]int64{"x": {2, 3}}, nil, 3, "no tensor \"y\""},
		{"y shape", map[string][]float32{"x": x, "y": x}, map[string][]int64{"x": {2, 3}, "y": {3, 2}}, nil, 3, "[T,H]"},
		{"wrong H", map[string][]float32{"x": x, "y": x}, map[string][]int64{"x": {2, 3}, "y": {2, 3}}, nil, 4, "hidden size is 4"},
		{"ids without weights", map[string][]float32{"x": x, "y": x}, map[string][]int64{"x": {2, 3}, "y": {2, 3}, "topk_ids": {2, 1}}, []int32{1, 2}, 3, "come together"},
		{"ids rows", map[string][]float32{"x": x, "y": x, "topk_weights": {1, 1, 1}}, map[string][]int64{"x": {2, 3}, "y": {2, 3}, "topk_ids": {3, 1}, "topk_weights": {3, 1}}, []int32{1, 2, 3}, 3, "[2,K]"},
		{"NaN x", map[string][]float32{"x": {1, 2, 3, 4, 5, float32(math.NaN())}, "y": x}, map[string][]int64{"x": {2, 3}, "y": {2, 3}}, nil, 3, "x[5]"},
	}
	for _, tt := range tests {
		p := filepath.Join(dir, tt.name+".safetensors")
		writeGolden(t, p, tt.tensors, tt.shapes, tt.ids)
		_, err := ReadGolden(p, tt.h)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming the file and %q", tt.name, err, tt.want)
		}
	}
}

// TestGoldenOnlyAndMismatch: DST-only against goldens passes on a correct
// conversion, and a golden whose y is off fails the check (exit 1, not 2).
func TestGoldenOnlyAndMismatch(t *testing.T) {
	src := filepath.Join(hfFixtures, "qwen2-moe")
	dst := convertInto(t, src, convert.Options{Layout: layout.GateUp})
	rep, err := Run(context.Background(), Options{Dst: dst, Golden: src})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() || len(rep.Rows) == 0 || rep.Rows[0].Check != judge.FusedVsGolden {
		t.Fatalf("DST vs goldens: %+v", rep.Rows)
	}
	// A golden directory with layer 0 only, its y scaled by 1.01.
	gdir := t.TempDir()
	g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(0)), 0)
	if err != nil {
		t.Fatal(err)
	}
	y := slices.Clone(g.Y)
	for i := range y {
		y[i] *= 1.01
	}
	writeGolden(t, filepath.Join(gdir, GoldenFileName(0)), map[string][]float32{"x": g.X, "y": y, "topk_weights": g.Weights},
		map[string][]int64{"x": {int64(g.T), int64(g.H)}, "y": {int64(g.T), int64(g.H)}, "topk_ids": {int64(g.T), int64(g.K)}, "topk_weights": {int64(g.T), int64(g.K)}}, g.IDs)
	rep, err = Run(context.Background(), Options{Src: src, Dst: dst, Golden: gdir})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Failed() || exitcode.Code(rep.Err()) != 1 {
		t.Fatalf("a 1%% golden error passed: %+v", rep.Rows)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "layer 1 has no golden") }) {
		t.Errorf("notes %v, want one about layer 1's missing golden", rep.Notes)
	}
	_, err = Run(context.Background(), Options{Dst: dst, Golden: gdir, Layers: "1"})
	testkit.ErrorContains(t, err, "no golden for layer 1", "explicit layer without golden")
	if _, err := os.Stat(gdir); err != nil {
		t.Fatal(err)
	}
}

// SelectLayers is selectLayers over the MoE layers in any order: sorted
// first, as a run sorts them.
func TestSelectLayersExported(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []int
	}{
		{"all", []int{1, 2, 5, 9}},
		{"sample:2", []int{1, 9}},
		{"9,2", []int{2, 9}},
	} {
		got, err := SelectLayers(tc.spec, []int{9, 2, 5, 1})
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v %v, want %v", tc.spec, got, err, tc.want)
		}
	}
	if _, err := SelectLayers("3", []int{9, 2, 5, 1}); err == nil || err.Error() != "--layers: layer 3 is not a MoE layer (MoE layers: 1,2,5,9)" {
		t.Errorf("layer 3: %v", err)
	}
}
