package judge

import (
	"os"
	"strings"
	"testing"
)

// TestChecksDocumented holds the table to the documentation: every row is
// complete and its name is listed, in backquotes, where readers of the
// report look check names up.
func TestChecksDocumented(t *testing.T) {
	var docs strings.Builder
	for _, f := range []string{"../README.md", "../SCHEMA.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	seen := map[string]bool{}
	for _, c := range Checks {
		if seen[c.Name] {
			t.Errorf("%s: two rows", c.Name)
		}
		seen[c.Name] = true
		if c.Compares == "" {
			t.Errorf("%s: the row does not say what it compares", c.Name)
		}
		if (c.Rule == NoTolerance) != (c.Judged == NotCompared) {
			t.Errorf("%s: rule %d with judgement %d: a compared check needs a tolerance and only it", c.Name, c.Rule, c.Judged)
		}
		if !strings.Contains(docs.String(), "`"+c.Name+"`") {
			t.Errorf("check %s is in no row of validate/README.md or validate/SCHEMA.md", c.Name)
		}
	}
}

// TestRuleTolerance pins the threshold every rule sets, per numerics and
// folding: the values the report has always shown.
func TestRuleTolerance(t *testing.T) {
	cases := []struct {
		check       string
		numerics    Numerics
		roundedFold bool
		want        Tolerance
	}{
		{FusedVsReference, CPU, false, TolFP32},
		{FusedVsReference, CPU, true, TolBF16Fold},
		{Coverage, CPU, true, TolBF16Fold},
		{FusedVsGolden, CPU, false, TolGolden},
		{FusedVsGolden, CPU, true, TolBF16Fold},
		{ReferenceVsGolden, CPU, true, TolGolden},
		{ReferenceVsGolden, GPUBF16, false, TolGolden},
		{ReferenceVsGolden, GPUW8A8, false, TolW8A8Golden},
		{GPUFusedVsGPUUnfused, GPUBF16, true, TolGPUBF16},
		{GPUFusedVsGPUUnfused, GPUF32, false, TolGPUF32},
		{GPUFusedVsGPUUnfused, GPUF32, true, TolBF16Fold},
		{GPUCoverageVsReference, GPUW8A8, true, TolGPUW8A8},
		{GPUFusedVsGolden, GPUBF16, false, TolGPUBF16},
		{GPUFusedVsGolden, GPUF32, false, TolGolden},
		{GPUFusedVsGolden, GPUW8A8, false, TolW8A8Golden},
		{GPUUnfusedVsGolden, GPUF32, true, TolBF16Fold},
		{NonFinite, CPU, true, Tolerance{}},
	}
	for _, c := range cases {
		got := Lookup(c.check).Tolerance(Situation{Numerics: c.numerics, RoundedFold: c.roundedFold})
		if got != c.want {
			t.Errorf("%s (numerics %d, rounded fold %v): %s %g, want %s %g", c.check, c.numerics, c.roundedFold, got.Name, got.MaxRelL2, c.want.Name, c.want.MaxRelL2)
		}
	}
}

func TestIsCoverage(t *testing.T) {
	for name, want := range map[string]bool{Coverage: true, GPUCoverage: true, GPUCoverageVsReference: true,
		FusedVsReference: false, GPUFusedVsReference: false, NonFinite: false, "not-a-check": false} {
		if got := IsCoverage(name); got != want {
			t.Errorf("IsCoverage(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestLookupUnknownPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Lookup of an unknown check returned a row")
		}
	}()
	Lookup("fused-vs-nothing")
}

// TestRequantTolerance: a requantised shared expert's rows are held to
// twice the measured weight error times the shared share (at least the
// fp32 tolerance), or to the format's fixed band without a measurement;
// the exact checks keep their tolerance; checks against goldens take the
// requantisation's.
func TestRequantTolerance(t *testing.T) {
	st := RequantStats{WeightErr: 0.2, Share: 0.25}
	cases := []struct {
		check      string
		s          Situation
		maxRel     float64
		name, says string
	}{
		{RequantVsReference, Situation{Requant: "int4_pack", RequantStats: st}, 0.1, "requant-int4_pack", "relative error 0.2 x its share 0.25"},
		{RequantVsReference, Situation{Requant: "fp8_channel", RequantStats: RequantStats{WeightErr: 1e-9, Share: 1}}, TolFP32.MaxRelL2, "requant-fp8_channel", ""},
		{RequantVsReference, Situation{Requant: "int4_pack"}, TolRequantINT4.MaxRelL2, TolRequantINT4.Name, "no reference to measure it"},
		{RequantVsReference, Situation{Requant: "fp8_tensor"}, TolRequantFP8.MaxRelL2, TolRequantFP8.Name, ""},
		{FusedVsGolden, Situation{Requant: "int4_pack", RequantStats: st}, 0.1, "requant-int4_pack", ""},
		{FusedVsReference, Situation{Requant: "int4_pack", RequantStats: st}, TolFP32.MaxRelL2, TolFP32.Name, ""},
		{Coverage, Situation{Requant: "int4_pack", RequantStats: st, RoundedFold: true}, TolBF16Fold.MaxRelL2, TolBF16Fold.Name, ""},
	}
	for _, tc := range cases {
		got := Lookup(tc.check).Tolerance(tc.s)
		if got.Name != tc.name || got.MaxRelL2 != tc.maxRel || !strings.Contains(got.Reason, tc.says) ||
			!(got.MinCosine < 1) || got.MinCosine < 1-got.MaxRelL2 {
			t.Errorf("%s in %+v: %+v, want %s at %g", tc.check, tc.s, got, tc.name, tc.maxRel)
		}
	}
}
