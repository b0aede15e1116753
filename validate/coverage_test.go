package validate

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
)

// unroutable synthesises a DeepSeek-V3-style model (16 experts, top-4,
// 4 groups) and sets the correction bias of experts 3 and 11 to -30 in
// every MoE layer, so that no token is ever routed to them.
func unroutable(t *testing.T, dtype string) string {
	t.Helper()
	dir := cktest.WriteSpec(t, filepath.Join(t.TempDir(), "unroutable-"+dtype), fixtures.SynthSpec{Family: "deepseek_v3", Layers: 3, DenseLayers: 1, Hidden: 64, Intermediate: 32,
		Experts: 16, SharedExperts: 1, TopK: 4, NGroup: 4, TopKGroup: 2, RoutedScalingFactor: 2.5, DType: dtype, Seed: 41})
	for _, l := range []int{1, 2} {
		rewriteTensor(t, dir, fmt.Sprintf("model.layers.%d.mlp.gate.e_score_correction_bias", l), func(raw []byte, _ []int64) {
			for _, e := range []int{3, 11} {
				binary.LittleEndian.PutUint32(raw[4*e:], math.Float32bits(-30))
			}
		})
	}
	return dir
}

// flipDownSigns flips the sign of every element of bank expert e's down
// projection in a converted bf16 checkpoint.
func flipDownSigns(t *testing.T, dst, prefix string, lay layout.Layout, e int) {
	t.Helper()
	n := layout.Names(lay, prefix, false)
	rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, shape []int64) {
		m := slice(raw, shape, e)
		for i := 1; i < len(m); i += 2 {
			m[i] ^= 0x80 // bf16 sign bit, little-endian high byte
		}
	})
}

// TestNeverRoutedExpertCaught is issue 10's case: an expert no token routes
// to, corrupted in DST, used to pass. The routed check still cannot see it;
// the coverage check must fail and name it; the clean conversion passes.
func TestNeverRoutedExpertCaught(t *testing.T) {
	src := unroutable(t, "bf16")
	for _, o := range []convert.Options{{FuseShared: true, TP: 4}, {Layout: layout.GateUp}} {
		t.Run(fmt.Sprintf("fuse=%v/%s", o.FuseShared, o.Layout), func(t *testing.T) {
			dst := convertInto(t, src, o)
			opts := Options{Src: src, Dst: dst, Seed: 5, Tokens: 64}
			clean, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			mustPass(t, clean, "the clean conversion fails")
			for _, r := range clean.Rows {
				if r.Check == judge.FusedVsReference && r.ExpertsUsed == r.Experts {
					t.Fatalf("layer %d: the routed tokens reached all %d experts; the -30 biases should keep 2 out", r.Layer, r.Experts)
				}
			}
			if c := clean.Coverage; c == nil || c.Complete != 2 || !c.Forced || c.Exercised != c.Total {
				t.Fatalf("coverage %+v, want every expert of both layers", clean.Coverage)
			}
			lay := o.Layout
			if lay == "" {
				lay = layout.Stacked
			}
			flipDownSigns(t, dst, "model.layers.2.mlp", lay, 11)
			opts.Bytes = BytesOff // the numeric proof alone must catch it
			rep, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if exitcode.Code(rep.Err()) != exitcode.CheckFailed {
				t.Fatalf("corrupted never-routed expert passed: %+v", rep.Rows)
			}
			for _, r := range rep.Rows {
				switch {
				case r.Layer == 2 && r.Check == judge.Coverage:
					if r.Pass || len(r.Suspects) == 0 || r.Suspects[0] != 11 || r.WorstTokenRelL2 < 100*r.Tolerance.MaxRelL2 {
						t.Errorf("coverage row: pass %v, suspects %v, worst token %.3g: %s", r.Pass, r.Suspects, r.WorstTokenRelL2, r.Reason)
					}
					if !strings.Contains(r.Reason, "11") {
						t.Errorf("reason does not name expert 11: %s", r.Reason)
					}
				case r.Layer == 2 && r.Check == judge.FusedVsReference:
					if !r.Pass {
						t.Errorf("routed check failed too (%s): then the -30 bias did not keep expert 11 out", r.Reason)
					}
				case r.Layer == 1 && !r.Pass:
					t.Errorf("layer 1 %s failed: %s", r.Check, r.Reason)
				}
			}
		})
	}
}

