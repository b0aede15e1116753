package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/moeprep/moeprep/validate/judge"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/fixtures"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/tensorload"
	"github.com/moeprep/moeprep/weightfmt"
)

// openSession fills in s's options, opens its checkpoints (closed when the
// test ends) and returns the layers to check, as Run does.
func openSession(t *testing.T, s *session) []target {
	t.Helper()
	if _, err := s.o.norm(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	if err := s.open(); err != nil {
		t.Fatal(err)
	}
	targets, _, err := s.targets()
	if err != nil {
		t.Fatal(err)
	}
	return targets
}

// streamedRun runs the layer checks and the byte proof of SRC DST over one
// streamed pass, as a CPU run does, and returns the report and the session
// (its pass's misses and rechecked shards).
func streamedRun(t *testing.T, src, dst string, workers ...int) (*Report, *session) {
	t.Helper()
	o := Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 1, Tokens: 8}
	if len(workers) > 0 {
		o.Workers = workers[0]
	}
	s := &session{o: o}
	targets := openSession(t, s)
	rep := &Report{}
	if err := s.runStreamed(context.Background(), targets, rep, true); err != nil {
		t.Fatal(err)
	}
	return rep, s
}

// The streamed pass reads, once, everything the layer checks read: no
// tensor read of theirs misses the steps (families whose experts are
// views, FP8 scales, biases, shared experts fused or not included), and its
// byte proof, streamed expert by expert, states what CheckBytes states
// reading DST in file order, without reading any shard again.
func TestStreamedPassReadsOnce(t *testing.T) {
	for _, c := range conversionCases() {
		t.Run(c.name(), func(t *testing.T) {
			src := filepath.Join(hfFixtures, c.fixture)
			dst := convertInto(t, src, c.o)
			rep, s := streamedRun(t, src, dst)
			if rep.Bytes == nil || !rep.Bytes.Pass {
				t.Fatalf("byte proof: %+v", rep.Bytes)
			}
			if s.streamMisses != 0 || s.rechecked != 0 {
				t.Errorf("%d tensor reads missed the pass, %d shards read again", s.streamMisses, s.rechecked)
			}
			whole, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := proofFields(t, rep), proofFields(t, whole); a != b {
				t.Errorf("streamed proof %s\nCheckBytes     %s", a, b)
			}
		})
	}
}

