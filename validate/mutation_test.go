package validate

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/fixtures/hf"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/judge"
)

const hfFixtures = "../fixtures/hf"

// convertInto runs convert / fuse-shared from src into a fresh temporary DST.
func convertInto(t *testing.T, src string, o convert.Options) string {
	t.Helper()
	o.Src = src
	o.Dst = filepath.Join(t.TempDir(), "dst")
	if _, err := convert.Convert(context.Background(), o); err != nil {
		t.Fatalf("convert %s: %v", src, err)
	}
	return o.Dst
}

// TestValidateCorrectConversions: validate passes on correct conversions of
// the committed HF fixtures (every family and layout, fuse-shared with --tp
// 1, 4 and 8 and every --fold-scaling), and the fused path agrees with the HF
// goldens. The numbers are logged for the closing note.
func TestValidateCorrectConversions(t *testing.T) {
	for _, c := range conversionCases() {
		t.Run(c.name(), func(t *testing.T) {
			src := filepath.Join(hfFixtures, c.fixture)
			dst := convertInto(t, src, c.o)
			rep := runPass(t, Options{Src: src, Dst: dst, Golden: src, Seed: 1}, "validate failed on a correct conversion")
			checks := checksRun(rep)
			for _, r := range rep.Rows {
				if r.Check == judge.FusedVsGolden && r.Tolerance == judge.TolGolden && r.RelL2 > 2e-6 {
					t.Errorf("layer %d: fused vs HF golden %.3g, expected float32 rounding (< 2e-6)", r.Layer, r.RelL2)
				}
				t.Logf("layer %d %-20s rel_l2 %.3g topk %.4f (%s)", r.Layer, r.Check, r.RelL2, r.TopK, r.Tolerance.Name)
			}
			if checks[judge.FusedVsReference] == 0 || checks[judge.FusedVsGolden] != checks[judge.FusedVsReference] || checks[judge.ReferenceVsGolden] != checks[judge.FusedVsReference] {
				t.Fatalf("checks run: %v, want all three on every layer", checks)
			}
		})
	}
}

// conv is one conversion of an HF fixture.
type conv struct {
	fixture string
	o       convert.Options
}

func (c conv) name() string {
	return fmt.Sprintf("%s/%s/fuse=%v/tp=%d/fold=%s", c.fixture, c.o.Layout, c.o.FuseShared, c.o.TP, c.o.FoldScaling)
}

