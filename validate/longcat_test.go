package validate

import (
	"context"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/validate/judge"
)

// TestLongcatZeroExpertsInGoldens: transformers' LongCat-Flash goldens send
// a good share of slots to the zero-compute experts (ids E..E+Z-1), and the
// CPU reference, which returns the token's input for them, matches the
// goldens; with those slots' outputs dropped (as a bank-only engine would)
// it is far off.
func TestLongcatZeroExpertsInGoldens(t *testing.T) {
	src, ck, plan := openFixture(t, "longcat-flash")
	if plan.ZeroExperts != 4 || plan.NumExperts != 8 || plan.NormTopKProb || plan.RoutedScalingFactor != 2 {
		t.Fatalf("plan: E %d Z %d renorm %v rsf %v", plan.NumExperts, plan.ZeroExperts, plan.NormTopKProb, plan.RoutedScalingFactor)
	}
	for i := range plan.Layers {
		layer := &plan.Layers[i]
		g := goldenOf(t, src, plan, layer)
		zero := 0
		for _, id := range g.IDs {
			if int(id) >= plan.NumExperts {
				zero++
			}
		}
		ref, err := cpuref.ReferenceLayer(context.Background(), ck, plan, layer, g.X, g.T, cpuref.RefOptions{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		d := judge.Compare(ref.Y, g.Y).RelL2
		// the zero-compute slots' share of the output: w * rsf * x per slot
		dropped := append([]float32(nil), ref.Y...)
		for s, id := range ref.Routing.IDs {
			if int(id) < plan.NumExperts {
				continue
			}
			tok, w := s/ref.Routing.K, ref.Routing.Weights[s]*float32(plan.RoutedScalingFactor)
			for j := range plan.HiddenSize {
				dropped[tok*plan.HiddenSize+j] -= w * g.X[tok*plan.HiddenSize+j]
			}
		}
		dd := judge.Compare(dropped, g.Y).RelL2
		t.Logf("layer %d: %d of %d golden slots on zero-compute experts; reference vs HF %.3g, without them %.3g", layer.Index, zero, len(g.IDs), d, dd)
		if zero < len(g.IDs)/10 || d > 1e-6 || dd < 0.05 {
			t.Errorf("layer %d: %d zero-compute slots, rel_l2 %.3g, %.3g without them", layer.Index, zero, d, dd)
		}
	}
}

// TestLongcatContractAndBias: a DST whose contract loses zero_experts is
// refused naming it; one zero-compute row's correction bias changed in DST
// fails the numbers (the fused path ranks with DST's) and the byte proof.
func TestLongcatContractAndBias(t *testing.T) {
	src := hfFixtures + "/longcat-flash"
	dst := convertInto(t, src, convert.Options{})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1})
	if err != nil || rep.Failed() {
		t.Fatalf("clean conversion: %v %v", err, rep.Err())
	}
	biasDst := convertInto(t, src, convert.Options{})
	rewriteTensor(t, biasDst, "model.layers.1.mlp.router.e_score_correction_bias", func(raw []byte, _ []int64) {
		raw[4*9+3] ^= 0x40 // row 9, a zero-compute expert's: a large bias, it wins every token's top-k
	})
	for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: biasDst, Seed: 1, Bytes: bytes})
		if err == nil {
			err = rep.Err()
		}
		if err == nil {
			t.Fatalf("bytes %s: a changed zero-compute bias passed", bytes)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
	editContract(t, dst, func(c map[string]any) { delete(c, "zero_experts") })
	// with the byte proof on, the edited config.json fails the manifest
	// first and the session's reason becomes a note; off, it is the error
	rep, err = Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: BytesOff})
	if err == nil {
		err = rep.Err()
	}
	if err == nil || !strings.Contains(err.Error(), "zero_experts") {
		t.Fatalf("contract without zero_experts: %v", err)
	}
}