// proofFields is a report's byte proof as JSON, without its time.
func proofFields(t *testing.T, r *Report) string {
	t.Helper()
	b := *r.Bytes
	b.Seconds = 0
	j, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

// A DST that differs anywhere gets the report CheckBytes gives: the
// streamed proof reads the shard again in file order, so the first
// mismatch and the counts up to it are the same.
func TestStreamedProofMismatchAsCheckBytes(t *testing.T) {
	fp8 := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	bf16 := filepath.Join(hfFixtures, "deepseek-v3-bf16")
	p := "model.layers.1.mlp"
	for _, tc := range []struct {
		name   string
		src    string
		o      convert.Options
		tensor string
		mutate func(raw []byte, shape []int64)
	}{
		{"routed slice byte", fp8, convert.Options{FuseShared: true, TP: 1}, layout.Names(layout.Stacked, p, true).Weight(layout.ProjGate),
			func(raw []byte, shape []int64) { slice(raw, shape, 5)[100] ^= 1 }},
		{"replica", bf16, convert.Options{FuseShared: true, TP: 4, Layout: layout.GateUp}, layout.Names(layout.GateUp, p, false).Weight(layout.ProjDown),
			func(raw []byte, shape []int64) { slice(raw, shape, 18)[0] ^= 0x40 }},
		{"copied tensor", bf16, convert.Options{}, "model.layers.0.mlp.down_proj.weight",
			func(raw []byte, _ []int64) { raw[len(raw)-1] ^= 0x10 }},
		{"NaN in a stack", fp8, convert.Options{FuseShared: true, TP: 1}, layout.Names(layout.Stacked, p, true).Weight(layout.ProjUp),
			func(raw []byte, shape []int64) { slice(raw, shape, 2)[7] = 0x7F }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertInto(t, tc.src, tc.o)
			rewriteTensor(t, dst, tc.tensor, tc.mutate)
			rep, s := streamedRun(t, tc.src, dst)
			whole, err := Run(context.Background(), Options{Src: tc.src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Bytes.Pass || s.rechecked != 1 {
				t.Fatalf("pass %v, %d shards read again", rep.Bytes.Pass, s.rechecked)
			}
			if a, b := proofFields(t, rep), proofFields(t, whole); a != b {
				t.Errorf("streamed proof %s\nCheckBytes     %s", a, b)
			}
		})
	}
}

// PairLayer, which runs both paths in one pass over the bank and decodes
// an expert once where SRC and DST hold the same bytes, computes what
// ReferenceLayer and FusedLayerRun compute on their own, on every
// conversion case and on the forced coverage tokens too: the reference bit
// for bit; the fused path bit for bit where the products are one piece of
// both kernels (H and I at most 64, where their sums are the same), and
// elsewhere within pairedFusedBound of it. Paired, a product SRC and DST
// share (the same bytes by the same tokens) is computed once, by the
// reference's arithmetic (moe.BandProduct), so there the fused path's
// outputs are the reference's rounding of it, not its own; and where DST's
// routed expert holds SRC's codes with routed_scaling_factor folded into
// its float32 scales (moe.ScaledRows), its product is the reference's
// times the factor: so no bit-identity there for H 64 either. The bound:
// blasdot holds its two sums within 7.5e-7 of each other on one product
// (deviation_test.go); the fixtures with H 160 measure 1.1e-7..2.9e-7 at
// the layer's output.
const pairedFusedBound = 1e-6

func TestPairLayerBitIdentical(t *testing.T) {
	for _, c := range conversionCases() {
		t.Run(c.name(), func(t *testing.T) {
			src := filepath.Join(hfFixtures, c.fixture)
			dst := convertInto(t, src, c.o)
			s := &session{o: Options{Src: src, Dst: dst, Device: DeviceCPU, Seed: 5, Tokens: 8}}
			targets := openSession(t, s)
			ctx := context.Background()
			for _, tg := range targets {
				x, tn, _, _, tokens, cov, err := s.layerStart(tg)
				if err != nil {
					t.Fatal(err)
				}
				ref1, err := cpuref.ReferenceLayer(ctx, s.src, s.srcPlan, tg.src, x, tn, cpuref.RefOptions{Tokens: tokens, Coverage: cov})
				if err != nil {
					t.Fatal(err)
				}
				fused1, err := cpuref.FusedLayerRun(ctx, s.dst, tg.fused, x, tn, cpuref.FusedOptions{Tokens: tokens, Coverage: cov, BlockSize: 16})
				if err != nil {
					t.Fatal(err)
				}
				// Paired: each expert's two paths band by band together.
				for _, paired := range []bool{false, true} {
					released := map[int]int{}
					var mu sync.Mutex
					let := func(b int) { mu.Lock(); released[b]++; mu.Unlock() }
					ref, fused, err := cpuref.PairLayer(ctx, s.src, s.srcPlan, tg.src, s.dst, tg.fused, x, tn,
						cpuref.PairOptions{Tokens: tokens, Coverage: cov, BlockSize: 16, Release: let, Paired: paired})
					if err != nil {
						t.Fatal(err)
					}
					if !sameBits(ref.Y, ref1.Y) {
						t.Errorf("layer %d, paired %v: PairLayer's reference differs from ReferenceLayer's", tg.index, paired)
					}
					if h := len(x) / tn; !sameBits(fused.Y, fused1.Y) {
						d := judge.Compare(fused.Y, fused1.Y)
						// rsf folded into float32 scales: moe.ScaledRows
						c := tg.fused.Contract
						f, ferr := c.Format()
						folded := ferr == nil && c.RoutedScalingFactorFolded && f.Fold().Into == weightfmt.FoldScales && f.Fold().DType == safetensors.F32
						if !paired || (h <= 64 && !folded) || !(d.RelL2 <= pairedFusedBound) {
							t.Errorf("layer %d, paired %v, H %d: PairLayer's fused path differs from FusedLayerRun's by relative L2 %.3g", tg.index, paired, h, d.RelL2)
						}
						t.Logf("layer %d, H %d: paired fused path within %.3g of FusedLayerRun's", tg.index, h, d.RelL2)
					}
					if bank := tg.fused.Contract.BankSize(); len(released) != bank {
						t.Errorf("layer %d, paired %v: %d of %d bank experts released", tg.index, paired, len(released), bank)
					}
					for b, n := range released {
						if n != 1 {
							t.Errorf("layer %d, paired %v: bank expert %d released %d times", tg.index, paired, b, n)
						}
					}
				}
			}
		})
	}
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// With no budget at all the pass still ends, with the same report: a
// step gets in when a worker or the byte proof waits for it, whatever the
// workers hold (a layer's head, their experts, the replicas of the shared
// expert's job).
func TestStreamedPassLeastBudget(t *testing.T) {
	defer func(b int64) { passBudget = b }(passBudget)
	src := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 8})
	want, _ := streamedRun(t, src, dst)
	passBudget = 1
	for _, w := range []int{1, 2, 4} {
		got, s := streamedRun(t, src, dst, w)
		if s.streamMisses != 0 || !got.Bytes.Pass || len(got.Rows) != len(want.Rows) {
			t.Fatalf("workers %d: %d misses, bytes %+v", w, s.streamMisses, got.Bytes)
		}
		for i := range got.Rows {
			if a, b := got.Rows[i], want.Rows[i]; a.RelL2 != b.RelL2 || a.MaxAbs != b.MaxAbs || a.Pass != b.Pass {
				t.Errorf("workers %d: row %d %+v, want %+v", w, i, a.Diff, b.Diff)
			}
		}
	}
}

// The streamed pass proves in-out and dequantised (--dtype) outputs from
// the bytes it read once, too: each transposed or dequantised matrix comes
// to the byte proof whole (an expert's slice, or the rest's matrix in one
// extent), with the SRC bytes its prediction reads in the same step, so
// no tensor read misses the pass, no shard is read again, and the proof
// states what CheckBytes states reading DST in file order.
func TestStreamedPassReadsOnceTransposedAndDequantised(t *testing.T) {
	type run struct {
		src string
		o   convert.Options
	}
	hf := func(name string) string { return filepath.Join(hfFixtures, name) }
	runs := []run{
		{hf("deepseek-v3-fp8"), convert.Options{Orientation: layout.InOut}},
		{hf("deepseek-v3-fp8"), convert.Options{Orientation: layout.InOut, FuseShared: true, TP: 2, Layout: layout.GateUp}},
		{hf("gpt-oss"), convert.Options{Orientation: layout.InOut, Layout: layout.UpGate}},
		{hf("qwen2-moe"), convert.Options{Orientation: layout.InOut, Layout: layout.GateUp}},
		{hf("deepseek-v3-fp8"), convert.Options{DType: safetensors.BF16}},
		{hf("deepseek-v3-fp8"), convert.Options{DType: safetensors.F32, FuseShared: true, TP: 2, Layout: layout.GateUp}},
		{hf("deepseek-v3-int4"), convert.Options{DType: safetensors.BF16, Layout: layout.UpGate}},
		{hf("gpt-oss-mxfp4"), convert.Options{DType: safetensors.F16}},
		{hf("deepseek-v3-nvfp4"), convert.Options{DType: safetensors.BF16, Layout: layout.GateUp}},
	}
	for name := range inOutSpecs() {
		runs = append(runs, run{synthFrom(t, inOutSpecs(), name), convert.Options{Orientation: layout.InOut}})
	}
	for _, r := range runs {
		t.Run(fmt.Sprintf("%s/%s/%s/%s/fuse=%v", filepath.Base(r.src), r.o.Orientation, r.o.DType, r.o.Layout, r.o.FuseShared), func(t *testing.T) {
			dst := convertInto(t, r.src, r.o)
			rep, s := streamedRun(t, r.src, dst)
			if rep.Bytes == nil || !rep.Bytes.Pass {
				t.Fatalf("byte proof: %+v", rep.Bytes)
			}
			if s.streamMisses != 0 || s.rechecked != 0 || s.reread != 0 {
				t.Errorf("%d tensor reads missed the pass, %d shards read again, %d read again in file order", s.streamMisses, s.rechecked, s.reread)
			}
			whole, err := Run(context.Background(), Options{Src: r.src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := proofFields(t, rep), proofFields(t, whole); a != b {
				t.Errorf("streamed proof %s\nCheckBytes     %s", a, b)
			}
		})
	}
}

// A transposed slice or grid left untransposed is caught by the streamed
// proof itself, where the whole slice is compared: its report is
// CheckBytes's, naming the same first mismatch (a miss in Take would end
// in the shard's manifest hash instead).
func TestStreamedPassCatchesUntransposed(t *testing.T) {
	for _, tc := range inOutMutations() {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := tc.apply(t, inOutSpecs())
			rep, _ := streamedRun(t, src, dst)
			if rep.Bytes == nil || rep.Bytes.Pass || rep.Bytes.Mismatch == nil || rep.Bytes.Mismatch.Tensor == "" {
				t.Fatalf("streamed proof: %+v, want a tensor's mismatch", rep.Bytes)
			}
			whole, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := proofFields(t, rep), proofFields(t, whole); a != b {
				t.Errorf("streamed proof %s\nCheckBytes     %s", a, b)
			}
		})
	}
}

// countedData counts the bytes read of a tensor below everything validate
// puts in front of it (the pass's routing, the meter).
type countedData struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c countedData) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// countReads makes every stored tensor of c count the bytes read of it in
// n, and returns the bytes its tensors hold.
func countReads(c *checkpoint.Checkpoint, n *atomic.Int64) (stored int64) {
	for _, t := range c.Tensors {
		t.Data = countedData{t.Data, n}
		stored += t.NumBytes()
	}
	return stored
}