// conversionCases: every family and layout, fuse-shared with --tp 1, 4 and
// 8 and every --fold-scaling.
func conversionCases() []conv {
	var cases []conv
	lays := []layout.Layout{layout.Stacked, layout.GateUp, layout.UpGate}
	for i, f := range []string{"deepseek-v3-bf16", "deepseek-v3-fp8", "deepseek-v2-lite", "mixtral", "mixtral-bin-sharded", "qwen2-moe", "qwen3-moe", "qwen3-moe-bin"} {
		cases = append(cases, conv{f, convert.Options{Layout: lays[i%3]}})
	}
	for _, f := range []string{"deepseek-v3-bf16", "deepseek-v3-fp8"} {
		for i, tp := range []int{1, 4, 8} {
			for j, fold := range []string{"auto", "down", "none"} {
				if (i+j)%3 != 0 && !(f == "deepseek-v3-bf16" && fold == "down") {
					continue // every tp and every fold on each fixture, not all 9 pairs
				}
				cases = append(cases, conv{f, convert.Options{Layout: lays[(i+j)%3], FuseShared: true, TP: tp, FoldScaling: fold}})
			}
		}
	}
	cases = append(cases, conv{"deepseek-v2-lite", convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 2}})
	// The families of issue 11 (fixtures/hf/export_families.py): one layout
	// each, and fuse-shared where the shared expert is ungated.
	for i, f := range []string{"glm4-moe", "glm4-moe-lite", "exaone-moe", "hy-v3", "afmoe", "ernie4-5-moe",
		"minimax-m2", "olmoe", "minimax", "jamba", "qwen3-next", "cohere2-moe"} {
		cases = append(cases, conv{f, convert.Options{Layout: lays[i%3]}})
		if i < 6 {
			cases = append(cases, conv{f, convert.Options{Layout: lays[(i+1)%3], FuseShared: true, TP: []int{1, 4, 8}[i%3]}})
		}
	}
	// issue 30's families: every layout, fuse-shared where the shared expert is ungated.
	for i, f := range []string{"dots1", "hunyuan-v1-moe", "solar-open", "lfm2-moe", "mimo-v2-flash", "dbrx"} {
		for j, lay := range lays {
			cases = append(cases, conv{f, convert.Options{Layout: lay}})
			if i < 3 {
				cases = append(cases, conv{f, convert.Options{Layout: lay, FuseShared: true, TP: []int{1, 4, 8}[j]}})
			}
		}
	}
	// Cohere2 MoE's average: the whole output halved, shared slots included.
	cases = append(cases, conv{"cohere2-moe", convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 2}})
	// Granite MoE: experts stacked on disk, read through views; the shared
	// MLP beside the MoE block (2I wide in granitemoe-swa: split in two).
	cases = append(cases, conv{"granitemoe", convert.Options{Layout: layout.UpGate}},
		conv{"granitemoeshared", convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 4}},
		conv{"granitemoe-swa", convert.Options{Layout: layout.Stacked, FuseShared: true, TP: 2}})
	// FP8 variants of the fused families (rsf folded into the F32 down scales)
	for i, f := range []string{"glm4-moe-fp8", "glm4-moe-lite-fp8", "exaone-moe-fp8", "hy-v3-fp8"} {
		cases = append(cases, conv{f, convert.Options{Layout: lays[i%3], FuseShared: true, TP: []int{8, 1, 4, 2}[i]}})
	}
	cases = append(cases, conv{"afmoe-fp8", convert.Options{Layout: layout.GateUp}}, conv{"ernie4-5-moe-fp8", convert.Options{}},
		conv{"phimoe", convert.Options{Layout: layout.UpGate}}) // sparsemixer routing
	// Llama 4: experts stacked and transposed on disk, the routing weight
	// scaling the expert input; HF's top-1, two MoE layers of four.
	cases = append(cases, conv{"llama4-text", convert.Options{Layout: layout.GateUp}}, conv{"llama4-text", convert.Options{}})
	// gpt-oss: interleaved transposed gate-up columns, biases, router bias,
	// clamped SwiGLU (on the GPU through the unfused-activation fallback).
	cases = append(cases, conv{"gpt-oss", convert.Options{}}, conv{"gpt-oss", convert.Options{Layout: layout.UpGate}})
	// DeepSeek-V4: sqrtsoftplus routing, a hash-routed layer, the clamped
	// SwiGLU on experts and shared MLP; rsf 1.5 folded or not.
	cases = append(cases, conv{"deepseek-v4-fp8", convert.Options{Layout: layout.UpGate, FuseShared: true, TP: 2}})
	cases = append(cases, conv{"deepseek-v4", convert.Options{Layout: layout.GateUp}},
		conv{"deepseek-v4", convert.Options{FuseShared: true, TP: 4}},
		conv{"deepseek-v4", convert.Options{Layout: layout.UpGate, FuseShared: true, TP: 1, FoldScaling: "down"}})
	// ERNIE 4.5 with use_bias: the shared expert's biases, kept unfused.
	cases = append(cases, conv{"ernie4-5-moe-bias", convert.Options{Layout: layout.GateUp}})
	// Inkling: stacked experts, a router with rows for the shared experts,
	// global_scale.
	cases = append(cases, conv{"inkling-text", convert.Options{}}, conv{"inkling-text", convert.Options{Layout: layout.UpGate}})
	// Issue 29's low-bit variants (fixtures/hf/export_lowbit.py): every
	// layout; fuse-shared where routed and shared experts share the format.
	// gpt-oss-mxfp4's goldens are transformers' own MXFP4 dequantisation.
	for _, f := range hf.Names(hf.Fixture.LowBit) {
		for _, l := range lays {
			cases = append(cases, conv{f, convert.Options{Layout: l}})
		}
	}
	cases = append(cases, conv{"deepseek-v3-fp8-tensor", convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 4}},
		conv{"deepseek-v3-nvfp4", convert.Options{FuseShared: true, TP: 2}})
	// Issue 30's multimodal wrappers (fixtures/hf/export_wrappers.py): the
	// text model's MoE layers in every layout, the vision tower and the
	// projector carried and proven byte for byte; fuse-shared where the
	// text family fuses (Kimi-K2.5's DeepSeek-V3, GLM-4.5V's GLM-4.5).
	for _, f := range []string{"qwen3-5-moe", "llama4", "kimi-k25", "qwen3-vl-moe", "glm4v-moe"} {
		for _, l := range lays {
			cases = append(cases, conv{f, convert.Options{Layout: l}})
		}
	}
	cases = append(cases, conv{"kimi-k25", convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 8}},
		conv{"glm4v-moe", convert.Options{FuseShared: true, TP: 2, FoldScaling: "down"}})
	// Issue 30's later families and wrappers, written by transformers 5.17:
	// every layout, fuse-shared (tp 1, 4, 8 in turn) where the shared expert
	// is ungated. Inkling's multimodal model is saved in the hub's layout
	// (gate and up rows interleaved in w13_weight); fuse-shared refuses it,
	// as inkling-text (the router weights the shared experts per token).
	for i, f := range []string{"axk1", "axk2", "deepseek-v32", "glm-moe-dsa", "laguna", "granitemoehybrid", "aria",
		"minimax-m3-vl", "deepseek-ocr2", "glm5-next", "kimi-linear", "mistral4", "flex-olmo", "mellum", "qwen3-omni-moe", "qwen4-exp", "inkling-mm-model", "step3p7", "hy-v4", "gemma4-text", "gemma4", "diffusion-gemma", "longcat-flash"} {
		for j, lay := range lays {
			cases = append(cases, conv{f, convert.Options{Layout: lay}})
			if i < 12 && j == i%3 {
				cases = append(cases, conv{f, convert.Options{Layout: lay, FuseShared: true, TP: []int{1, 4, 8}[j]}})
			}
		}
	}
	// Nemotron-H's ungated experts are written stacked only (all_up,
	// all_down): out-in, in-out, and fuse-shared (its relu2 shared MLP, two
	// experts wide)
	cases = append(cases, conv{"nemotron-h", convert.Options{}}, conv{"nemotron-h", convert.Options{Orientation: layout.InOut}},
		conv{"nemotron-h", convert.Options{FuseShared: true, TP: 4}})
	// ERNIE-4.5-VL's two routed banks a layer (text, vision; each of its
	// own width): every layout, and in-out.
	for _, lay := range lays {
		cases = append(cases, conv{"ernie4-5-vl-moe", convert.Options{Layout: lay}})
	}
	cases = append(cases, conv{"ernie4-5-vl-moe", convert.Options{Orientation: layout.InOut}})
	// issue 44: the wrappers' text models saved alone, one layout each and
	// fuse-shared where the family fuses (TestTextModelsSavedAlone runs more).
	for i, f := range []string{"qwen3-5-moe-text", "qwen3-vl-moe-text", "glm4v-moe-text", "qwen4-exp-text",
		"qwen3-omni-moe-thinker", "aria-text", "minimax-m3-vl-text", "glm5-next-text"} {
		cases = append(cases, conv{f, convert.Options{Layout: lays[i%3]}})
		if fx, _ := hf.Lookup(f); fx.FuseShared {
			cases = append(cases, conv{f, convert.Options{Layout: lays[(i+1)%3], FuseShared: true, TP: 2}})
		}
	}
	return cases
}

