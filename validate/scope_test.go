package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/judge"
)

// threeLayers synthesises a DeepSeek-V3-style bf16 model with three MoE
// layers (1, 2, 3; 16 experts, top-4, one shared expert) and its
// fuse-shared --tp 2 output (a bank of 18 experts per layer).
func threeLayers(t *testing.T) (src, dst string) {
	t.Helper()
	src = cktest.WriteSpec(t, filepath.Join(t.TempDir(), "src"), fixtures.SynthSpec{Family: "deepseek_v3", Layers: 4, DenseLayers: 1, Hidden: 64, Intermediate: 32,
		Experts: 16, SharedExperts: 1, TopK: 4, NGroup: 4, TopKGroup: 2, RoutedScalingFactor: 2.5, DType: "bf16", Seed: 43})
	return src, convertInto(t, src, convert.Options{FuseShared: true, TP: 2})
}

// TestSampledRunSaysWhatItSkipped: with --layers sample:2 of three layers
// and --sample-experts, the table, the summary line and the JSON name the
// layer not checked and, per checked layer, the experts not exercised; a
// full run's summary claims every layer and expert, and lists nothing.
func TestSampledRunSaysWhatItSkipped(t *testing.T) {
	src, dst := threeLayers(t)
	base := Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 3, Tokens: 16}

	tests := []struct {
		name          string
		layers        string
		sample        int
		checked, skip []int
		summary       []string // the summary line holds each
		notInSummary  []string
		tableRow      string // a line of the table starting so
		gapLayers     []int
	}{
		{name: "every layer, every expert", layers: "all", checked: []int{1, 2, 3},
			summary:      []string{"7/7 checks passed", "(cpu): all 3 MoE layers; every expert; DST's bytes proven against SRC"},
			notInSummary: []string{"not checked", "sample"}},
		{name: "sampled layers", layers: "sample:2", checked: []int{1, 3}, skip: []int{2},
			summary:      []string{"5/5 checks passed", "2 of 3 MoE layers (not checked: 2); every expert;"},
			notInSummary: []string{"all 3"},
			tableRow:     "2      not checked         -        -       -          -          -           -       left out"},
		{name: "a list of layers", layers: "2", checked: []int{2}, skip: []int{1, 3},
			summary:  []string{"1 of 3 MoE layers (not checked: 1, 3)"},
			tableRow: "3      not checked         -        -       -          -          -           -       left out"},
		{name: "sampled experts", layers: "all", sample: 4, checked: []int{1, 2, 3}, gapLayers: []int{1, 2, 3},
			summary:      []string{"all 3 MoE layers; sampled experts; "},
			notInSummary: []string{"every expert"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			o.Layers, o.SampleExperts = tt.layers, tt.sample
			rep, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Failed() {
				t.Fatalf("clean conversion failed: %v", rep.Err())
			}
			if !slices.Equal(rep.MoELayers, []int{1, 2, 3}) || !slices.Equal(rep.LayersChecked, tt.checked) || !slices.Equal(rep.LayersNotChecked, tt.skip) {
				t.Errorf("layers %v, checked %v, not checked %v; want checked %v, not %v", rep.MoELayers, rep.LayersChecked, rep.LayersNotChecked, tt.checked, tt.skip)
			}
			sum := rep.Summary()
			for _, s := range tt.summary {
				if !strings.Contains(sum, s) {
					t.Errorf("summary lacks %q: %s", s, sum)
				}
			}
			for _, s := range tt.notInSummary {
				if strings.Contains(sum, s) {
					t.Errorf("summary claims %q: %s", s, sum)
				}
			}
			var tb jsonBuf
			if err := rep.WriteTable(&tb); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(tb.String()), "\n")
			for _, l := range lines {
				if n := utf8.RuneCountInString(l); n > lineWidth {
					t.Errorf("a table line of %d columns: %s", n, l)
				}
			}
			if lines[len(lines)-1] != sum {
				t.Errorf("the table does not end in the summary:\n%s", tb)
			}
			if tt.tableRow != "" && !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, tt.tableRow) }) {
				t.Errorf("no table line %q:\n%s", tt.tableRow, tb)
			}
			var gapLayers []int
			for _, g := range rep.ExpertGaps {
				gapLayers = append(gapLayers, g.Layer)
				if !g.Forced || g.Total != 18 || len(g.NotExercised) != g.Total-g.Exercised {
					t.Errorf("layer %d: %+v, want the forced tokens' gap named in full", g.Layer, g)
				}
				want := fmt.Sprintf("  layer %d: %d of 18 bank experts not exercised: ", g.Layer, g.Total-g.Exercised)
				if !strings.Contains(tb.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, tb)
				}
			}
			if !slices.Equal(gapLayers, tt.gapLayers) {
				t.Errorf("gaps in layers %v, want %v", gapLayers, tt.gapLayers)
			}

			var jb jsonBuf
			if err := rep.WriteJSON(&jb); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(jb.String(), "{\n  \"schema\": \""+Schema+"\",") {
				t.Errorf("JSON does not start with the schema: %.80s", jb)
			}
			var doc struct {
				Mode       string  `json:"mode"`
				NotChecked []int   `json:"layers_not_checked"`
				Gaps       []any   `json:"experts_not_exercised"`
				Summary    *string `json:"summary"`
			}
			if err := json.Unmarshal(jb, &doc); err != nil {
				t.Fatal(err)
			}
			if doc.NotChecked == nil || !slices.Equal(doc.NotChecked, nonNil(tt.skip)) || doc.Gaps == nil || len(doc.Gaps) != len(tt.gapLayers) ||
				doc.Mode != ModeLayersBytes || doc.Summary == nil || *doc.Summary != sum {
				t.Errorf("JSON: mode %q, layers_not_checked %v, experts_not_exercised %v, summary %v", doc.Mode, doc.NotChecked, doc.Gaps, doc.Summary)
			}
		})
	}
}