// readOnceRun is a conversion whose streamed validate must read each
// stored byte once.
type readOnceRun struct {
	name string
	src  func(t *testing.T) string
	o    convert.Options
}

// readOnceRuns are the formats and storages a streamed run reads: experts
// stacked on disk and read through views (gpt-oss's strided gate and up
// rows, Llama 4's transposed columns, Granite's row ranges), the 4-bit
// formats, FP8 per channel and per tensor, a requantised shared expert and
// in-out stacks.
func readOnceRuns() []readOnceRun {
	fixture := func(name string) func(t *testing.T) string {
		return func(*testing.T) string { return filepath.Join(hfFixtures, name) }
	}
	synth := func(specs map[string]fixtures.SynthSpec, name string) func(t *testing.T) string {
		return func(t *testing.T) string { return synthFrom(t, specs, name) }
	}
	return []readOnceRun{
		{"gpt-oss", fixture("gpt-oss"), convert.Options{}},
		{"gpt-oss-mxfp4", fixture("gpt-oss-mxfp4"), convert.Options{Layout: layout.UpGate}},
		{"llama4-text", fixture("llama4-text"), convert.Options{Layout: layout.GateUp}},
		{"granitemoe", fixture("granitemoe"), convert.Options{Layout: layout.UpGate}},
		{"deepseek-v3-int4 requantised shared", fixture("deepseek-v3-int4"), convert.Options{FuseShared: true, TP: 2, RequantizeShared: true}},
		{"deepseek-v3-nvfp4", fixture("deepseek-v3-nvfp4"), convert.Options{FuseShared: true, TP: 2}},
		{"deepseek-v3-fp8-tensor", fixture("deepseek-v3-fp8-tensor"), convert.Options{Layout: layout.GateUp, FuseShared: true, TP: 4}},
		{"fp8 per channel", synth(fp8ScaledSpecs(), "qwen3-channel"), convert.Options{}},
		{"fp8 per channel in-out", synth(fp8ScaledSpecs(), "qwen3-channel"), convert.Options{Orientation: layout.InOut}},
		{"deepseek-v3-fp8 in-out", fixture("deepseek-v3-fp8"), convert.Options{Orientation: layout.InOut, FuseShared: true, TP: 2, Layout: layout.GateUp}},
		{"nemotron-h in-out", fixture("nemotron-h"), convert.Options{Orientation: layout.InOut}},
	}
}