// TestConversionCasesCoverTheIndex: the suite converts every checkpoint of
// the fixtures index and names none outside it, so a new fixture (one row
// of fixtures/hf/index.go) fails here until its conversions are chosen.
func TestConversionCasesCoverTheIndex(t *testing.T) {
	in := map[string]bool{}
	for _, c := range conversionCases() {
		if _, ok := hf.Lookup(c.fixture); !ok {
			t.Errorf("conversionCases names %s, which the fixtures index does not list", c.fixture)
		}
		in[c.fixture] = true
	}
	for _, f := range hf.All() {
		if !in[f.Dir] {
			t.Errorf("fixture %s (%s) is in the index but no conversion case converts it", f.Dir, f.ModelType)
		}
	}
}

type jsonBuf []byte

func (b *jsonBuf) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
func (b jsonBuf) String() string               { return string(b) }

// checksRun counts rep's rows by check.
func checksRun(rep *Report) map[string]int {
	checks := map[string]int{}
	for _, r := range rep.Rows {
		checks[r.Check]++
	}
	return checks
}

// mustPass fails t at once, with the report's table, when rep failed.
func mustPass(t *testing.T, rep *Report, what string) {
	t.Helper()
	if rep.Failed() {
		var b jsonBuf
		rep.WriteTable(&b)
		t.Fatalf("%s:\n%s", what, b)
	}
}