// The experts a sampled run names as not exercised are exactly those the
// forced tokens miss: corrupting one of them leaves the coverage row
// passing, corrupting any other fails it with that expert named.
func TestNotExercisedExpertsAreTheUncheckedOnes(t *testing.T) {
	src, dst := threeLayers(t)
	o := Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 3, Tokens: 16, Layers: "1", SampleExperts: 3, Bytes: BytesOff}
	rep, err := Run(context.Background(), o)
	if err != nil || rep.Failed() || len(rep.ExpertGaps) != 1 {
		t.Fatalf("clean: %v, %+v", err, rep.ExpertGaps)
	}
	missed := rep.ExpertGaps[0].NotExercised
	if len(missed) == 0 || len(missed) == 18 {
		t.Fatalf("not exercised %v: want a proper part of the bank", missed)
	}
	covered := -1
	for e := range 18 {
		if !slices.Contains(missed, e) {
			covered = e
			break
		}
	}
	for _, tc := range []struct {
		expert   int
		wantPass bool
	}{{missed[0], true}, {missed[len(missed)-1], true}, {covered, false}} {
		t.Run(fmt.Sprint("expert ", tc.expert), func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "dst")
			testkit.CopyDir(t, dst, bad)
			flipDownSigns(t, bad, "model.layers.1.mlp", layout.Stacked, tc.expert)
			o := o
			o.Dst = bad
			rep, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Rows {
				if r.Check != judge.Coverage {
					continue
				}
				if r.Pass != tc.wantPass || (!tc.wantPass && !slices.Contains(r.Suspects, tc.expert)) {
					t.Errorf("coverage row: pass %v (want %v), suspects %v", r.Pass, tc.wantPass, r.Suspects)
				}
			}
		})
	}
}

// --bytes needs no GPU: --device cuda on a machine without one runs it,
// nothing announces a CPU fallback, and the report is the byte proof's
// alone: no check table, no device or block size, no layer-check settings
// in the JSON.
func TestBytesOnlyReport(t *testing.T) {
	withCUDA(t, cuda.ErrNoDriver)
	src, dst := threeLayers(t)
	for _, device := range []Device{"cuda", "auto", "cpu", ""} {
		var said []string
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly, Device: device,
			Notice: func(m string) { said = append(said, m) }, Progress: func(m string) { said = append(said, m) }})
		if err != nil {
			t.Fatalf("--device %q --bytes: %v", device, err)
		}
		for _, m := range said {
			if strings.Contains(m, "CPU") || strings.Contains(m, "CUDA") {
				t.Errorf("--device %q --bytes said %q", device, m)
			}
		}
		var tb jsonBuf
		if err := rep.WriteTable(&tb); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(tb.String()), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "bytes: PASS: ") ||
			!strings.HasPrefix(lines[1], "1/1 checks passed in ") || !strings.HasSuffix(lines[1], "s: DST's bytes proven against SRC and the contract; no MoE layer was run") {
			t.Errorf("--device %q --bytes table:\n%s", device, tb)
		}
		var doc map[string]any
		var jb jsonBuf
		rep.WriteJSON(&jb)
		if err := json.Unmarshal(jb, &doc); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"tokens", "seed", "block_size", "x_draw", "layers", "layers_not_checked", "experts_not_exercised"} {
			if _, ok := doc[k]; ok {
				t.Errorf("bytes-only JSON has %q", k)
			}
		}
		if doc["mode"] != ModeBytes || doc["device"] != "none" || doc["schema"] != Schema {
			t.Errorf("bytes-only JSON: mode %v device %v schema %v", doc["mode"], doc["device"], doc["schema"])
		}
	}
	if _, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly, Device: "tpu"}); err == nil || !strings.Contains(err.Error(), `unknown --device "tpu"`) {
		t.Errorf("--device tpu --bytes: %v", err)
	}
}