// checkReadsOnce converts r, runs the streamed run of s (its options set
// but for SRC and DST) with every stored tensor's reads counted below the
// pass, and fails where a side read more bytes than it stores. A read
// that goes around the pass (a view made before it started) counts twice.
func checkReadsOnce(t *testing.T, r readOnceRun, o Options, run func(s *session, targets []target, rep *Report) error) {
	t.Helper()
	o.Src = r.src(t)
	o.Dst = convertInto(t, o.Src, r.o)
	var mu sync.Mutex
	var lines []string
	o.Progress = func(l string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(l, "one pass read") {
			lines = append(lines, l)
		}
	}
	s := &session{o: o}
	targets := openSession(t, s)
	var srcRead, dstRead atomic.Int64
	srcBytes, dstBytes := countReads(s.src, &srcRead), countReads(s.dst, &dstRead)
	rep := &Report{}
	if err := run(s, targets, rep); err != nil {
		t.Fatal(err)
	}
	if rep.Bytes == nil || !rep.Bytes.Pass || rep.Failed() {
		t.Fatalf("not a passing run: bytes %+v", rep.Bytes)
	}
	t.Logf("SRC %d of %d bytes read, DST %d of %d", srcRead.Load(), srcBytes, dstRead.Load(), dstBytes)
	if s.streamMisses != 0 || s.rechecked != 0 || s.reread != 0 {
		t.Errorf("%d tensor reads missed the pass, %d shards read again, %d read again in file order", s.streamMisses, s.rechecked, s.reread)
	}
	// The progress line of each layer says so.
	if len(lines) != len(targets) {
		t.Errorf("%d layers, %d read lines: %q", len(targets), len(lines), lines)
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, ", 0 B of it twice, 0 B outside the pass") {
			t.Errorf("progress: %s", l)
		}
	}
	if srcRead.Load() > srcBytes || dstRead.Load() > dstBytes {
		t.Errorf("read SRC %d bytes of %d stored (%.2fx), DST %d of %d (%.2fx): some bytes twice",
			srcRead.Load(), srcBytes, float64(srcRead.Load())/float64(srcBytes), dstRead.Load(), dstBytes, float64(dstRead.Load())/float64(dstBytes))
	}
}