// runPass runs validate with o and fails t unless it runs and passes;
// what says, on a failure, what should have passed.
func runPass(t *testing.T, o Options, what string) *Report {
	t.Helper()
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	mustPass(t, rep, what)
	return rep
}

// runFail runs validate with o and fails t unless it runs and finds DST
// wrong (exit 1, a failed check); what names the run on a failure. It
// returns the report, for the test to check what it names.
func runFail(t *testing.T, o Options, what string) *Report {
	t.Helper()
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if code := exitcode.Code(rep.Err()); code != exitcode.CheckFailed {
		t.Fatalf("%s: exit %d (%v), want %d: a failed check", what, code, rep.Err(), exitcode.CheckFailed)
	}
	return rep
}

// rewriteTensor replaces one tensor's bytes in a converted checkpoint by
// rewriting the shard that holds it (names, dtypes, shapes unchanged).
func rewriteTensor(t *testing.T, dir, name string, edit func(raw []byte, shape []int64)) {
	t.Helper()
	editTensor(t, dir, name, func(e *safetensors.Entry, raw []byte) { edit(raw, e.Shape) })
}

// renameTensor renames one tensor of a single-file checkpoint.
func renameTensor(t *testing.T, dir, name, to string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, safetensors.IndexFileName)); err == nil {
		t.Fatalf("%s is sharded: renameTensor rewrites one file only", dir)
	}
	editTensor(t, dir, name, func(e *safetensors.Entry, _ []byte) { e.Name = to })
}

// editTensor rewrites the shard that holds tensor name, handing edit its
// entry (to rename it) and its bytes (to change them).
func editTensor(t *testing.T, dir, name string, edit func(e *safetensors.Entry, raw []byte)) {
	t.Helper()
	shard := "model.safetensors"
	if idx, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexFileName)); err == nil {
		var ok bool
		if shard, ok = idx.WeightMap[name]; !ok {
			t.Fatalf("%s not in the index", name)
		}
	}
	path := filepath.Join(dir, shard)
	meta, entries, raws := readShard(t, path)
	found := false
	for i := range entries {
		if entries[i].Name == name {
			edit(&entries[i], raws[i])
			found = true
		}
	}
	if !found {
		t.Fatalf("%s: no tensor %s", path, name)
	}
	writeShard(t, path, meta, entries)
}

// readShard reads the safetensors file at path whole, for a test to edit
// and write again (writeShard): its metadata, and an entry a tensor in the
// file's order, each serving its bytes, raws[i] (an edit of them shows).
func readShard(t *testing.T, path string) (meta map[string]string, entries []safetensors.Entry, raws [][]byte) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, ti := range f.Tensors {
		sec, err := f.Section(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(sec)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, memEntry(ti.Name, ti.DType, ti.Shape, raw))
		raws = append(raws, raw)
	}
	return f.Metadata, entries, raws
}

// writeShard writes entries, with meta, as the safetensors file path.
func writeShard(t *testing.T, path string, meta map[string]string, entries []safetensors.Entry) {
	t.Helper()
	if _, err := safetensors.WriteFile(context.Background(), path, meta, entries, nil); err != nil {
		t.Fatal(err)
	}
}

// memEntry is a safetensors entry of tensor name that writes b.
func memEntry(name string, dt safetensors.DType, shape []int64, b []byte) safetensors.Entry {
	return safetensors.Entry{Name: name, DType: dt, Shape: shape, Open: func() (io.Reader, error) { return bytes.NewReader(b), nil }}
}

// editContract rewrites DST/config.json's moeprep object.
func editContract(t *testing.T, dir string, edit func(c map[string]any)) {
	t.Helper()
	testkit.EditJSON(t, filepath.Join(dir, "config.json"), func(cfg map[string]any) { edit(cfg["moeprep"].(map[string]any)) })
}

// slice returns expert e's part of a stacked [N,...] tensor's bytes.
func slice(raw []byte, shape []int64, e int) []byte {
	per := len(raw) / int(shape[0])
	return raw[e*per : (e+1)*per]
}