// --device auto falling back to the CPU says in the report that a GPU
// precision asked for did not apply.
func TestFallbackNotesPrecision(t *testing.T) {
	withCUDA(t, cuda.ErrNoDriver)
	src := filepath.Join(hfFixtures, "qwen3-moe")
	for _, tc := range []struct {
		precision Precision
		note      bool
	}{{"fp8", true}, {"f32", true}, {"bf16", false}, {"", false}} {
		rep, err := Run(context.Background(), Options{Src: src, Golden: src, Device: "auto", GPUPrecision: tc.precision, Layers: "sample:1", Notice: func(string) {}})
		if err != nil {
			t.Fatal(err)
		}
		has := slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "GPU precision") && strings.Contains(n, "not applied") })
		if has != tc.note {
			t.Errorf("--precision %q on the CPU fallback: notes %q", tc.precision, rep.Notes)
		}
	}
}

// recorder is a Reporter that keeps everything it is told.
type recorder struct {
	mu     sync.Mutex
	totals []int64
	done   int64
	adds   int
	stages []string
	// doneAt is the count when each stage was first set.
	doneAt map[string]int64
}

func (r *recorder) Total(n int64) { r.mu.Lock(); r.totals = append(r.totals, n); r.mu.Unlock() }
func (r *recorder) Add(n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n <= 0 {
		panic(fmt.Sprintf("Add(%d)", n))
	}
	r.done += n
	r.adds++
}
func (r *recorder) Stage(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.doneAt == nil {
		r.doneAt = map[string]int64{}
	}
	if _, ok := r.doneAt[s]; !ok {
		r.doneAt[s] = r.done
	}
	r.stages = append(r.stages, s)
}