// TestStreamedPassReadsEachByteOnce: a streamed CPU run (layer checks and
// byte proof) reads each stored byte of SRC and DST at most once, whatever
// the format and storage (readOnceRuns). Before views read their stored
// tensor's current reader, gpt-oss's SRC was read 3.4 times.
func TestStreamedPassReadsEachByteOnce(t *testing.T) {
	for _, r := range readOnceRuns() {
		t.Run(r.name, func(t *testing.T) {
			checkReadsOnce(t, r, Options{Device: DeviceCPU, Seed: 1, Tokens: 8}, func(s *session, targets []target, rep *Report) error {
				return s.runStreamed(context.Background(), targets, rep, true)
			})
		})
	}
}

// A pass that cuts every expert into parts (the thresholds shrunk to a few
// kilobytes, every weight read a band at a time) computes the reports of
// one that does not, value for value, reads every byte once, proves the
// bytes as CheckBytes does, and lets parts go as the paths consume them,
// before their experts' jobs end.
func TestStreamedPassParts(t *testing.T) {
	defer func(a, b, l int64) { partsAbove, partBytes, tensorload.LazyBytes = a, b, l }(partsAbove, partBytes, tensorload.LazyBytes)
	plain := map[string]bool{"mixtral": true, "deepseek-v3-bf16": true, "deepseek-v3-fp8": true, "qwen3-moe": true, "deepseek-v3-nvfp4": true, "deepseek-v3-int4": true}
	for _, c := range conversionCases() {
		t.Run(c.name(), func(t *testing.T) {
			src := filepath.Join(hfFixtures, c.fixture)
			dst := convertInto(t, src, c.o)
			partsAbove, partBytes, tensorload.LazyBytes = 64<<20, 16<<20, 16<<20
			want, _ := streamedRun(t, src, dst)
			partsAbove, partBytes, tensorload.LazyBytes = 0, 4096, 1
			got, s := streamedRun(t, src, dst)
			if s.streamMisses != 0 || s.rechecked != 0 {
				t.Errorf("%d tensor reads missed the pass, %d shards read again", s.streamMisses, s.rechecked)
			}
			// Where both sides read the cut weights a band at a time (not
			// an in-out or interleaved source, read whole), parts go as
			// they are consumed; elsewhere when the expert's job ends.
			if plain[c.fixture] && s.partsConsumed.Load() == 0 {
				t.Errorf("no part was let go as its bytes were consumed")
			}
			if a, b := rowFields(t, got), rowFields(t, want); a != b {
				t.Errorf("in parts %s\nwhole    %s", a, b)
			}
			if a, b := proofFields(t, got), proofFields(t, want); a != b {
				t.Errorf("in parts proof %s\nwhole          %s", a, b)
			}
		})
	}
}

// rowFields is a report's layer rows as JSON, without their times.
func rowFields(t *testing.T, r *Report) string {
	t.Helper()
	rows := slices.Clone(r.Rows)
	for i := range rows {
		rows[i].Seconds = 0
	}
	j, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}