// swapRowScales swaps the first two scale entries of a row in e, an
// expert's scale grid of cols entries a row: of row r, or of the first row
// after it whose two differ (a swap of equal entries changes nothing).
func swapRowScales(e []byte, cols, r int) {
	for ; ; r++ {
		if e[r*cols] != e[r*cols+1] {
			e[r*cols], e[r*cols+1] = e[r*cols+1], e[r*cols]
			return
		}
	}
}

// scaleBF16 multiplies every bf16 of b by f, each rounded back to bf16.
func scaleBF16(b []byte, f float32) {
	for i := 0; i+2 <= len(b); i += 2 {
		v := numfmt.BF16ToF32(binary.LittleEndian.Uint16(b[i:]))
		binary.LittleEndian.PutUint16(b[i:], numfmt.F32ToBF16(v*f))
	}
}

func scaleF32(b []byte, f float64) {
	for i := 0; i+4 <= len(b); i += 4 {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(float64(v)*f)))
	}
}

// swapIn swaps expert a's and b's slices of one stacked tensor.
func swapIn(t *testing.T, dir, name string, a, b int) {
	rewriteTensor(t, dir, name, func(raw []byte, shape []int64) {
		x, y := slice(raw, shape, a), slice(raw, shape, b)
		tmp := append([]byte(nil), x...)
		copy(x, y)
		copy(y, tmp)
	})
}

// gateUpSwapped swaps expert e's gate and up projections (and their FP8
// scales, where n names them) in a stacked DST.
func gateUpSwapped(n layout.ExpertTensors, e int) func(t *testing.T, dst string) {
	return func(t *testing.T, dst string) {
		pairs := [][2]string{{n.Weight(layout.ProjGate), n.Weight(layout.ProjUp)}}
		if n.Get(layout.ProjGate, layout.RoleScale) != "" {
			pairs = append(pairs, [2]string{n.Get(layout.ProjGate, layout.RoleScale), n.Get(layout.ProjUp, layout.RoleScale)})
		}
		for _, p := range pairs {
			a, b := readTensor(t, dst, p[0]), readTensor(t, dst, p[1])
			rewriteTensor(t, dst, p[0], func(raw []byte, shape []int64) { copy(slice(raw, shape, e), slice(b, shape, e)) })
			rewriteTensor(t, dst, p[1], func(raw []byte, shape []int64) { copy(slice(raw, shape, e), slice(a, shape, e)) })
		}
	}
}

// expertsSwapped swaps experts a and b of layer 1 in a gate-up DST.
func expertsSwapped(a, b int) func(t *testing.T, dst string) {
	return func(t *testing.T, dst string) {
		n := layout.Names(layout.GateUp, "model.layers.1.mlp", false)
		swapIn(t, dst, n.Weight(layout.ProjGateUp), a, b)
		swapIn(t, dst, n.Weight(layout.ProjDown), a, b)
	}
}

// TestMutationSuite: from a correct fused checkpoint, each mutation makes
// validate fail (exit 1) with an error at least 10x its threshold.
func TestMutationSuite(t *testing.T) {
	for _, tt := range mutations(t) {
		t.Run(tt.name, func(t *testing.T) { runMutation(t, tt, Options{}, 10) })
	}
}

// mutation is one planted conversion error.
type mutation struct {
	name    string
	src     string
	o       convert.Options
	mutate  func(t *testing.T, dst string)
	minRows int // rows that must fail
}

// runMutation converts, checks the clean conversion passes with base's
// device options, mutates, and checks the run fails (exit 1) with the worst
// failing row at least minFactor x its threshold.
func runMutation(t *testing.T, tt mutation, base Options, minFactor float64) {
	const layer = 1
	dst := convertInto(t, tt.src, tt.o)
	opts := base
	opts.Src, opts.Dst, opts.Layers, opts.Seed = tt.src, dst, fmt.Sprint(layer), 3
	clean, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if clean.Failed() {
		t.Fatalf("the unmutated conversion fails: %v", clean.Err())
	}
	tt.mutate(t, dst)
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("mutation made the input unusable instead of failing the check: %v", err)
	}
	if !rep.Failed() || exitcode.Code(rep.Err()) != exitcode.CheckFailed {
		t.Fatalf("mutation not caught: %+v", rep.Rows)
	}
	failed := 0
	var worst *LayerResult
	for i := range rep.Rows {
		r := &rep.Rows[i]
		if r.Pass {
			continue
		}
		failed++
		if worst == nil || r.RelL2/r.Tolerance.MaxRelL2 > worst.RelL2/worst.Tolerance.MaxRelL2 {
			worst = r
		}
	}
	if failed < tt.minRows {
		t.Fatalf("%d rows failed, want >= %d", failed, tt.minRows)
	}
	r := worst
	if !(r.RelL2 >= minFactor*r.Tolerance.MaxRelL2) {
		t.Fatalf("%s: rel_l2 %.3g is less than %gx the %s threshold %.3g", r.Check, r.RelL2, minFactor, r.Tolerance.Name, r.Tolerance.MaxRelL2)
	}
	t.Logf("caught (%s, device %s %s): rel_l2 %.3g (%.0fx the %s threshold), topk %.4f: %s", r.Check, rep.Device, rep.GPUPrecision, r.RelL2, r.RelL2/r.Tolerance.MaxRelL2, r.Tolerance.Name, r.TopK, r.Reason)
}