// TestEveryExpertCorruptionCaught corrupts each bank expert in turn (routed
// and every shared replica) and checks the coverage row fails and names it.
func TestEveryExpertCorruptionCaught(t *testing.T) {
	everyExpertCaught(t, Options{Device: DeviceCPU})
}

func everyExpertCaught(t *testing.T, base Options) {
	src := unroutable(t, "bf16")
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 2, Layout: layout.UpGate})
	opts := base
	opts.Src, opts.Dst, opts.Seed, opts.Tokens, opts.Layers, opts.Bytes = src, dst, 9, 16, "1", BytesOff
	if base.BlockSize == 0 {
		opts.BlockSize = 16
	}
	clean, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if clean.Failed() || len(coverageRows(clean)) == 0 {
		t.Fatalf("clean conversion: %v (coverage rows %d)", clean.Err(), len(coverageRows(clean)))
	}
	n := layout.Names(layout.UpGate, "model.layers.1.mlp", false)
	orig := readTensor(t, dst, n.Weight(layout.ProjDown))
	for e := range 16 + 2 {
		flipDownSigns(t, dst, "model.layers.1.mlp", layout.UpGate, e)
		rep, err := Run(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		rows := coverageRows(rep)
		if len(rows) == 0 {
			t.Fatalf("no coverage rows: %+v", rep.Rows)
		}
		for _, cov := range rows {
			if cov.Pass || len(cov.Suspects) == 0 || cov.Suspects[0] != e || cov.WorstTokenRelL2 < 3*cov.Tolerance.MaxRelL2 {
				t.Errorf("expert %d corrupted: %s row: pass %v suspects %v worst token %.3g (%s)", e, cov.Check, cov.Pass, cov.Suspects, cov.WorstTokenRelL2, cov.Reason)
			}
		}
		rewriteTensor(t, dst, n.Weight(layout.ProjDown), func(raw []byte, _ []int64) { copy(raw, orig) })
	}
}

func coverageRows(rep *Report) []LayerResult {
	var out []LayerResult
	for _, r := range rep.Rows {
		if r.Check == judge.Coverage || r.Check == judge.GPUCoverage || r.Check == judge.GPUCoverageVsReference {
			out = append(out, r)
		}
	}
	return out
}

// TestSampleExperts: --sample-experts N exercises a sample on purpose and
// says so; without SRC (goldens only) a layer whose experts the goldens do
// not all reach fails unless a partial run was asked for.
func TestSampleExperts(t *testing.T) {
	src := unroutable(t, "bf16")
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 1})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Tokens: 8, SampleExperts: 3, Bytes: BytesOff})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() || rep.Coverage == nil || rep.Coverage.Sample != 3 || !strings.Contains(rep.Coverage.Line(), "not a proof") {
		t.Fatalf("sampled run: failed %v, coverage %+v", rep.Failed(), rep.Coverage)
	}
	// Goldens made from the SRC reference on 8 tokens cannot reach the -30 experts.
	gdir := t.TempDir()
	plan := cktest.Plan(t, src)
	for _, l := range plan.Layers {
		x := DrawX(2, l.Index, 8, plan.HiddenSize)
		ref, err := cpuref.ReferenceLayer(context.Background(), cktest.Open(t, src), plan, &l, x, 8, cpuref.RefOptions{Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		writeGolden(t, filepath.Join(gdir, GoldenFileName(l.Index)), map[string][]float32{"x": x, "y": ref.Y},
			map[string][]int64{"x": {8, int64(plan.HiddenSize)}, "y": {8, int64(plan.HiddenSize)}}, nil)
	}
	rep, err = Run(context.Background(), Options{Dst: dst, Golden: gdir})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Failed() || !strings.Contains(rep.Rows[0].Reason, "experts exercised") {
		t.Fatalf("golden-only run with unexercised experts: %+v", rep.Rows)
	}
	rep, err = Run(context.Background(), Options{Dst: dst, Golden: gdir, SampleExperts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() {
		t.Fatalf("golden-only run with --sample-experts: %v", rep.Err())
	}
}