// shardBytes sums the sizes of a checkpoint's weight files.
func shardBytes(t *testing.T, dir string) int64 {
	t.Helper()
	c := cktest.Open(t, dir)
	var n int64
	for _, f := range c.WeightFiles {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// moduleBytes sums the sizes of a checkpoint's tensors under prefix.
func moduleBytes(t *testing.T, dir, prefix string) int64 {
	t.Helper()
	c := cktest.Open(t, dir)
	var n int64
	for _, tn := range c.Tensors {
		if strings.HasPrefix(tn.Name, prefix) {
			n += tn.NumBytes()
		}
	}
	return n
}

// The byte progress of a CPU run, one streamed pass (pass.go): its total
// is what the pass reads, every byte of DST's shards and of the SRC
// tensors once; the count grows while each layer is read and reaches the
// total at the end; the stages name the layer checked, its place in the
// run and that SRC and DST are read side by side, then the byte proof.
func TestByteProgress(t *testing.T) {
	src, dst := threeLayers(t)
	var r recorder
	var lines []string
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 3, Tokens: 16, Layers: "sample:2",
		ByteProgress: &r, Progress: func(m string) { lines = append(lines, m) }})
	if err != nil || rep.Failed() {
		t.Fatalf("%v %v", err, rep.Err())
	}
	once := moduleBytes(t, src, "") + shardBytes(t, dst)
	if len(r.totals) != 1 || r.totals[0] < once || float64(r.totals[0]) > 1.02*float64(once) {
		t.Fatalf("totals %v, want one of about %d (every shard byte of DST and every SRC tensor byte, once)", r.totals, once)
	}
	if r.done != r.totals[0] {
		t.Errorf("counted %d of %d at the end", r.done, r.totals[0])
	}
	var seq []string
	for _, st := range r.stages {
		if len(seq) == 0 || seq[len(seq)-1] != st {
			seq = append(seq, st)
		}
	}
	// The pass's reader may deliver layer 1's bytes before its check
	// starts (a loaded machine schedules it first): the bare "layer 1 (1 of
	// 2)" then never shows, as the run's work is already reading it.
	if len(seq) > 0 && seq[0] == "layer 1 (1 of 2)" {
		seq = seq[1:]
	}
	want := []string{"layer 1 (1 of 2) reading SRC and DST experts", "layer 3 (2 of 2)"}
	if len(seq) < len(want) || !slices.Equal(seq[:len(want)], want) {
		t.Errorf("stages %q, want them to start %q", seq, want)
	}
	proofStage := slices.IndexFunc(r.stages, func(s string) bool { return strings.HasPrefix(s, "byte proof, comparing DST with SRC") })
	if proofStage < slices.Index(r.stages, "layer 3 (2 of 2)") {
		t.Errorf("byte proof stage %d of %q: not after the layers", proofStage, r.stages)
	}
	if slices.ContainsFunc(r.stages, func(s string) bool { return strings.HasPrefix(s, "layer 2") }) {
		t.Errorf("a layer not checked shows in the stages: %q", r.stages)
	}
	if d := r.doneAt["layer 1 (1 of 2) reading SRC and DST experts"]; d <= 0 {
		t.Errorf("nothing counted while layer 1 was read")
	}
	if d := r.doneAt["layer 3 (2 of 2)"]; d <= 0 || d >= r.totals[0] || r.adds < 10 {
		t.Errorf("layer 1 done at %d of %d, %d adds: the count should grow as bytes are read", d, r.totals[0], r.adds)
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "validate --bytes: ") }) {
		t.Errorf("per-shard lines beside the byte reporter: %q", lines)
	}

	// The byte proof alone is the same streamed pass with no layers: its
	// total is what it reads, every byte of DST's shards and the SRC bytes
	// that predict them, once: no more than the run above, which also reads
	// what only the layer checks use.
	var b recorder
	lines = nil
	if _, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly, ByteProgress: &b, Progress: func(m string) { lines = append(lines, m) }}); err != nil {
		t.Fatal(err)
	}
	if dstBytes := shardBytes(t, dst); len(b.totals) != 1 || b.totals[0] <= dstBytes || b.totals[0] > r.totals[0] || b.done != b.totals[0] {
		t.Errorf("--bytes: totals %v, counted %d, want one over DST's %d and at most the layer run's %d", b.totals, b.done, dstBytes, r.totals[0])
	}
	if len(b.stages) == 0 || !strings.HasPrefix(b.stages[0], "byte proof, comparing DST with SRC") {
		t.Errorf("--bytes stages %q", b.stages)
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "validate --bytes: ") }) {
		t.Errorf("per-shard lines beside the byte reporter: %q", lines)
	}
	// A DST stored as SRC stores its experts (layout as-stored) is proven
	// by CheckBytes' own pass: without a byte reporter, library users get
	// its line per shard.
	stored := filepath.Join(hfFixtures, "gpt-oss")
	asStored := convertInto(t, stored, convert.Options{Layout: layout.Transformers})
	lines = nil
	if _, err := Run(context.Background(), Options{Src: stored, Dst: asStored, Bytes: BytesOnly, Progress: func(m string) { lines = append(lines, m) }}); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "validate --bytes: model") }) {
		t.Errorf("no line per shard without a byte reporter: %q", lines)
	}
}