func mutations(t *testing.T) []mutation {
	fp8 := filepath.Join(hfFixtures, "deepseek-v3-fp8") // DeepSeek-like biases (offset 1.0, spread 0.005)
	bf16 := filepath.Join(hfFixtures, "deepseek-v3-bf16")
	stacked := func(fp bool) layout.ExpertTensors { return layout.Names(layout.Stacked, "model.layers.1.mlp", fp) }
	square := squareFixture(t)
	afm := filepath.Join(hfFixtures, "afmoe")
	ernie := filepath.Join(hfFixtures, "ernie4-5-moe")
	granite := filepath.Join(hfFixtures, "granitemoeshared")
	llama4 := filepath.Join(hfFixtures, "llama4-text")
	gptoss := filepath.Join(hfFixtures, "gpt-oss")
	dsv4 := filepath.Join(hfFixtures, "deepseek-v4")
	ernieBias := filepath.Join(hfFixtures, "ernie4-5-moe-bias")
	inkling := filepath.Join(hfFixtures, "inkling-text")
	inklingHub := filepath.Join(hfFixtures, "inkling-mm-model")
	return []mutation{
		{"gate and up swapped in one expert", fp8, convert.Options{FuseShared: true, TP: 1}, gateUpSwapped(stacked(true), 3), 1},
		{"two experts swapped", bf16, convert.Options{FuseShared: true, TP: 4, Layout: layout.GateUp}, expertsSwapped(2, 5), 1},
		{"rsf folded twice", fp8, convert.Options{FuseShared: true, TP: 2}, func(t *testing.T, dst string) {
			n := stacked(true)
			rewriteTensor(t, dst, n.Get(layout.ProjDown, layout.RoleScale), func(raw []byte, shape []int64) {
				scaleF32(raw[:len(raw)/int(shape[0])*16], 2.5) // the 16 routed experts only
			})
		}, 1},
		{"rsf neither folded nor applied", bf16, convert.Options{FuseShared: true, TP: 1, FoldScaling: "none"}, func(t *testing.T, dst string) {
			editContract(t, dst, func(c map[string]any) {
				c["routed_scaling_factor_folded"] = true // claims folded; weights were not
				c["shared_slot_weight"] = 1.0
			})
		}, 1},
		{"one shared replica zeroed", bf16, convert.Options{FuseShared: true, TP: 4, Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.Names(layout.UpGate, "model.layers.1.mlp", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) { clear(slice(raw, shape, 16+2)) })
		}, 1},
		{"correction bias rounded to bf16", fp8, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.mlp.gate.e_score_correction_bias", roundF32ToBF16)
		}, 1},
		{"one wrong fp8 scale block", fp8, convert.Options{FuseShared: true, TP: 1, Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.Names(layout.GateUp, "model.layers.1.mlp", true)
			rewriteTensor(t, dst, n.Get(layout.ProjGateUp, layout.RoleScale), func(raw []byte, shape []int64) {
				scaleF32(slice(raw, shape, 7)[4:8], 3) // expert 7, block (0,1)
			})
		}, 1},
		// Fused families other than DeepSeek (issue 11): AFMoE (sigmoid +
		// expert_bias, route_scale 1.5, two shared experts) and ERNIE 4.5
		// (softmax ranked with a correction bias).
		{"afmoe: two experts swapped", afm, convert.Options{FuseShared: true, TP: 2, Layout: layout.GateUp}, expertsSwapped(1, 6), 1},
		{"afmoe: one shared replica zeroed", afm, convert.Options{FuseShared: true, TP: 4}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, stacked(false).Weight(layout.ProjDown), func(raw []byte, shape []int64) { clear(slice(raw, shape, 8+3)) })
		}, 1},
		{"afmoe: expert_bias rounded to bf16", afm, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.mlp.expert_bias", roundF32ToBF16)
		}, 1},
		{"afmoe: route_scale folded twice", afm, convert.Options{FuseShared: true, TP: 1, FoldScaling: "down"}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, stacked(false).Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				m := raw[:len(raw)/int(shape[0])*8] // the 8 routed experts only
				scaleBF16(m, 1.5)
			})
		}, 1},
		{"ernie 4.5: gate and up swapped in one expert", ernie, convert.Options{FuseShared: true, TP: 1}, gateUpSwapped(stacked(false), 5), 1},
		{"ernie 4.5: correction bias dropped to zero", ernie, convert.Options{FuseShared: true, TP: 2, Layout: layout.UpGate}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.mlp.moe_statics.e_score_correction_bias", func(raw []byte, _ []int64) { clear(raw) })
		}, 1},
		// Experts stacked on disk (Granite MoE, read through views).
		{"granite: one routed expert's up rows taken from its neighbour", granite, convert.Options{FuseShared: true, TP: 2, Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.Names(layout.UpGate, "model.layers.1.block_sparse_moe", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjGateUp), func(raw []byte, shape []int64) {
				half := len(slice(raw, shape, 0)) / 2
				copy(slice(raw, shape, 4)[:half], slice(raw, shape, 5)[:half]) // up-gate: the first half is up
			})
		}, 1},
		{"granite: the shared MLP's slice swapped with a routed expert", granite, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := layout.Names(layout.Stacked, "model.layers.1.block_sparse_moe", false)
			swapIn(t, dst, n.Weight(layout.ProjDown), 2, 8)
		}, 1},
		// Llama 4: stacked and transposed on disk, input-scaled routing.
		{"llama4: gate and up swapped in one expert", llama4, convert.Options{}, gateUpSwapped(layout.Names(layout.Stacked, "model.layers.1.feed_forward", false), 5), 1},
		{"llama4: one expert's down projection from its neighbour", llama4, convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			n := layout.Names(layout.UpGate, "model.layers.1.feed_forward", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) { copy(slice(raw, shape, 2), slice(raw, shape, 3)) })
		}, 1},
		// gpt-oss: the biases are stacked too.
		{"gpt-oss: gate and up biases swapped in one expert", gptoss, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			b := layout.BiasNames(layout.GateUp, "model.layers.1.mlp")
			rewriteTensor(t, dst, b.GateUp, func(raw []byte, shape []int64) {
				e := slice(raw, shape, 3)
				half := len(e) / 2
				tmp := append([]byte(nil), e[:half]...)
				copy(e[:half], e[half:])
				copy(e[half:], tmp)
			})
		}, 1},
		{"gpt-oss: one expert's down bias zeroed", gptoss, convert.Options{}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, layout.BiasNames(layout.Stacked, "model.layers.1.mlp").Down, func(raw []byte, shape []int64) { clear(slice(raw, shape, 6)) })
		}, 1},
		// DeepSeek-V4: an expert only the hash table reaches is still proven.
		{"deepseek-v4: hash layer's expert gate from its neighbour", dsv4, convert.Options{FuseShared: true, TP: 2}, func(t *testing.T, dst string) {
			n := layout.Names(layout.Stacked, "model.layers.1.ffn", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjGate), func(raw []byte, shape []int64) { copy(slice(raw, shape, 6), slice(raw, shape, 7)) })
		}, 1},
		{"deepseek-v4: a token's hash table row changed", dsv4, convert.Options{}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.ffn.gate.tid2eid", func(raw []byte, shape []int64) {
				for i := range int(shape[0]) { // every token's first expert moved by one
					raw[8*i*int(shape[1])] = (raw[8*i*int(shape[1])] + 1) % 8
				}
			})
		}, 1},
		{"ernie use_bias: the shared expert's down bias zeroed", ernieBias, convert.Options{}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.mlp.shared_experts.down_proj.bias", func(raw []byte, _ []int64) { clear(raw) })
		}, 1},
		// Inkling: experts stacked on disk, shared experts the router weights.
		{"inkling: one routed expert's down projection from its neighbour", inkling, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.Names(layout.GateUp, "model.layers.1.mlp", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) { copy(slice(raw, shape, 3), slice(raw, shape, 4)) })
		}, 1},
		{"inkling: the two shared experts' down projections swapped", inkling, convert.Options{}, func(t *testing.T, dst string) {
			swapIn(t, dst, "model.layers.1.mlp.shared_experts.down_proj", 0, 1)
		}, 1},
		{"inkling: global_scale reset to 1", inkling, convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.layers.1.mlp.gate.global_scale", func(raw []byte, _ []int64) {
				binary.LittleEndian.PutUint16(raw, numfmt.F32ToBF16(1))
			})
		}, 1},
		// Inkling in the hub's layout: gate and up interleaved in w13_weight
		// (gate the even rows, up the odd), routed and shared alike.
		{"inkling hub: gate and up swapped in one expert (odd rows read as the gate)", inklingHub, convert.Options{},
			gateUpSwapped(layout.Names(layout.Stacked, "model.llm.layers.1.mlp", false), 5), 1},
		{"inkling hub: one expert's gate-up left interleaved as stored", inklingHub, convert.Options{Layout: layout.GateUp}, func(t *testing.T, dst string) {
			n := layout.Names(layout.GateUp, "model.llm.layers.1.mlp", false)
			rewriteTensor(t, dst, n.Weight(layout.ProjGateUp), func(raw []byte, shape []int64) {
				e := slice(raw, shape, 2) // [2I, H]: gate rows, then up rows
				row := len(e) / int(shape[1])
				halves := append([]byte(nil), e...)
				inter := int(shape[1]) / 2
				for j := range inter {
					copy(e[2*j*row:(2*j+1)*row], halves[j*row:(j+1)*row])
					copy(e[(2*j+1)*row:(2*j+2)*row], halves[(inter+j)*row:(inter+j+1)*row])
				}
			})
		}, 1},
		{"inkling hub: one shared expert's gate and up rows swapped", inklingHub, convert.Options{Layout: layout.UpGate}, func(t *testing.T, dst string) {
			rewriteTensor(t, dst, "model.llm.layers.1.mlp.shared_experts.shared_w13_weight", func(raw []byte, shape []int64) {
				e := slice(raw, shape, 1) // [2I, H], gate and up rows interleaved
				row := len(e) / int(shape[1])
				for r := 0; r+1 < int(shape[1]); r += 2 {
					a, b := e[r*row:(r+1)*row], e[(r+1)*row:(r+2)*row]
					tmp := append([]byte(nil), a...)
					copy(a, b)
					copy(b, tmp)
				}
			})
		}, 1},
		{"down projection transposed where square", square, convert.Options{FuseShared: true, TP: 1}, func(t *testing.T, dst string) {
			n := stacked(false)
			rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
				d := int(shape[1])
				m := slice(raw, shape, 1)
				for r := range d {
					for c := r + 1; c < d; c++ {
						i, j := 2*(r*d+c), 2*(c*d+r)
						m[i], m[i+1], m[j], m[j+1] = m[j], m[j+1], m[i], m[i+1]
					}
				}
			})
		}, 1},
	}
}

func readTensor(t *testing.T, dir, name string) []byte {
	t.Helper()
	var out []byte
	rewriteTensor(t, dir, name, func(raw []byte, _ []int64) { out = append([]byte(nil), raw...) })
	return out
}

// squareFixture synthesises a DeepSeek-V3-style bf16 checkpoint with H == I,
// where a transposed down projection has the right shape.
func squareFixture(t *testing.T) string {
	t.Helper()
	return cktest.WriteSpec(t, filepath.Join(t.TempDir(), "square"), fixtures.SynthSpec{Family: "deepseek_v3", Layers: 2, DenseLayers: 1, Hidden: 64, Intermediate: 64,
		Experts: 8, SharedExperts: 1, TopK: 2, NGroup: 2, TopKGroup: 1, DType: "bf16", Seed: 21})
}

// roundF32ToBF16 rounds every f32 of a tensor to bf16 precision in place:
// a correction bias saved at the wrong precision.
func roundF32ToBF16(raw []byte, _ []int64) {
	for i := 0; i+4 <= len(raw); i += 4 {
		v := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
		binary.LittleEndian.PutUint32(raw[i:], math.Float32bits(numfmt.RoundBF16(v)))
	}
}