// The plan of each layer's bytes is what the layer checks read when every
// expert is exercised: so the count moves with the reads and the jump a
// finished layer makes to its plan is not needed. Families whose experts
// are views (Granite's stacks, Llama 4's transposed ones, gpt-oss's
// interleaved columns and biases) and FP8 scales included.
func TestProgressPlanMatchesReads(t *testing.T) {
	cases := []struct {
		fixture string
		o       convert.Options
	}{
		{"deepseek-v3-fp8", convert.Options{FuseShared: true, TP: 2}},
		{"granitemoeshared", convert.Options{Layout: layout.GateUp}},
		{"llama4-text", convert.Options{}},
		{"gpt-oss", convert.Options{Layout: layout.UpGate}},
		{"qwen2-moe", convert.Options{}},
	}
	for _, c := range cases {
		t.Run(c.fixture, func(t *testing.T) {
			checkPlanMatchesReads(t, c.fixture, c.o, DeviceCPU, func(s *session, targets []target) error {
				for _, tg := range targets {
					if _, err := s.checkLayer(context.Background(), tg); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// checkPlanMatchesReads converts the HF fixture with co, plans the layer
// checks' progress on device, runs them (run), and checks that every layer
// read what was planned for it, within 5%.
func checkPlanMatchesReads(t *testing.T, fixture string, co convert.Options, device Device, run func(s *session, targets []target) error) {
	t.Helper()
	src := filepath.Join(hfFixtures, fixture)
	dst := convertInto(t, src, co)
	var r recorder
	s := &session{o: Options{Src: src, Dst: dst, Device: device, Seed: 1, Tokens: 8, Bytes: BytesOff, ByteProgress: &r}, meter: newMeter(&r)}
	targets := openSession(t, s)
	s.planProgress(targets, false)
	if err := run(s, targets); err != nil {
		t.Fatal(err)
	}
	for _, l := range s.meter.layers {
		t.Logf("layer %d: planned %d, read %d", l.index, l.planned, l.read)
		if l.planned == 0 || l.read < l.planned || float64(l.read) > 1.05*float64(l.planned) {
			t.Errorf("layer %d: planned %d bytes, read %d", l.index, l.planned, l.read)
		}
	}
}

// On the GPU the plan holds too: the fused bank read whole, SRC's experts
// once for the GPU's unfused path and again for the CPU reference on the
// layers it checks (every layer of these fixtures, --cpu-check auto).
func TestGPUProgressPlanMatchesReads(t *testing.T) {
	needGPU(t)
	for _, c := range []struct {
		fixture string
		o       convert.Options
	}{
		{"deepseek-v3-fp8", convert.Options{FuseShared: true, TP: 2}},
		{"gpt-oss", convert.Options{Layout: layout.UpGate}},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			checkPlanMatchesReads(t, c.fixture, c.o, DeviceCUDA, func(s *session, targets []target) error {
				return s.runGPU(context.Background(), targets, &Report{})
			})
		})
	}
}

// The meter on its own, in the order a GPU run reads: the first bank
// before its layer starts, the next layer's bank during this one, reads
// past a layer's plan (the CPU reference again), a layer that reads less
// than planned, then the byte proof.
func TestMeterAccounting(t *testing.T) {
	var r recorder
	m := newMeter(&r)
	m.plan([]meterLayer{{index: 3, planned: 100}, {index: 7, mtp: true, planned: 50}}, 40)
	steps := []struct {
		do        func()
		done      int64
		stage     string
		wantTotal int64
	}{
		{func() { m.read(sideDST, 3, 3, 30) }, 30, "layer 3 (1 of 2) reading DST experts", 190},
		{func() { m.startLayer(3) }, 30, "layer 3 (1 of 2) reading DST experts", 0},
		{func() { m.read(sideDST, 7, 7, 20) }, 50, "layer 3 (1 of 2) reading DST experts", 0}, // the next bank, early
		{func() { m.read(sideSRC, 3, 3, 60) }, 110, "layer 3 (1 of 2) reading SRC experts", 0},
		{func() { m.read(sideSRC, 3, 3, 60) }, 120, "layer 3 (1 of 2) reading SRC experts", 0},    // past the plan
		{func() { m.read(sideSRC, -1, 5, 1000) }, 120, "layer 3 (1 of 2) reading SRC experts", 0}, // no layer checked
		{func() { m.startLayer(7) }, 120, "layer 7, mtp (2 of 2)", 0},
		{func() { m.read(sideSRC, 7, 7, 10) }, 130, "layer 7, mtp (2 of 2) reading SRC experts", 0},
		{func() { m.finishLayers() }, 150, "", 0}, // read less than planned: counted whole
		{func() { m.startBytes() }, 150, "byte proof, comparing DST with SRC", 0},
		{func() { m.read(sideDST, 7, 7, 10) }, 150, "byte proof, comparing DST with SRC", 0}, // DST is read by path, not counted
		{func() { m.read(sideSRC, -1, 12, 25) }, 175, "byte proof, comparing DST with SRC at layer 12", 0},
		{func() { m.read(sideSRC, 3, 3, 25) }, 190, "byte proof, comparing DST with SRC at layer 3", 0},
	}
	for i, st := range steps {
		st.do()
		if r.done != st.done || m.stage != st.stage {
			t.Fatalf("step %d: counted %d, stage %q; want %d, %q", i, r.done, m.stage, st.done, st.stage)
		}
		if st.wantTotal != 0 && (len(r.totals) != 1 || r.totals[0] != st.wantTotal) {
			t.Fatalf("step %d: totals %v, want %d", i, r.totals, st.wantTotal)
		}
	}
	var none *meter // no reporter: every method does nothing
	none.plan(nil, 1)
	none.startLayer(1)
	none.finishLayers()
	none.startBytes()
}
